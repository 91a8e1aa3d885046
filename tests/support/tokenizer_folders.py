"""Tokenizer folders that behave like real target models' tokenizers, built offline and deterministically.

Each builder writes a folder that `transformers.AutoTokenizer.from_pretrained` loads with HF_HUB_OFFLINE=1
and returns its path:

build_kimi_like(path)   Kimi-K2-style: no tokenizer.json; a slow `PreTrainedTokenizer` subclass over
                        `tiktoken` in its own module (`tokenization_kimi_like.py`), BPE ranks in `tiktoken.model`,
                        loaded through `auto_map` (so only with `trust_remote_code=True`); 256 reserved special
                        ids after the BPE ranks, the named ones at Kimi's offsets; eos `[EOS]` (not the turn end
                        `<|im_end|>`); `<think>`/`</think>` are added special tokens but not in
                        `additional_special_tokens` (as in Kimi's config), so they are missing from
                        `all_special_ids`. Template in `chat_template.jinja`, modelled on K2-Thinking's:
                          <|im_system|>system<|im_middle|>S<|im_end|><|im_user|>user<|im_middle|>U<|im_end|>
                          <|im_assistant|>assistant<|im_middle|><think>R</think>A<|im_end|>
                        (no newlines anywhere); a default system turn when the conversation has none;
                        generation prompt `<|im_assistant|>assistant<|im_middle|>`. Assistant turns up to and
                        including the last one without tool calls are history: rendered `<think></think>A`,
                        their reasoning dropped; only assistant turns after it (tool-call continuations) keep
                        `<think>R</think>`. With `think_prefill=True` the template is K2.5-like: the generation
                        prompt ends in `<think>`, or `<think></think>` with `thinking=False`.
build_gemma_like(path)  Gemma-3-style fast tokenizer: `<pad>` 0, `<eos>` 1, `<bos>` 2, `<unk>` 3,
                        `<start_of_turn>` 4, `<end_of_turn>` 5; encoding with add_special_tokens=True prepends
                        `<bos>` (and the template starts with `<bos>` too, as Gemma's does); eos `<eos>`, turn end
                        `<end_of_turn>`. Template: `<bos><start_of_turn>user\\nU<end_of_turn>\\n<start_of_turn>model
                        \\nA<end_of_turn>\\n`, contents trimmed, a system message folded into the first user turn
                        ("S\\n\\nU"), roles must alternate; generation prompt `<start_of_turn>model\\n`; reasoning
                        is not rendered.
build_phi3_like(path)   Phi-3-style fast tokenizer: `<unk>` 0, `<s>` 1, `</s>` 2, then the trained BPE, then the
                        added tokens at Phi-3's offsets (`<|endoftext|>` +0, `<|assistant|>` +1, `<|system|>` +6,
                        `<|end|>` +7, `<|user|>` +10, placeholders between). No BOS is added. eos
                        `<|endoftext|>`, turn end `<|end|>`. Template: `<|system|>\\nS<|end|>\\n<|user|>\\nU<|end|>\\n
                        <|assistant|>\\nA<|end|>\\n`; without a generation prompt the render ends with the eos
                        token (as Phi-3's does); generation prompt `<|assistant|>\\n`; reasoning not rendered.

The BPE vocabularies are learned from a small built-in corpus (or `corpus=`, a list of str); the same inputs
give the same files, byte for byte.
"""

from __future__ import annotations

import base64
import json
from collections import Counter
from pathlib import Path

from budgetgen_testkit.tiny_tokenizer import train_bpe  # the byte-level BPE the tiny tokenizer uses

