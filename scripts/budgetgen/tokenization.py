"""Training rows for draft models: the prompt exactly as the server fed it to the model, then
exactly the tokens it generated.

A row is `prompt ids + completion ids`, loss_mask 0 on the prompt and 1 on the completion. The
generated turn is never passed through the chat template: templates are written for prompting (they
strip reasoning, prefill `<think>`, rewrite history) and do not reproduce what the model generated.

Server ids: a record with `completion_token_ids` (server.return_token_ids) uses them verbatim, after
its `prompt_token_ids` when the server returned those too (vLLM, SGLang), else after the rendered
prompt below. Nothing is appended: a response cut at max_tokens ends where the model stopped.

Text fallback, when the server returned text only:
  prompt     = apply_chat_template(messages[:-1], add_generation_prompt=True, **kwargs), with the
               chat_template_kwargs the request used (the record's params.extra_body), tokenized
               without added special tokens (what the engines do for chat prompts);
  completion = the model's raw output rebuilt from the record (TurnFormat.completion_text):
               - the generation prompt ends with the opening tag (prefilled): reasoning (even empty or
                 whitespace) + closing tag + content, as the model must close the block before any
                 content (no reasoning and the closing tag in the content: a server without a
                 reasoning parser, the content is the raw output);
               - it ends with a closed think block (thinking switched off): the model writes no think
                 block, content; reasoning that is only whitespace is a server's artifact
                 (transformers serve streams the "\n\n") and is ignored, other reasoning is rebuilt
                 as below;
               - else, when the record has reasoning (whitespace only counts: Qwen3's empty
                 `<think>\n\n</think>` under /no_think): opening tag + reasoning + closing tag +
                 content;
               - else content;
               no closing tag when the response was cut inside the reasoning (finish_reason "length",
               no content); then the end-of-turn token the template puts after an assistant turn,
               unless finish_reason is "length".
The turn's format (end-of-turn token, reasoning delimiters, whether the generation prompt opens or
closes the reasoning) is derived from the tokenizer and its template (TurnFormat), never from a list of
known models; delimiters that neither names default to the plain text `<think>` / `</think>` (what
the engines' reasoning parsers split MiniMax-M1's output on). A record whose raw output cannot be
rebuilt faithfully (reasoning, but a tokenizer that cannot write those tags: set
tokenizer.reasoning_tags) is skipped with a counted reason, as are template errors.

Each row also carries its `conversation_id` and `turn` (budgetgen.conversations: with turns: all one
row per generated turn, its prompt the history the server saw, its completion that turn alone).

The output is an Arrow IPC stream (what `datasets.Dataset.from_file` reads), written atomically;
more than max_skipped_pct percent of records skipped fails the job, naming the reason and first id.
"""

import hashlib
import itertools
import json
import operator
import os
import re
import time
from collections import Counter

from budgetgen.conversations import record_place, record_prompt_id
from budgetgen.errors import UserError
from budgetgen.fsutil import atomic_path
from budgetgen.identity import record_settings, record_sha
from budgetgen.state import looks_local

# Skip reasons (counted, never written).
NO_SUPERVISED_TOKENS = "no_supervised_tokens"
TEMPLATE_ERROR = "template_error"
SERVER_IDS_OUT_OF_VOCAB = "server_token_ids_out_of_vocab"
REASONING_DELIMITERS_UNKNOWN = "reasoning_delimiters_unknown"

# Reasoning delimiters: a pair of tags named in the chat template (`<think>`, `<mm:think>`, ...), those
# that are tokens of the tokenizer first; else the first of these pairs the tokenizer has as tokens; else
# PLAIN_TAGS as text (MiniMax-M1 writes `<think>` as plain text; vLLM's and SGLang's parsers split on it).
_TEMPLATE_TAG = re.compile(r"<(/?)([\w:.-]*think[\w:.-]*)>")
REASONING_TAGS = (("<think>", "</think>"), ("<seed:think>", "</seed:think>"), ("◁think▷", "◁/think▷"),
                  ("<|begin_of_thought|>", "<|end_of_thought|>"), ("<thinking>", "</thinking>"))
PLAIN_TAGS = ("<think>", "</think>")

