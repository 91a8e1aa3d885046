"""What a target's chat template says about the turn the model generates: the tokenizer loaded (with
its files' and template's hashes for provenance), the template's options checked, its rendering of plain
JSON messages, and TurnFormat, the end-of-turn token and reasoning delimiters derived from the tokenizer
and its template (never from a list of known models), with the rules that rebuild a model's raw output
from a record's content and reasoning (budgetgen.rows uses them for the text fallback)."""

from __future__ import annotations

import hashlib
import json
import operator
import os
import re
from typing import TYPE_CHECKING

from budgetgen.errors import UserError
from budgetgen.state import looks_local

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping
    from typing import Any

    from transformers import PreTrainedTokenizerBase

# Reasoning delimiters: a pair of tags named in the chat template (`<think>`, `<mm:think>`, ...), those
# that are tokens of the tokenizer first; else the first of these pairs the tokenizer has as tokens; else
# PLAIN_TAGS as text (MiniMax-M1 writes `<think>` as plain text; vLLM's and SGLang's parsers split on it).
_TEMPLATE_TAG = re.compile(r"<(/?)([\w:.-]*think[\w:.-]*)>")
REASONING_TAGS = (("<think>", "</think>"), ("<seed:think>", "</seed:think>"), ("◁think▷", "◁/think▷"),
                  ("<|begin_of_thought|>", "<|end_of_thought|>"), ("<thinking>", "</thinking>"))
PLAIN_TAGS = ("<think>", "</think>")

# apply_chat_template arguments that chat_template_kwargs must not override.
_RESERVED_KWARGS = {
    "conversation", "messages", "tokenize", "add_generation_prompt", "continue_final_message",
    "chat_template",
    "return_dict", "return_tensors", "return_assistant_tokens_mask", "padding", "truncation",
    "max_length", "tokenizer_kwargs", "tools", "documents",
}



def load_tokenizer(path: str | os.PathLike, trust_remote_code: bool = False) -> PreTrainedTokenizerBase:
    """AutoTokenizer.from_pretrained(path): fast (tokenizers) or slow (Python, e.g. Kimi-K2's TikToken
    tokenizer, which needs trust_remote_code for the module its auto_map names), with a chat template."""
    name = os.fspath(path)
    if looks_local(name) and not os.path.isdir(name):
        raise UserError(f"tokenizer {name}: no such folder")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "true")
    from transformers import AutoTokenizer
    from transformers.utils import logging as hf_logging

    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # its own multi-line warnings would bury our one-line error
    try:
        tokenizer = AutoTokenizer.from_pretrained(name, trust_remote_code=bool(trust_remote_code))
    except Exception as exc:  # OSError (not found / offline), ValueError (bad config, remote code), ...
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        where = "folder" if os.path.isdir(name) else "no such folder, and not available offline from the hub"
        hint = ""
        if not trust_remote_code and ("trust_remote_code" in str(exc) or "auto_map" in str(exc)):
            hint = " (its tokenizer is code in the folder: set tokenizer.trust_remote_code: true if you trust it)"
        raise UserError(f"tokenizer {name}: cannot load ({where}): {first}{hint}") from None
    finally:
        hf_logging.set_verbosity(verbosity)
    if not tokenizer.chat_template:
        raise UserError(f"tokenizer {name}: has no chat template")
    return tokenizer


def chat_template_sha256(tokenizer: PreTrainedTokenizerBase) -> str:
    template = tokenizer.chat_template
    if not isinstance(template, str):
        template = json.dumps(template, sort_keys=True)
    return hashlib.sha256(template.encode("utf-8")).hexdigest()


def tokenizer_sha256(path: str) -> str:
    """Hash of the tokenizer's files (vocab, merges, config, template), for provenance."""
    h = hashlib.sha256()
    if os.path.isdir(path):
        for name in sorted(os.listdir(path)):
            if name.startswith("tokenizer") or name.endswith((".jinja", ".json", ".model", ".txt")):
                full = os.path.join(path, name)
                if os.path.isfile(full):
                    h.update(name.encode() + b"\0")
                    with open(full, "rb") as f:
                        h.update(f.read())
    else:
        h.update(path.encode())
    return h.hexdigest()