CORPUS = [
    "Explain binary search with an example in Python. Write a Rust function that demonstrates hash maps. "
    "What are common mistakes with TCP handshakes? Compare two approaches to garbage collection in Go. "
    "How would you test code that uses regular expressions? Summarise the following note.\n",
    "The user asks a question; the assistant thinks about it, then answers. The system prompt sets the rules. "
    "A draft model proposes tokens and the target model verifies them.\n",
    "def add(a, b):\n    return a + b\n\nfor i in range(10):\n    print(i * 2)\n",
    "Let me think step by step. First, the answer is 42. Second, 3 + 4 = 7. I'm sure it's right, isn't it?\n",
    "You are Kimi, an AI assistant created by Moonshot AI. You are a helpful model.\n",
    "二分查找是一种在有序数组中查找元素的算法。 Ça va? Über naïve café.\n",
]
CORPUS_REPEAT = 8


# ---------------------------------------------------------------------------------------------------------
# Kimi-K2-like: tiktoken ranks + a slow tokenizer module, loaded through auto_map.

KIMI_MODULE_NAME = "tokenization_kimi_like"
KIMI_CLASS_NAME = "KimiLikeTokenizer"
KIMI_NUM_RESERVED = 256
# Named special tokens at their offsets past the BPE ranks (Kimi-K2's layout); the rest are reserved.
KIMI_NAMED_OFFSETS = {
    0: "[BOS]",
    1: "[EOS]",
    2: "<|im_end|>",
    3: "<|im_user|>",
    4: "<|im_assistant|>",
    6: "<|start_header_id|>",
    7: "<|end_header_id|>",
    9: "[EOT]",
    10: "<|im_system|>",
    11: "<|tool_calls_section_begin|>",
    12: "<|tool_calls_section_end|>",
    13: "<|tool_call_begin|>",
    14: "<|tool_call_argument_begin|>",
    15: "<|tool_call_end|>",
    17: "<|im_middle|>",
    22: "<think>",
    23: "</think>",
    254: "[UNK]",
    255: "[PAD]",
}
# Kimi's additional_special_tokens (note: no <think>, </think>, tool-call tokens).
KIMI_ADDITIONAL_SPECIAL = [
    "<|im_end|>",
    "<|im_user|>",
    "<|im_assistant|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "[EOT]",
    "<|im_system|>",
    "<|im_middle|>",
]
KIMI_DEFAULT_SYSTEM = "You are Kimi, an AI assistant created by Moonshot AI."

# Pre-tokenization in the Kimi style: Han runs alone; words (optional leading non-letter, letters/marks but
# not Han, an English contraction); 1-3 digits; punctuation runs; newlines; other whitespace. No set
# operations, so Python's `regex` (used to learn the merges) and tiktoken's Rust engine read it alike.
KIMI_PAT_STR = "|".join(
    [
        r"\p{Han}+",
        r"[^\r\n\p{L}\p{N}]?(?:[^\P{L}\p{Han}]|\p{M})+(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
        r"\p{N}{1,3}",
        r" ?[^\s\p{L}\p{N}]+[\r\n]*",
        r"\s*[\r\n]+",
        r"\s+(?!\S)",
        r"\s+",
    ]
)