# What to do about a skip reason, said wherever skips are reported.
SKIP_HINTS = {
    REASONING_DELIMITERS_UNKNOWN: "reasoning, but no delimiters to rebuild the raw output with (the tokenizer "
                                  "cannot write <think> as text): set the ones the model writes, e.g. "
                                  "tokenizer.reasoning_tags: [\"<think>\", \"</think>\"]",
}

# apply_chat_template arguments that chat_template_kwargs must not override.
_RESERVED_KWARGS = {
    "conversation", "messages", "tokenize", "add_generation_prompt", "continue_final_message",
    "chat_template",
    "return_dict", "return_tensors", "return_assistant_tokens_mask", "padding", "truncation",
    "max_length", "tokenizer_kwargs", "tools", "documents",
}

PROGRESS_SECONDS = 5.0


def _schema():
    import pyarrow as pa

    return pa.schema(
        [
            ("id", pa.string()),
            ("input_ids", pa.list_(pa.int32())),
            ("loss_mask", pa.list_(pa.int8())),
            ("num_tokens", pa.int32()),
            ("num_supervised", pa.int32()),
            ("finish_reason", pa.string()),
            ("conversation_id", pa.string()),
            ("turn", pa.int32()),
            ("prompt_id", pa.string()),
            ("identity", pa.string()),
            ("cell", pa.string()),
        ]
    )


# --------------------------------------------------------------------------------------------------
# Tokenizer


def load_tokenizer(path, trust_remote_code=False):
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


def chat_template_sha256(tokenizer):
    template = tokenizer.chat_template
    if not isinstance(template, str):
        template = json.dumps(template, sort_keys=True)
    return hashlib.sha256(template.encode("utf-8")).hexdigest()


def tokenizer_sha256(path):
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


def package_versions():
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


def _check_options(max_length, chat_template_kwargs):
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


def _prepare(conversation):
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


def _special_ids(tokenizer):
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
        self.special = _special_ids(tokenizer)
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

    def prefilled(self, prompt_text):
        """Whether the generation prompt already opens the reasoning (QwQ, R1, Qwen3.5, V3.1 thinking)."""
        return bool(self.open_tag) and prompt_text.rstrip().endswith(self.open_tag)

    def closed(self, prompt_text):
        """Whether the generation prompt ends with a closed think block (thinking off: Qwen3's
        `<think>\n\n</think>\n\n`, V3.1's `</think>`): the model writes no think block."""
        return bool(self.close_tag) and prompt_text.rstrip().endswith(self.close_tag)

    def completion_text(self, message, prompt_text, finish_reason):
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


def _as_parts(conversation):
    """String contents as one OpenAI text part each (other contents unchanged)."""
    return [{**m, "content": [{"type": "text", "text": m["content"]}]} if isinstance(m.get("content"), str) else m
            for m in conversation]


def _record_kwargs(record, default):
    """The chat_template_kwargs the record's request used (its params.extra_body), else `default`."""
    params = record.get("params")
    if not isinstance(params, dict):
        return default
    kwargs = (params.get("extra_body") or {}).get("chat_template_kwargs")
    return dict(kwargs) if isinstance(kwargs, dict) else {}