def special_tokens(path: str) -> tuple[str, ...]:
    """The text of the special tokens a local tokenizer folder declares (tokenizer.json's added_tokens and
    tokenizer_config.json's added_tokens_decoder marked special; its eos, bos and pad), read from the JSON
    files without loading the tokenizer: what a chat template writes around turns, never what a model
    writes in an answer (quality's template_leak). () where the folder is not local or says none."""
    found = set()
    if not os.path.isdir(path):
        return ()
    for name, pick in (("tokenizer.json", lambda d: d.get("added_tokens") or []),
                       ("tokenizer_config.json", lambda d: list((d.get("added_tokens_decoder") or {}).values()))):
        try:
            with open(os.path.join(path, name), encoding="utf-8") as f:
                data = json.load(f)
        except (OSError, ValueError):
            continue
        if not isinstance(data, dict):
            continue
        found.update(t["content"] for t in pick(data)
                     if isinstance(t, dict) and t.get("special") and isinstance(t.get("content"), str))
        for key in ("eos_token", "bos_token", "pad_token"):
            token = data.get(key)
            token = token.get("content") if isinstance(token, dict) else token
            if isinstance(token, str):
                found.add(token)
    return tuple(sorted(t for t in found if len(t) > 1 and not t.isspace()))


def package_versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for name in ("transformers", "tokenizers", "pyarrow", "snakemake"):
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            pass
    from . import __version__

    out["budgetgen"] = __version__
    return out


def check_options(max_length: object, chat_template_kwargs: object) -> None:
    try:
        ok = not isinstance(max_length, bool) and operator.index(max_length) >= 1
    except TypeError:
        ok = False
    if not ok:
        raise UserError(f"max_length must be a positive integer, got {max_length!r}")
    if chat_template_kwargs is None:
        return
    if not isinstance(chat_template_kwargs, dict):
        raise UserError("chat_template_kwargs must be a JSON object")
    bad = sorted(set(chat_template_kwargs) & _RESERVED_KWARGS)
    if bad:
        raise UserError(f"chat_template_kwargs may not set {', '.join(bad)}")


_REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")