KIMI_MODULE_SOURCE = (r'''"""A Kimi-K2-like slow tokenizer (test fixture): tiktoken BPE ranks plus a block of '''
                      r'''reserved special ids.

Written into a tokenizer folder by tests/support/tokenizer_folders.py and loaded through `auto_map` with
`AutoTokenizer.from_pretrained(folder, trust_remote_code=True)`, the way Kimi-K2's TikToken tokenizer is.
"""

import os
import shutil

import tiktoken
from tiktoken.load import load_tiktoken_bpe
from transformers import PreTrainedTokenizer

VOCAB_FILES_NAMES = {"vocab_file": "tiktoken.model"}
PAT_STR = __PAT_STR__
DEFAULT_ADDITIONAL_SPECIAL = __ADDITIONAL__


def _byte_chars():
    """GPT-2's table from bytes to printable characters: a token's string form is its bytes through it."""
    printable = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    table, extra = {}, 0
    for b in range(256):
        if b in printable:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return table


class __CLASS__(PreTrainedTokenizer):
    """Slow tokenizer over a `tiktoken.Encoding`; special ids follow the BPE ranks, named by the folder's
    `added_tokens_decoder`, the rest `<|reserved_token_ID|>`."""

    vocab_files_names = VOCAB_FILES_NAMES
    model_input_names = ["input_ids", "attention_mask"]

    def __init__(self, vocab_file, bos_token="[BOS]", eos_token="[EOS]", unk_token="[UNK]", pad_token="[PAD]",
                 additional_special_tokens=None, added_tokens_decoder=None, num_reserved_special_tokens=256,
                 **kwargs):
        if not os.path.isfile(vocab_file):
            raise FileNotFoundError(vocab_file)
        self.vocab_file = vocab_file
        ranks = load_tiktoken_bpe(vocab_file)
        n_base = len(ranks)
        names = {int(i): str(t) for i, t in (added_tokens_decoder or {}).items()}
        self.special_tokens = {names.get(i, f"<|reserved_token_{i}|>"): i
                               for i in range(n_base, n_base + num_reserved_special_tokens)}
        self.model = tiktoken.Encoding(name=os.path.basename(vocab_file), pat_str=PAT_STR,
                                       mergeable_ranks=ranks, special_tokens=self.special_tokens)
        chars = _byte_chars()
        self.byte_decoder = {c: b for b, c in chars.items()}
        self.decoder = {i: "".join(chars[b] for b in tok) for tok, i in ranks.items()}
        self.decoder.update({i: s for s, i in self.special_tokens.items()})
        self.encoder = {s: i for i, s in self.decoder.items()}
        self.unk_id = self.special_tokens.get(str(unk_token)) if unk_token is not None else None
        # transformers 5 hands a saved `additional_special_tokens` over as `extra_special_tokens`
        extra = kwargs.pop("extra_special_tokens", None) or additional_special_tokens
        super().__init__(bos_token=bos_token, eos_token=eos_token, unk_token=unk_token, pad_token=pad_token,
                         additional_special_tokens=list(extra or DEFAULT_ADDITIONAL_SPECIAL),
                         added_tokens_decoder=added_tokens_decoder, **kwargs)

    # Like Kimi's: a bare encode()/decode() goes straight to tiktoken (special tokens in the text are
    # recognised); with any keyword argument, the PreTrainedTokenizer path.
    def encode(self, text, **kwargs):
        if kwargs or not isinstance(text, str):
            return super().encode(text, **kwargs)
        return self.model.encode(text, allowed_special="all")

    def decode(self, token_ids, **kwargs):
        if kwargs:
            return super().decode(token_ids, **kwargs)
        if isinstance(token_ids, int):
            token_ids = [token_ids]
        return self.model.decode(list(token_ids))

    @property
    def vocab_size(self):
        return self.model.n_vocab

    def get_vocab(self):
        return dict(self.encoder)

    def _tokenize(self, text, **kwargs):
        return [self.decoder[i] for i in self.model.encode(text, allowed_special="all")]

    def _convert_token_to_id(self, token):
        return self.encoder.get(token, self.unk_id)

    def _convert_id_to_token(self, index):
        return self.decoder.get(index)

    def convert_tokens_to_string(self, tokens):
        data = bytearray()
        for token in tokens:
            if token in self.special_tokens:
                data += token.encode("utf-8")
            else:
                data += bytes(self.byte_decoder[c] for c in token)
        return data.decode("utf-8", "replace")

    def save_vocabulary(self, save_directory, filename_prefix=None):
        out = os.path.join(save_directory, (filename_prefix + "-" if filename_prefix else "") + "tiktoken.model")
        if os.path.abspath(out) != os.path.abspath(self.vocab_file):
            shutil.copyfile(self.vocab_file, out)
        return (out,)
''')