class _Encoder:
    """A tokenizer plus what encoding needs, built once (per worker process)."""

    def __init__(self, tokenizer, max_length, chat_template_kwargs=None, use_server_ids=True, reasoning_tags=None,
                 samples=1):
        _check_options(max_length, chat_template_kwargs)
        self.tokenizer = tokenizer
        self.samples = samples  # generation.samples_per_prompt, for records written before identities
        self.split = None  # the split whose records become rows (None: every record; budgetgen.mixture)
        self.reasoning_tags = tuple(reasoning_tags) if reasoning_tags else None
        self.use_server_ids = use_server_ids
        self.vocab_size = len(tokenizer)
        self.max_length = operator.index(max_length)
        self.kwargs = dict(chat_template_kwargs or {})
        self.formats = {}  # kwargs json -> TurnFormat (the eot may depend on the template's switches)
        self.backend = getattr(tokenizer, "backend_tokenizer", None) if getattr(tokenizer, "is_fast", False) else None
        if self.backend is not None:
            # One call through the tokenizer sets the backend up as __call__ would (no truncation, no
            # padding, special-token splitting as configured); the backend is then called directly,
            # which skips building BatchEncoding/offsets. A per-batch spot check guards the shortcut.
            tokenizer(["x"], add_special_tokens=False)
        self.fast_ok = self.backend is not None and hasattr(self.backend, "encode_batch_fast")
        self.content_parts = self._wants_content_parts()
        self.direct = self._setup_direct()

    def _wants_content_parts(self):
        """Whether the template reads message content as OpenAI parts ([{"type": "text", "text"}]),
        as MiniMax-M1's does (`message['content'][0]['text']`); the engines detect this and convert
        string contents before rendering, and so does this encoder."""
        probe = TurnFormat.PROBE
        conv = [{"role": "user", "content": probe}]

        def renders(c):
            try:
                out = self.tokenizer.apply_chat_template(c, tokenize=False, add_generation_prompt=True, **self.kwargs)
            except Exception:
                return False
            return probe in out

        return not renders(conv) and renders(_as_parts(conv))

    def turn_format(self, kwargs):
        key = json.dumps(kwargs, sort_keys=True)
        if key not in self.formats:
            def render(conv):
                out, _ = self.render([conv], False, kwargs)
                return out[0]
            self.formats[key] = TurnFormat(self.tokenizer, render, self.reasoning_tags)
        return self.formats[key]

    def ids(self, texts):
        if not texts:
            return []
        if self.fast_ok:
            out = [enc.ids for enc in self.backend.encode_batch_fast(texts, add_special_tokens=False)]
            if out[0] == self.tokenizer([texts[0]], add_special_tokens=False)["input_ids"][0]:
                return out
            self.fast_ok = False
        return self.tokenizer(texts, add_special_tokens=False)["input_ids"]

    def render(self, conversations, add_generation_prompt, kwargs):
        """Render each conversation to text; failures become None (with the first error's text)."""
        if self.content_parts:
            conversations = [_as_parts(conv) for conv in conversations]
        if self.direct is not None:
            out = self._render_direct(conversations, add_generation_prompt, kwargs)
            if out is not None:
                return out, None
        apply = self.tokenizer.apply_chat_template
        try:
            return apply(conversations, tokenize=False, add_generation_prompt=add_generation_prompt,
                         **kwargs), None
        except Exception:
            pass
        out, first_error = [], None
        for conv in conversations:
            try:
                out.append(apply([conv], tokenize=False, add_generation_prompt=add_generation_prompt,
                                 **kwargs)[0])
            except Exception as exc:
                out.append(None)
                first_error = first_error or f"{type(exc).__name__}: {exc}"
        return out, first_error

    def _setup_direct(self):
        """The compiled template, to render without apply_chat_template's per-call overhead.

        apply_chat_template deep-copies every conversation into plain data for the sandbox, drops
        None-valued keys and aliases the reasoning fields; for JSON-loaded messages only the last two
        change anything, and _prepare does them. A per-batch spot check against apply_chat_template
        turns this off if it ever renders differently.
        """
        try:
            from transformers.utils.chat_template_utils import _compile_jinja_template

            template = _compile_jinja_template(self.tokenizer.get_chat_template())
        except Exception:
            return None
        return template, dict(self.tokenizer.special_tokens_map)

    def _render_direct(self, conversations, add_generation_prompt, kwargs):
        template, variables = self.direct
        try:
            out = [template.render(messages=_prepare(conv), tools=None, documents=None,
                                   add_generation_prompt=add_generation_prompt, **variables, **kwargs)
                   for conv in conversations]
            check = self.tokenizer.apply_chat_template(
                [conversations[0]], tokenize=False, add_generation_prompt=add_generation_prompt, **kwargs)[0]
        except Exception:
            return None  # apply_chat_template's path sorts out which conversation fails
        if out[0] != check:
            self.direct = None
            return None
        return out

    def encode(self, records):
        """Per record: (ids truncated to max_length, prompt_len, end) or a skip reason.

        The loss mask is 1 on ids[prompt_len:end] and 0 elsewhere. A record is a journal record
        (dict with "messages", "finish_reason", "params"?, "prompt_token_ids"?, "completion_token_ids"?).
        """
        n = len(records)
        results = [None] * n
        prompt_ids, completion_ids = [None] * n, [None] * n
        first_error = None
        need_prompt = []  # indices whose prompt is rendered here
        for i, rec in enumerate(records):
            server = rec.get("completion_token_ids") if self.use_server_ids else None
            if server:
                if max(server) >= self.vocab_size or min(server) < 0:
                    results[i] = SERVER_IDS_OUT_OF_VOCAB
                    continue
                completion_ids[i] = list(server)
                if rec.get("prompt_token_ids"):
                    prompt_ids[i] = list(rec["prompt_token_ids"])
                    continue
            need_prompt.append(i)
        # render the prompts, one group per chat_template_kwargs (each record's own)
        groups = {}
        for i in need_prompt:
            kwargs = _record_kwargs(records[i], self.kwargs)
            groups.setdefault(json.dumps(kwargs, sort_keys=True), (kwargs, []))[1].append(i)
        texts_of = {}  # index -> completion text to tokenize
        prompt_text = {}
        for kwargs, idx in groups.values():
            fmt = self.turn_format(kwargs)
            rendered, err = self.render([records[i]["messages"][:-1] for i in idx], True, kwargs)
            first_error = first_error or err
            for i, text in zip(idx, rendered):
                if text is None:
                    results[i] = TEMPLATE_ERROR
                    continue
                prompt_text[i] = text
                if completion_ids[i] is None:
                    rec = records[i]
                    raw = fmt.completion_text(rec["messages"][-1], text, rec.get("finish_reason"))
                    if raw is None:
                        results[i] = REASONING_DELIMITERS_UNKNOWN
                        continue
                    texts_of[i] = (raw, None if rec.get("finish_reason") == "length" else fmt.eot)
        order = [i for i in prompt_text if results[i] is None]
        for i, ids in zip(order, self.ids([prompt_text[i] for i in order])):
            prompt_ids[i] = ids
        order = [i for i in texts_of if results[i] is None]
        for i, ids in zip(order, self.ids([texts_of[i][0] for i in order])):
            eot = texts_of[i][1]
            completion_ids[i] = ids + [eot] if eot is not None else ids
        max_length = self.max_length
        for i in range(n):
            if results[i] is not None:
                continue
            p, c = prompt_ids[i], completion_ids[i]
            ids = p + c
            end = len(ids)
            if len(ids) > max_length:
                ids = ids[:max_length]
                end = max_length
            if end <= len(p):
                results[i] = NO_SUPERVISED_TOKENS
                continue
            results[i] = (ids, len(p), end)
        return results, first_error


