"""A tiny byte-level BPE tokenizer with a chat template, trained locally (no hub).

Used by the demo and the tests: it makes a real `PreTrainedTokenizerFast` folder that
`AutoTokenizer.from_pretrained` loads offline. Training is deterministic: the same texts give the
same tokenizer.json bytes.

Templates (TEMPLATES[name]):
  chatml       ChatML / Qwen3-style. An assistant `reasoning_content` is rendered as
               "<think>\\nR\\n</think>\\n\\n" before the content; `enable_thinking=False` pre-fills an
               empty think block after the generation prompt (and renders one for assistant turns
               without reasoning, so the prompt stays a prefix of the whole conversation).
  llama3       Llama-3 headers: "<|begin_of_text|>" once, then per message
               "<|start_header_id|>ROLE<|end_header_id|>\\n\\n" + content + "<|eot_id|>".
  qwen3_strip  like chatml, but reasoning is rendered only for assistant turns after the last user
               turn (what Qwen3's real template does: earlier turns' reasoning is stripped).

Jinja note: `{%- -%}` trims the literal text between tags, so every newline is emitted from a
`{{ '...\\n' }}` expression.
"""

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

BASE_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>"]
LLAMA3_SPECIALS = ["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]

# Qwen2/Llama-3-style split: `\s*[\r\n]+` keeps a run of newlines in one piece whether or not text
# follows, so "...\n\n" at the end of a prompt splits the same way as inside the full conversation.
SPLIT_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)

# Message content: a string, or a list of {"type": "text", "text": ...} parts.
_CONTENT = (
    "{%- if m['content'] is string -%}{{- m['content'] -}}"
    "{%- elif m['content'] -%}"
    "{%- for c in m['content'] if c['type'] == 'text' -%}{{- c['text'] -}}{%- endfor -%}"
    "{%- endif -%}"
)
_NO_THINKING = "enable_thinking is defined and not enable_thinking"

CHATML_TEMPLATE = (
    "{%- for m in messages -%}"
    "{{- '<|im_start|>' + m['role'] + '\\n' -}}"
    "{%- if m['role'] == 'assistant' -%}"
    "{%- if m.get('reasoning_content') -%}"
    "{{- '<think>\\n' + m['reasoning_content'] + '\\n</think>\\n\\n' -}}"
    "{%- elif " + _NO_THINKING + " -%}{{- '<think>\\n\\n</think>\\n\\n' -}}"
    "{%- endif -%}"
    "{%- endif -%}"
    + _CONTENT
    + "{{- '<|im_end|>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}"
    "{%- if " + _NO_THINKING + " -%}{{- '<think>\\n\\n</think>\\n\\n' -}}{%- endif -%}"
    "{%- endif -%}"
)

QWEN3_STRIP_TEMPLATE = (
    "{%- set ns = namespace(last_user=-1) -%}"
    "{%- for m in messages -%}{%- if m['role'] == 'user' -%}{%- set ns.last_user = loop.index0 -%}"
    "{%- endif -%}{%- endfor -%}"
    "{%- for m in messages -%}"
    "{{- '<|im_start|>' + m['role'] + '\\n' -}}"
    "{%- if m['role'] == 'assistant' and loop.index0 > ns.last_user -%}"
    "{%- if m.get('reasoning_content') -%}"
    "{{- '<think>\\n' + m['reasoning_content'] + '\\n</think>\\n\\n' -}}"
    "{%- elif " + _NO_THINKING + " -%}{{- '<think>\\n\\n</think>\\n\\n' -}}"
    "{%- endif -%}"
    "{%- endif -%}"
    + _CONTENT
    + "{{- '<|im_end|>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}"
    "{%- if " + _NO_THINKING + " -%}{{- '<think>\\n\\n</think>\\n\\n' -}}{%- endif -%}"
    "{%- endif -%}"
)

LLAMA3_TEMPLATE = (
    "{{- '<|begin_of_text|>' -}}"
    "{%- for m in messages -%}"
    "{{- '<|start_header_id|>' + m['role'] + '<|end_header_id|>\\n\\n' -}}"
    "{%- if m['role'] == 'assistant' -%}"
    "{%- if m.get('reasoning_content') -%}"
    "{{- '<think>\\n' + m['reasoning_content'] + '\\n</think>\\n\\n' -}}"
    "{%- elif " + _NO_THINKING + " -%}{{- '<think>\\n\\n</think>\\n\\n' -}}"
    "{%- endif -%}"
    "{%- endif -%}"
    + _CONTENT
    + "{{- '<|eot_id|>' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' -}}"
    "{%- if " + _NO_THINKING + " -%}{{- '<think>\\n\\n</think>\\n\\n' -}}{%- endif -%}"
    "{%- endif -%}"
)

TEMPLATES = {"chatml": CHATML_TEMPLATE, "llama3": LLAMA3_TEMPLATE, "qwen3_strip": QWEN3_STRIP_TEMPLATE}

# Each template's end-of-turn token (also the tokenizer's eos token).
END_OF_TURN = {"chatml": "<|im_end|>", "llama3": "<|eot_id|>", "qwen3_strip": "<|im_end|>"}


def train_bpe(texts, vocab_size, special_tokens):
    """Train a byte-level BPE `tokenizers.Tokenizer` on `texts` (an iterable of str)."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(SPLIT_PATTERN), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(special_tokens),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(list(texts), trainer=trainer)
    return tok


def build_tokenizer(out_dir, texts, vocab_size=2048, template="chatml"):
    """Train a tiny BPE on `texts`, give it the named chat template, save it to `out_dir`; return it."""
    from transformers import PreTrainedTokenizerFast

    if template not in TEMPLATES:
        raise ValueError(f"unknown template {template!r}; choose one of {', '.join(sorted(TEMPLATES))}")
    specials = list(BASE_SPECIALS)
    extra = {}
    if template == "llama3":
        specials += LLAMA3_SPECIALS
        extra["bos_token"] = "<|begin_of_text|>"
    else:
        extra["bos_token"] = None
    eos = END_OF_TURN[template]
    backend = train_bpe(texts, vocab_size, specials)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        eos_token=eos,
        pad_token="<|endoftext|>",
        unk_token=None,
        additional_special_tokens=[t for t in specials
                                   if t not in (eos, "<|endoftext|>", extra["bos_token"])],
        chat_template=TEMPLATES[template],
        model_max_length=1 << 20,
        clean_up_tokenization_spaces=False,
        **extra,
    )
    tokenizer.save_pretrained(out_dir)
    return tokenizer