# K2-Thinking-like template (see the module docstring). Content: a string or a list of text parts.
_KIMI_CONTENT = (
    "{%- if m['content'] is string -%}{{- m['content'] -}}"
    "{%- elif m['content'] -%}"
    "{%- for c in m['content'] if c['type'] == 'text' -%}{{- c['text'] -}}{%- endfor -%}"
    "{%- endif -%}"
)
_KIMI_TEMPLATE = (
    "{%- set ns = namespace(last_final=-1) -%}"
    "{%- for m in messages -%}"
    "{%- if m['role'] == 'assistant' and not m.get('tool_calls') -%}{%- set ns.last_final = loop.index0 -%}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if not messages or messages[0]['role'] != 'system' -%}"
    "{{- '<|im_system|>system<|im_middle|>" + KIMI_DEFAULT_SYSTEM + "<|im_end|>' -}}"
    "{%- endif -%}"
    "{%- for m in messages -%}"
    "{%- if m['role'] == 'user' -%}{{- '<|im_user|>user<|im_middle|>' -}}"
    "{%- elif m['role'] == 'assistant' -%}{{- '<|im_assistant|>assistant<|im_middle|>' -}}"
    "{%- elif m['role'] == 'tool' -%}"
    "{{- '<|im_system|>' + (m.get('name') or 'tool') + '<|im_middle|>## Return of '"
    " + (m.get('tool_call_id') or '') + '\\n' -}}"
    "{%- else -%}{{- '<|im_system|>' + m['role'] + '<|im_middle|>' -}}"
    "{%- endif -%}"
    "{%- if m['role'] == 'assistant' -%}"
    "{%- if loop.index0 > ns.last_final and m.get('reasoning_content') -%}"
    "{{- '<think>' + m['reasoning_content'] + '</think>' -}}"
    "{%- else -%}{{- '<think></think>' -}}"
    "{%- endif -%}"
    "{%- endif -%}"
    + _KIMI_CONTENT
    + "{%- if m['role'] == 'assistant' and m.get('tool_calls') -%}"
    "{{- '<|tool_calls_section_begin|>' -}}"
    "{%- for call in m['tool_calls'] -%}"
    "{%- set f = call['function'] if call.get('function') else call -%}"
    "{%- set args = f['arguments'] if f['arguments'] is string else (f['arguments'] | tojson) -%}"
    "{{- '<|tool_call_begin|>' + (call.get('id') or ('functions.' + f['name'] + ':' + loop.index0|string))"
    " + '<|tool_call_argument_begin|>' + args + '<|tool_call_end|>' -}}"
    "{%- endfor -%}"
    "{{- '<|tool_calls_section_end|>' -}}"
    "{%- endif -%}"
    "{{- '<|im_end|>' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_assistant|>assistant<|im_middle|>' -}}"
    "__PREFILL__"
    "{%- endif -%}"
)
_KIMI_PREFILL = ("{%- if thinking is defined and not thinking -%}{{- '<think></think>' -}}"
                 "{%- else -%}{{- '<think>' -}}{%- endif -%}")


def kimi_template(think_prefill=False):
    """The Kimi-like chat template: K2-Thinking-like, or K2.5-like (`<think>` prefilled) with think_prefill."""
    return _KIMI_TEMPLATE.replace("__PREFILL__", _KIMI_PREFILL if think_prefill else "")


def learn_tiktoken_ranks(texts, n_merges=400, pat_str=KIMI_PAT_STR):
    """Byte-level BPE ranks {token bytes: rank}: the 256 bytes (rank = byte value), then up to `n_merges`
    merges learned greedily from `texts` split by `pat_str` (ties broken by the pair's bytes: deterministic)."""
    import regex

    pattern = regex.compile(pat_str)
    words = Counter(piece.encode("utf-8") for text in texts for piece in pattern.findall(text))
    seqs = {w: [bytes([b]) for b in w] for w in words}
    ranks = {bytes([b]): b for b in range(256)}
    for _ in range(n_merges):
        pairs = Counter()
        for w, count in words.items():
            s = seqs[w]
            for pair in zip(s, s[1:]):
                pairs[pair] += count
        if not pairs:
            break
        (a, b), _count = max(pairs.items(), key=lambda kv: (kv[1], kv[0]))
        merged = a + b
        ranks.setdefault(merged, len(ranks))
        for w, s in seqs.items():
            i, out = 0, []
            while i < len(s):
                if i + 1 < len(s) and s[i] == a and s[i + 1] == b:
                    out.append(merged)
                    i += 2
                else:
                    out.append(s[i])
                    i += 1
            seqs[w] = out
    return ranks