def encode_batch(tokenizer, records, max_length, chat_template_kwargs=None, use_server_ids=True,
                 reasoning_tags=None):
    """Encode journal records (or plain conversations: lists of messages whose last one is the
    generated assistant turn, taken as finished with "stop").

    Returns, per record, (input_ids, loss_mask) as lists of ints, or a skip-reason string
    ("no_supervised_tokens", "template_error", "server_token_ids_out_of_vocab",
    "reasoning_delimiters_unknown").
    """
    encoder = _Encoder(tokenizer, max_length, chat_template_kwargs, use_server_ids, reasoning_tags)
    records = [r if isinstance(r, dict) else {"messages": list(r), "finish_reason": "stop"} for r in records]
    results, _ = encoder.encode(records)
    out = []
    for res in results:
        if isinstance(res, str):
            out.append(res)
        else:
            ids, lp, end = res
            out.append((list(ids), [0] * lp + [1] * (end - lp) + [0] * (len(ids) - end)))
    return out


# --------------------------------------------------------------------------------------------------
# Files


def _parse_record(line, lineno, input_path, samples=1):
    where = f"{input_path}:{lineno}"
    try:
        record = json.loads(line)
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError
        raise UserError(f"{where}: not valid JSON ({exc})") from None
    if not isinstance(record, dict):
        raise UserError(f"{where}: a record must be a JSON object")
    rid = record.get("id")
    if not isinstance(rid, (str, int)) or isinstance(rid, bool) or rid == "":
        raise UserError(f"{where}: record has no \"id\"")
    messages = record.get("messages")
    if not isinstance(messages, list) or not messages:
        raise UserError(f"{where}: \"messages\" must be a non-empty list")
    for m in messages:
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise UserError(f"{where}: each message must be an object with a \"role\"")
    if messages[-1]["role"] != "assistant":
        raise UserError(f"{where}: the last message must be the generated assistant turn, "
                        f"got role {messages[-1]['role']!r}")
    finish = record.get("finish_reason")
    if finish is not None and not isinstance(finish, str):
        raise UserError(f"{where}: \"finish_reason\" must be a string")
    for key in ("completion_token_ids", "prompt_token_ids"):
        ids = record.get(key)
        if ids is not None and (not isinstance(ids, list) or not all(type(t) is int for t in ids)):
            raise UserError(f"{where}: \"{key}\" must be a list of integers")
    # the generation identity it was made under (budgetgen.identity): mixing several mixes data distributions
    return str(rid), record, finish, record_sha(record, samples)