def prepare_messages(conversation: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """What apply_chat_template does to plain (JSON) messages: drop None values, alias reasoning."""
    out = []
    for m in conversation:
        if not isinstance(m, dict):
            raise TypeError(f"chat messages must be dicts, got {m!r}")
        if None in m.values():
            m = {k: v for k, v in m.items() if v is not None}
        for key in _REASONING_FIELDS:
            if key in m:
                m = {"thinking": m[key], **m, "reasoning_content": m[key]}
                break
        out.append(m)
    return out


def special_ids(tokenizer: PreTrainedTokenizerBase) -> set[int]:
    """Ids of the tokenizer's special tokens (declared special, or added tokens marked special)."""
    ids = {int(i) for i in tokenizer.all_special_ids}
    for idx, tok in getattr(tokenizer, "added_tokens_decoder", {}).items():
        if getattr(tok, "special", False):
            ids.add(int(idx))
    return ids


class TurnFormat:
    """What the chat template says about the turn the model generates, derived from the tokenizer:

    eot        the token that ends an assistant turn: the first special token the template writes
               after an assistant turn's content (a probe conversation user/assistant/user is
               rendered and the text after the assistant's content tokenized), else eos;
    open_tag / close_tag
               the reasoning delimiters: a pair the template names (tokens of the tokenizer first),
               else the first pair of REASONING_TAGS the tokenizer has as tokens, else PLAIN_TAGS as
               plain text (MiniMax-M1's `<think>`) if the tokenizer writes them back unchanged, else
               None (tokenizer.reasoning_tags names them).
    Whether the generation prompt prefills the opening tag, or ends with a closed think block, depends
    on the template kwargs (thinking on/off) and is decided per render (prefilled(), closed()).
    """

    PROBE = "Qx7PROBE"

    def __init__(self, tokenizer, render, reasoning_tags=None):
        self.special = special_ids(tokenizer)
        self.eot = self._eot(tokenizer, render)
        self.open_tag, self.close_tag = reasoning_tags or self._tags(tokenizer)

    @staticmethod
    def _tags(tokenizer):
        vocab = tokenizer.get_vocab()
        template = tokenizer.chat_template if isinstance(tokenizer.chat_template, str) else json.dumps(
            tokenizer.chat_template)
        named = dict.fromkeys(name for _, name in _TEMPLATE_TAG.findall(template))  # in order of appearance
        pairs = [(f"<{n}>", f"</{n}>") for n in named if f"<{n}>" in template and f"</{n}>" in template]
        pairs.sort(key=lambda pair: not (pair[0] in vocab and pair[1] in vocab))  # tokens first (stable)
        if pairs:
            return pairs[0]
        for open_tag, close_tag in REASONING_TAGS:
            if open_tag in vocab and close_tag in vocab:
                return open_tag, close_tag
        if all(TurnFormat._writes(tokenizer, tag) for tag in PLAIN_TAGS):
            return PLAIN_TAGS
        return None, None

    @staticmethod
    def _writes(tokenizer, text):
        """Whether the tokenizer decodes its encoding of text back to text (no unknown tokens)."""
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        return tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False) == text

    def _eot(self, tokenizer, render):
        p = self.PROBE
        for conv in ([{"role": "user", "content": "U1"}, {"role": "assistant", "content": p},
                      {"role": "user", "content": "U2"}],
                     [{"role": "user", "content": "U1"}, {"role": "assistant", "content": p}]):
            text = render(conv)
            if text is None or p not in text:
                continue
            tail = text.split(p, 1)[1]
            if "U2" in tail:
                tail = tail.split("U2", 1)[0]
            for t in tokenizer(tail, add_special_tokens=False)["input_ids"]:
                if t in self.special:
                    return int(t)
        return int(tokenizer.eos_token_id) if tokenizer.eos_token_id is not None else None

    def prefilled(self, prompt_text: str) -> bool:
        """Whether the generation prompt already opens the reasoning (QwQ, R1, Qwen3.5, V3.1 thinking)."""
        return bool(self.open_tag) and prompt_text.rstrip().endswith(self.open_tag)

    def closed(self, prompt_text: str) -> bool:
        """Whether the generation prompt ends with a closed think block (thinking off: Qwen3's
        `<think>\n\n</think>\n\n`, V3.1's `</think>`): the model writes no think block."""
        return bool(self.close_tag) and prompt_text.rstrip().endswith(self.close_tag)

    def completion_text(self, message: Mapping[str, Any], prompt_text: str, finish_reason: str | None) -> str | None:
        """The model's raw output for a generated message, or None if it cannot be rebuilt (rules: the
        module docstring). Reasoning is kept as the server streamed it, whitespace included."""
        content = message.get("content") or ""
        reasoning = next((r for r in map(message.get, _REASONING_FIELDS) if isinstance(r, str) and r), "")
        cut = finish_reason == "length" and not content  # cut inside the reasoning: no closing tag was made
        close = "" if cut else self.close_tag
        if self.prefilled(prompt_text):
            if not reasoning and self.close_tag in content:
                return content  # a server without a reasoning parser: the content is the raw output
            return reasoning + close + content
        if not reasoning or (self.closed(prompt_text) and not reasoning.strip()):
            return content
        if not self.open_tag:
            return None
        return self.open_tag + reasoning + close + content


def as_parts(conversation: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """String contents as one OpenAI text part each (other contents unchanged)."""
    return [{**m, "content": [{"type": "text", "text": m["content"]}]} if isinstance(m.get("content"), str) else m
            for m in conversation]


def record_kwargs(record: Mapping[str, Any], default: dict[str, Any]) -> dict[str, Any]:
    """The chat_template_kwargs the record's request used (its params.extra_body), else `default`."""
    params = record.get("params")
    if not isinstance(params, dict):
        return default
    kwargs = (params.get("extra_body") or {}).get("chat_template_kwargs")
    return dict(kwargs) if isinstance(kwargs, dict) else {}