def write_tiktoken_model(path, ranks):
    """Write ranks in tiktoken's file format: one `base64(token bytes) rank` line per token, by rank."""
    lines = [f"{base64.b64encode(tok).decode('ascii')} {rank}\n"
             for tok, rank in sorted(ranks.items(), key=lambda kv: kv[1])]
    Path(path).write_text("".join(lines), encoding="ascii")


def kimi_special_tokens(n_base):
    """{token: id} of the Kimi-like folder's 256 special ids for a BPE of `n_base` ranks."""
    return {KIMI_NAMED_OFFSETS.get(k, f"<|reserved_token_{n_base + k}|>"): n_base + k for k in range(KIMI_NUM_RESERVED)}


def build_kimi_like(path, *, corpus=None, n_merges=400, think_prefill=False):
    """Write a Kimi-K2-like tokenizer folder at `path` (created if missing); return its Path.

    Load it with AutoTokenizer.from_pretrained(path, trust_remote_code=True)."""
    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)
    ranks = learn_tiktoken_ranks((corpus or CORPUS) * CORPUS_REPEAT, n_merges)
    write_tiktoken_model(out / "tiktoken.model", ranks)
    source = (
        KIMI_MODULE_SOURCE.replace("__PAT_STR__", repr(KIMI_PAT_STR))
        .replace("__ADDITIONAL__", repr(KIMI_ADDITIONAL_SPECIAL))
        .replace("__CLASS__", KIMI_CLASS_NAME)
    )
    (out / f"{KIMI_MODULE_NAME}.py").write_text(source, encoding="utf-8")
    specials = kimi_special_tokens(len(ranks))
    config = {
        "added_tokens_decoder": {
            str(i): {"content": tok, "lstrip": False, "normalized": False, "rstrip": False, "single_word": False,
                     "special": True}
            for tok, i in specials.items()
        },
        "additional_special_tokens": list(KIMI_ADDITIONAL_SPECIAL),
        "auto_map": {"AutoTokenizer": [f"{KIMI_MODULE_NAME}.{KIMI_CLASS_NAME}", None]},
        "bos_token": "[BOS]",
        "eos_token": "[EOS]",
        "pad_token": "[PAD]",
        "unk_token": "[UNK]",
        "clean_up_tokenization_spaces": False,
        "model_max_length": 1 << 20,
        "tokenizer_class": KIMI_CLASS_NAME,
    }
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    (out / "chat_template.jinja").write_text(kimi_template(think_prefill), encoding="utf-8")
    return out


# ---------------------------------------------------------------------------------------------------------
# Fast (tokenizers) folders: Gemma-style and Phi-3-style.

_CONTENT = (
    "{%- if m['content'] is string -%}{%- set text = m['content'] -%}"
    "{%- else -%}{%- set ns.text = '' -%}"
    "{%- for c in m['content'] or [] if c['type'] == 'text' -%}{%- set ns.text = ns.text + c['text'] -%}"
    "{%- endfor -%}{%- set text = ns.text -%}"
    "{%- endif -%}"
)