def record_split(record):
    """The split a raw_responses.jsonl record belongs to (finalize writes it; budgetgen.mixture)."""
    return record.get("split") or "train"


def record_cell(record):
    return record.get("cell") if isinstance(record.get("cell"), str) else "default"


def _encode_chunk(encoder, chunk, input_path):
    """Parse and encode (lineno, line) pairs of the encoder's split; return (RecordBatch or None, stats)."""
    import numpy as np
    import pyarrow as pa

    records = [_parse_record(line, lineno, input_path, encoder.samples) for lineno, line in chunk]
    other = 0
    if encoder.split is not None:
        mine = [r for r in records if record_split(r[1]) == encoder.split]
        other, records = len(records) - len(mine), mine
    results, error = encoder.encode([r[1] for r in records])
    skipped, first_skipped = Counter(), {}
    kept_ids, kept_finish, kept_conv, kept_turn, kept_prompt, kept_identity, kept_cell, rows = ([] for _ in range(8))
    identities = {}  # sha -> readable settings, of the records of this chunk
    server_rows = 0
    for (rid, rec, finish, sha), res in zip(records, results):
        if sha not in identities:
            identities[sha] = {"settings": record_settings(rec, encoder.samples), "cell": record_cell(rec)}
        if isinstance(res, str):
            skipped[res] += 1
            first_skipped.setdefault(res, rid)
        else:
            server_rows += bool(encoder.use_server_ids and rec.get("completion_token_ids"))
            kept_ids.append(rid)
            kept_finish.append(finish)
            conv, turn = record_place(rid, rec)
            kept_conv.append(conv)
            kept_turn.append(turn)
            kept_prompt.append(record_prompt_id(rid, rec))
            kept_identity.append(sha)
            kept_cell.append(record_cell(rec))
            rows.append(res)
    stats = {"records": len(records), "other_split": other, "skipped": dict(skipped), "first_skipped": first_skipped,
             "error": error,
             "settings": dict(Counter(r[3] for r in records)), "identities": identities,
             "server_id_rows": server_rows}
    if not rows:
        stats.update(rows=0, tokens=0, supervised_tokens=0)
        return None, stats
    n = len(rows)
    lengths = np.fromiter((len(r[0]) for r in rows), dtype=np.int64, count=n)
    prompt_len = np.fromiter((r[1] for r in rows), dtype=np.int64, count=n)
    mask_end = np.fromiter((r[2] for r in rows), dtype=np.int64, count=n)
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    total = int(offsets[-1])
    if total >= 2**31:
        raise UserError("a batch holds over 2^31 tokens: lower batch_size")
    values = np.fromiter(itertools.chain.from_iterable(r[0] for r in rows), dtype=np.int32, count=total)
    position = np.arange(total, dtype=np.int64)
    starts = offsets[:-1]
    mask = ((position >= np.repeat(starts + prompt_len, lengths))
            & (position < np.repeat(starts + mask_end, lengths)))
    offsets32 = pa.array(offsets.astype(np.int32))
    supervised = mask_end - prompt_len
    schema = _schema()
    batch = pa.RecordBatch.from_arrays(
        [
            pa.array(kept_ids, type=pa.string()),
            pa.ListArray.from_arrays(offsets32, pa.array(values, type=pa.int32())),
            pa.ListArray.from_arrays(offsets32, pa.array(mask.view(np.int8), type=pa.int8())),
            pa.array(lengths.astype(np.int32), type=pa.int32()),
            pa.array(supervised.astype(np.int32), type=pa.int32()),
            pa.array(kept_finish, type=pa.string()),
            pa.array(kept_conv, type=pa.string()),
            pa.array(kept_turn, type=pa.int32()),
            pa.array(kept_prompt, type=pa.string()),
            pa.array(kept_identity, type=pa.string()),
            pa.array(kept_cell, type=pa.string()),
        ],
        schema=schema,
    )
    stats.update(rows=n, tokens=total, supervised_tokens=int(supervised.sum()))
    return batch, stats


def _chunks(input_path, batch_size):
    """Yield lists of (lineno, line bytes), batch_size non-blank lines each."""
    try:
        f = open(input_path, "rb")
    except FileNotFoundError:
        raise UserError(f"{input_path}: no such file") from None
    except OSError as exc:
        raise UserError(f"{input_path}: cannot read ({exc.strerror})") from None
    with f:
        chunk = []
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            chunk.append((lineno, line))
            if len(chunk) >= batch_size:
                yield chunk
                chunk = []
        if chunk:
            yield chunk


# Worker-process state (multiprocessing): one encoder per process, built by the initializer.
_WORKER = None


def _cpu_count():
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _worker_init(tokenizer_path, max_length, chat_template_kwargs, input_path, threads, use_server_ids,
                 trust_remote_code=False, reasoning_tags=None, samples=1, split=None):
    global _WORKER
    # Each worker gets its share of the cores for the Rust tokenizer's own threads (set before its
    # thread pool starts); with one core each, the processes are the only parallelism.
    if threads > 1:
        os.environ["TOKENIZERS_PARALLELISM"] = "true"
        os.environ.setdefault("RAYON_NUM_THREADS", str(threads))
    else:
        os.environ["TOKENIZERS_PARALLELISM"] = "false"
    tokenizer = load_tokenizer(tokenizer_path, trust_remote_code)
    encoder = _Encoder(tokenizer, max_length, chat_template_kwargs, use_server_ids, reasoning_tags, samples)
    encoder.split = split
    _WORKER = (encoder, input_path)


def _worker_encode(chunk):
    encoder, input_path = _WORKER
    return _encode_chunk(encoder, chunk, input_path)


def format_summary(rows, skipped):
    total = sum(skipped.values())
    if not total:
        return f"Tokenized: {rows} (0 skipped)"
    parts = ", ".join(f"{reason}={n}" for reason, n in sorted(skipped.items()))
    hints = "".join(f"; {SKIP_HINTS[reason]}" for reason in sorted(skipped) if reason in SKIP_HINTS)
    return f"Tokenized: {rows} ({total} skipped: {parts}){hints}"