GEMMA_SPECIALS = ["<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>"]
GEMMA_TEMPLATE = (
    "{{- bos_token -}}"
    "{%- set ns = namespace(text='') -%}"
    "{%- if messages and messages[0]['role'] == 'system' -%}"
    "{%- set m = messages[0] -%}" + _CONTENT + "{%- set first_user_prefix = text + '\\n\\n' -%}"
    "{%- set loop_messages = messages[1:] -%}"
    "{%- else -%}{%- set first_user_prefix = '' -%}{%- set loop_messages = messages -%}"
    "{%- endif -%}"
    "{%- for m in loop_messages -%}"
    "{%- if (m['role'] == 'user') != (loop.index0 % 2 == 0) -%}"
    "{{- raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') -}}"
    "{%- endif -%}"
    "{%- set role = 'model' if m['role'] == 'assistant' else m['role'] -%}"
    + _CONTENT
    + "{{- '<start_of_turn>' + role + '\\n' + (first_user_prefix if loop.first else '') + (text | trim)"
    " + '<end_of_turn>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<start_of_turn>model\\n' -}}{%- endif -%}"
)

PHI3_BASE_SPECIALS = ["<unk>", "<s>", "</s>"]
# Added after the trained vocabulary, in Phi-3's order (32000 + offset there).
PHI3_ADDED = [
    "<|endoftext|>",
    "<|assistant|>",
    "<|placeholder1|>",
    "<|placeholder2|>",
    "<|placeholder3|>",
    "<|placeholder4|>",
    "<|system|>",
    "<|end|>",
    "<|placeholder5|>",
    "<|placeholder6|>",
    "<|user|>",
]
PHI3_TEMPLATE = (
    "{%- set ns = namespace(text='') -%}"
    "{%- for m in messages -%}"
    + _CONTENT
    + "{%- if m['role'] in ['system', 'user', 'assistant'] -%}"
    "{{- '<|' + m['role'] + '|>\\n' + text + '<|end|>\\n' -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|assistant|>\\n' -}}{%- else -%}{{- eos_token -}}{%- endif -%}"
)


def build_gemma_like(path, *, corpus=None, vocab_size=640):
    """Write a Gemma-3-style fast tokenizer folder at `path`; return its Path (see the module docstring)."""
    from tokenizers import processors
    from transformers import PreTrainedTokenizerFast

    out = Path(path)
    backend = train_bpe((corpus or CORPUS) * CORPUS_REPEAT, vocab_size, GEMMA_SPECIALS)
    bos_id = backend.token_to_id("<bos>")
    backend.post_processor = processors.TemplateProcessing(
        single="<bos> $A", pair="<bos> $A <bos> $B", special_tokens=[("<bos>", bos_id)]
    )
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token="<bos>",
        eos_token="<eos>",
        unk_token="<unk>",
        pad_token="<pad>",
        additional_special_tokens=["<start_of_turn>", "<end_of_turn>"],
        add_bos_token=True,
        add_eos_token=False,
        chat_template=GEMMA_TEMPLATE,
        model_max_length=1 << 20,
        clean_up_tokenization_spaces=False,
    )
    tokenizer.save_pretrained(out)
    return out


def build_phi3_like(path, *, corpus=None, vocab_size=640):
    """Write a Phi-3-style fast tokenizer folder at `path`; return its Path (see the module docstring)."""
    from tokenizers import AddedToken
    from transformers import PreTrainedTokenizerFast

    out = Path(path)
    backend = train_bpe((corpus or CORPUS) * CORPUS_REPEAT, vocab_size, PHI3_BASE_SPECIALS)
    backend.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in PHI3_ADDED])
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token="<s>",
        eos_token="<|endoftext|>",
        unk_token="<unk>",
        pad_token="<|endoftext|>",
        additional_special_tokens=[t for t in PHI3_ADDED if t != "<|endoftext|>"],
        add_bos_token=False,
        add_eos_token=False,
        chat_template=PHI3_TEMPLATE,
        model_max_length=1 << 20,
        clean_up_tokenization_spaces=False,
    )
    tokenizer.save_pretrained(out)
    return out