def tokenize_file(input_path, output_path, tokenizer_path, max_length, processes=1,
                  chat_template_kwargs=None, batch_size=512, log=print, allow_mixed_settings=False,
                  use_server_token_ids=True, config_sha256=None, trust_remote_code=False, max_skipped_pct=1.0,
                  reasoning_tags=None, samples=1, split=None):
    """Tokenize a raw_responses.jsonl into an Arrow IPC stream file; return the stats.

    Stats: {"rows", "skipped": {reason: n}, "tokens", "supervised_tokens", "server_id_rows"}.
    More than max_skipped_pct percent of the records skipped is an error (nothing is written).
    `split`: only the records of that split (train or validation: their `split` field, budgetgen.mixture).
    """
    import pyarrow as pa

    input_path, output_path = os.fspath(input_path), os.fspath(output_path)
    tokenizer_path = os.fspath(tokenizer_path)
    _check_options(max_length, chat_template_kwargs)
    processes = max(1, int(processes))
    batch_size = max(1, int(batch_size))
    if not os.path.isfile(input_path):
        raise UserError(f"{input_path}: no such file")
    # Loaded here even with workers: fails early with a clean error, and gives the template's hash.
    tokenizer = load_tokenizer(tokenizer_path, trust_remote_code)
    template_sha = chat_template_sha256(tokenizer)

    totals = {"rows": 0, "tokens": 0, "supervised_tokens": 0, "server_id_rows": 0}
    skipped, first_skipped = Counter(), {}
    records = other_split = 0
    started = last_progress = time.monotonic()
    first_error = None
    settings = Counter()  # identity sha -> records
    identities = {}  # identity sha -> readable settings
    schema = _schema()

    with atomic_path(output_path) as tmp:
        spool = tmp + ".spool"  # batches go here as they come; the final file needs the counts up front
        try:
            with pa.OSFile(spool, "wb") as sink, pa.ipc.new_stream(sink, schema) as writer:
                if processes == 1:
                    encoder = _Encoder(tokenizer, max_length, chat_template_kwargs, use_server_token_ids,
                                       reasoning_tags, samples)
                    encoder.split = split
                    results = (_encode_chunk(encoder, chunk, input_path)
                               for chunk in _chunks(input_path, batch_size))
                    pool = None
                else:
                    import multiprocessing

                    pool = multiprocessing.get_context("spawn").Pool(
                        processes, initializer=_worker_init,
                        initargs=(tokenizer_path, max_length, chat_template_kwargs, input_path,
                                  _cpu_count() // processes, use_server_token_ids, trust_remote_code,
                                  reasoning_tags, samples, split))
                    results = pool.imap(_worker_encode, _chunks(input_path, batch_size))
                try:
                    for batch, stats in results:
                        if batch is not None:
                            writer.write_batch(batch)
                        records += stats["records"]
                        other_split += stats["other_split"]
                        settings.update(stats["settings"])
                        for sha, readable in stats["identities"].items():
                            identities.setdefault(sha, readable)
                        skipped.update(stats["skipped"])
                        for reason, rid in stats["first_skipped"].items():
                            first_skipped.setdefault(reason, rid)
                        for key in totals:
                            totals[key] += stats[key]
                        if stats["error"] and first_error is None:
                            first_error = stats["error"]
                            log(f"warning: chat template failed on a conversation: {first_error}")
                        now = time.monotonic()
                        if now - last_progress >= PROGRESS_SECONDS:
                            last_progress = now
                            rate = records / (now - started)
                            log(f"Tokenizing: {records} records, {totals['rows']} rows, "
                                f"{totals['tokens']} tokens ({rate:.0f} records/s)")
                finally:
                    if pool is not None:
                        pool.terminate()
                        pool.join()
            n_skipped = sum(skipped.values())
            if records and 100.0 * n_skipped / records > max_skipped_pct:
                reason, count = skipped.most_common(1)[0]
                raise UserError(f"{input_path}: {n_skipped} of {records} records skipped "
                                f"({100.0 * n_skipped / records:.1f} % > tokenizer.max_skipped_pct {max_skipped_pct:g}); "
                                f"most: {reason} ({count}, first id {first_skipped[reason]!r})"
                                + (f"; {SKIP_HINTS[reason]}" if reason in SKIP_HINTS else ""))
            if len(settings) > 1 and not allow_mixed_settings:
                kinds = "; ".join(f"{n} x {json.dumps(identities.get(k, {}).get('settings'), sort_keys=True)}"
                                  for k, n in settings.most_common())
                raise UserError(f"{input_path}: responses were generated with {len(settings)} different "
                                f"content settings ({kinds}); set tokenizer.allow_mixed_settings: true "
                                "(or generation.on_settings_change: extend) to tokenize them together")
            metadata = {
                # the provenance: the generation identities its rows were made under (budgetgen.identity;
                # each row's `identity` column names its own), never the config's if they differ
                "generation_settings": [{"identity": k, "records": n, **identities.get(k, {})}
                                        for k, n in settings.most_common()],
                "split": split or "all",
                "cells": sorted({v.get("cell") for v in identities.values()} - {None}),
                "tokenizer_sha256": tokenizer_sha256(tokenizer_path),
                "packages": package_versions(),
                "tokenizer_path": tokenizer_path,
                "chat_template_sha256": template_sha,
                "chat_template_kwargs": chat_template_kwargs or {},
                "max_length": int(max_length),
                "use_server_token_ids": bool(use_server_token_ids),
                "server_id_rows": totals["server_id_rows"],
                "trust_remote_code": bool(trust_remote_code),
                "reasoning_tags": list(reasoning_tags) if reasoning_tags else None,
                "config_sha256": config_sha256,
                "rows": totals["rows"],
                "skipped": dict(sorted(skipped.items())),
            }
            final_schema = schema.with_metadata({"budgetgen": json.dumps(metadata, sort_keys=True)})
            with pa.memory_map(spool, "r") as source, pa.OSFile(tmp, "wb") as sink:
                with pa.ipc.new_stream(sink, final_schema) as writer:
                    for batch in pa.ipc.open_stream(source):
                        writer.write_batch(batch)
        finally:
            try:
                os.unlink(spool)
            except FileNotFoundError:
                pass

    log(format_summary(totals["rows"], skipped)
        + (f"; {other_split} records of the other split left to its own file" if other_split else ""))
    return {"rows": totals["rows"], "skipped": dict(sorted(skipped.items())), "tokens": totals["tokens"],
            "supervised_tokens": totals["supervised_tokens"], "server_id_rows": totals["server_id_rows"]}
