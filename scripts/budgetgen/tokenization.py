"""Chat-template rendering, loss masks and Arrow output for draft-model training data.

Each input record is a conversation whose LAST message is the generated assistant turn. It is
rendered twice with the tokenizer's own chat template:

  full   = apply_chat_template(messages,      add_generation_prompt=False)
  prompt = apply_chat_template(messages[:-1], add_generation_prompt=True)

Both are tokenized (batched, without added special tokens, which is what
apply_chat_template(tokenize=True) does). The prompt's ids must be a prefix of the full ids (checked
on the ids, not the text); the loss mask is 0 on the prompt, 1 from there through the first
end-of-turn token, and 0 on whatever the template appends after it. Rows are then truncated to
max_length.

Server token ids: a record with `completion_token_ids` (journaled when server.return_token_ids is on)
has its generated turn, ids[prompt_len:mask_end], replaced by the server's exact ids (plus the
template's end-of-turn token when generation was cut before one), so what the model produced is
trained on without re-tokenization drift; the prompt and the template's tail stay as rendered.

The output is an Arrow IPC stream (what `datasets.Dataset.from_file` reads), written atomically.
"""

import hashlib
import itertools
import json
import operator
import os
import time
from collections import Counter

from budgetgen.errors import UserError
from budgetgen.fsutil import atomic_path

# Skip reasons (counted, never written).
PROMPT_NOT_PREFIX = "prompt_not_prefix"
NO_SUPERVISED_TOKENS = "no_supervised_tokens"
TEMPLATE_ERROR = "template_error"
SERVER_IDS_OUT_OF_VOCAB = "server_token_ids_out_of_vocab"

# End-of-turn tokens besides the tokenizer's eos token (ChatML, Llama 3).
END_OF_TURN_TOKENS = ("<|im_end|>", "<|eot_id|>")

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
        ]
    )


# --------------------------------------------------------------------------------------------------
# Tokenizer


def load_tokenizer(path):
    """AutoTokenizer.from_pretrained(path), which must be a fast tokenizer with a chat template."""
    name = os.fspath(path)
    looks_local = os.path.isabs(name) or name.startswith(".") or name.count("/") > 1 or os.path.exists(name)
    if looks_local and not os.path.isdir(name):
        raise UserError(f"tokenizer {name}: no such folder")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "true")
    from transformers import AutoTokenizer
    from transformers.utils import logging as hf_logging

    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # its own multi-line warnings would bury our one-line error
    try:
        tokenizer = AutoTokenizer.from_pretrained(name)
    except Exception as exc:  # OSError (not found / offline), ValueError (bad config), ...
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        where = "folder" if os.path.isdir(name) else "no such folder, and not available offline from the hub"
        raise UserError(f"tokenizer {name}: cannot load ({where}): {first}") from None
    finally:
        hf_logging.set_verbosity(verbosity)
    if not getattr(tokenizer, "is_fast", False) or getattr(tokenizer, "backend_tokenizer", None) is None:
        raise UserError(f"tokenizer {name}: not a fast (tokenizers) tokenizer")
    if not tokenizer.chat_template:
        raise UserError(f"tokenizer {name}: has no chat template")
    return tokenizer


def chat_template_sha256(tokenizer):
    template = tokenizer.chat_template
    if not isinstance(template, str):
        template = json.dumps(template, sort_keys=True)
    return hashlib.sha256(template.encode("utf-8")).hexdigest()


def end_of_turn_ids(tokenizer):
    """The token ids that end an assistant turn: eos, plus <|im_end|> / <|eot_id|> where they exist."""
    ids = []
    if tokenizer.eos_token_id is not None:
        ids.append(int(tokenizer.eos_token_id))
    added = {tok.content: idx for idx, tok in tokenizer.added_tokens_decoder.items()}
    for token in END_OF_TURN_TOKENS:
        if token in added and added[token] not in ids:
            ids.append(int(added[token]))
    return tuple(ids)


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


class _Encoder:
    """A tokenizer plus what encoding needs, built once (per worker process)."""

    def __init__(self, tokenizer, max_length, chat_template_kwargs=None, use_server_ids=True):
        _check_options(max_length, chat_template_kwargs)
        self.tokenizer = tokenizer
        self.use_server_ids = use_server_ids
        self.vocab_size = len(tokenizer)
        self.max_length = operator.index(max_length)
        self.kwargs = dict(chat_template_kwargs or {})
        self.eot = end_of_turn_ids(tokenizer)
        # One call through the tokenizer sets the backend up as __call__ would (no truncation, no
        # padding, special-token splitting as configured); the backend is then called directly,
        # which skips building BatchEncoding/offsets. A per-batch spot check guards the shortcut.
        tokenizer(["x"], add_special_tokens=False)
        self.backend = tokenizer.backend_tokenizer
        self.fast_ok = hasattr(self.backend, "encode_batch_fast")
        self.direct = self._setup_direct()

    def ids(self, texts):
        if not texts:
            return []
        if self.fast_ok:
            out = [enc.ids for enc in self.backend.encode_batch_fast(texts, add_special_tokens=False)]
            if out[0] == self.tokenizer([texts[0]], add_special_tokens=False)["input_ids"][0]:
                return out
            self.fast_ok = False
        return self.tokenizer(texts, add_special_tokens=False)["input_ids"]

    def render(self, conversations, add_generation_prompt):
        """Render each conversation to text; failures become None (with the first error's text)."""
        if self.direct is not None:
            out = self._render_direct(conversations, add_generation_prompt)
            if out is not None:
                return out, None
        apply = self.tokenizer.apply_chat_template
        try:
            return apply(conversations, tokenize=False, add_generation_prompt=add_generation_prompt,
                         **self.kwargs), None
        except Exception:
            pass
        out, first_error = [], None
        for conv in conversations:
            try:
                out.append(apply([conv], tokenize=False, add_generation_prompt=add_generation_prompt,
                                 **self.kwargs)[0])
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
        variables = {**self.tokenizer.special_tokens_map, **self.kwargs}
        return template, variables

    def _render_direct(self, conversations, add_generation_prompt):
        template, variables = self.direct
        try:
            out = [template.render(messages=_prepare(conv), tools=None, documents=None,
                                   add_generation_prompt=add_generation_prompt, **variables)
                   for conv in conversations]
            check = self.tokenizer.apply_chat_template(
                [conversations[0]], tokenize=False, add_generation_prompt=add_generation_prompt,
                **self.kwargs)[0]
        except Exception:
            return None  # apply_chat_template's path sorts out which conversation fails
        if out[0] != check:
            self.direct = None
            return None
        return out

    def encode(self, conversations, server_ids=None):
        """Per conversation: (ids truncated to max_length, prompt_len, mask_end) or a skip reason.

        The loss mask is 1 on ids[prompt_len:mask_end] and 0 elsewhere. server_ids, if given, holds
        per conversation the server's generated ids or None (see the module docstring).
        """
        if not conversations:
            return [], None
        full, err1 = self.render(conversations, False)
        prompt, err2 = self.render([conv[:-1] for conv in conversations], True)
        ok = [i for i in range(len(conversations)) if full[i] is not None and prompt[i] is not None]
        if len(ok) == len(conversations):
            full_ids, prompt_ids = self.ids(full), self.ids(prompt)
        else:
            full_ids, prompt_ids = [None] * len(conversations), [None] * len(conversations)
            for i, f, p in zip(ok, self.ids([full[i] for i in ok]), self.ids([prompt[i] for i in ok])):
                full_ids[i], prompt_ids[i] = f, p
        max_length, eot = self.max_length, self.eot
        if server_ids is None or not self.use_server_ids:
            server_ids = [None] * len(conversations)
        results = []
        for f, p, s in zip(full_ids, prompt_ids, server_ids):
            if f is None:
                results.append(TEMPLATE_ERROR)
                continue
            lp = len(p)
            if len(f) <= lp or f[:lp] != p:
                results.append(PROMPT_NOT_PREFIX if f[:lp] != p else NO_SUPERVISED_TOKENS)
                continue
            end = len(f)
            for e in eot:
                try:
                    end = min(end, f.index(e, lp, end) + 1)
                except ValueError:
                    pass
            if s:
                if max(s) >= self.vocab_size or min(s) < 0:
                    results.append(SERVER_IDS_OUT_OF_VOCAB)
                    continue
                generated = list(s)
                if f[end - 1] in eot and generated[-1] not in eot:  # cut at max_tokens: close the turn
                    generated.append(f[end - 1])
                f = f[:lp] + generated + f[end:]
                end = lp + len(generated)
            if len(f) > max_length:
                f = f[:max_length]
                end = min(end, max_length)
            if end <= lp:
                results.append(NO_SUPERVISED_TOKENS)
                continue
            results.append((f, lp, end))
        return results, err1 or err2


def encode_batch(tokenizer, conversations, max_length, chat_template_kwargs=None, server_ids=None):
    """Encode conversations (lists of messages, the last one the generated assistant turn).

    Returns, per conversation, (input_ids, loss_mask) as lists of ints, or a skip-reason string
    ("prompt_not_prefix", "no_supervised_tokens", "template_error", "server_token_ids_out_of_vocab").
    server_ids: per conversation the server's generated token ids, or None to render the text.
    """
    encoder = _Encoder(tokenizer, max_length, chat_template_kwargs)
    results, _ = encoder.encode([list(conv) for conv in conversations], server_ids)
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


def _parse_record(line, lineno, input_path):
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
    server_ids = record.get("completion_token_ids")
    if server_ids is not None and (not isinstance(server_ids, list)
                                   or not all(type(t) is int for t in server_ids)):
        raise UserError(f"{where}: \"completion_token_ids\" must be a list of integers")
    return str(rid), messages, finish, _settings_key(record), server_ids


def _settings_key(record):
    """The content-affecting settings a response was generated with (its params and the model
    that served it): journals that mix several would silently mix two data distributions."""
    params = record.get("params") or {}
    return json.dumps({"params": params, "served_model": record.get("served_model") or params.get("model")},
                      sort_keys=True)


def _encode_chunk(encoder, chunk, input_path):
    """Parse and encode (lineno, line) pairs; return (RecordBatch or None, stats)."""
    import numpy as np
    import pyarrow as pa

    records = [_parse_record(line, lineno, input_path) for lineno, line in chunk]
    results, error = encoder.encode([r[1] for r in records], [r[4] for r in records])
    skipped = Counter()
    kept_ids, kept_finish, rows = [], [], []
    for (rid, _, finish, _, _), res in zip(records, results):
        if isinstance(res, str):
            skipped[res] += 1
        else:
            kept_ids.append(rid)
            kept_finish.append(finish)
            rows.append(res)
    stats = {"records": len(records), "skipped": dict(skipped), "error": error,
             "settings": dict(Counter(r[3] for r in records))}
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


def _worker_init(tokenizer_path, max_length, chat_template_kwargs, input_path, threads, use_server_ids):
    global _WORKER
    # Each worker gets its share of the cores for the Rust tokenizer's own threads (set before its
    # thread pool starts); with one core each, the processes are the only parallelism.
    if threads > 1:
        os.environ["TOKENIZERS_PARALLELISM"] = "true"
        os.environ.setdefault("RAYON_NUM_THREADS", str(threads))
    else:
        os.environ["TOKENIZERS_PARALLELISM"] = "false"
    tokenizer = load_tokenizer(tokenizer_path)
    _WORKER = (_Encoder(tokenizer, max_length, chat_template_kwargs, use_server_ids), input_path)


def _worker_encode(chunk):
    encoder, input_path = _WORKER
    return _encode_chunk(encoder, chunk, input_path)


def format_summary(rows, skipped):
    total = sum(skipped.values())
    if not total:
        return f"Tokenized: {rows} (0 skipped)"
    parts = ", ".join(f"{reason}={n}" for reason, n in sorted(skipped.items()))
    return f"Tokenized: {rows} ({total} skipped: {parts})"


def tokenize_file(input_path, output_path, tokenizer_path, max_length, processes=1,
                  chat_template_kwargs=None, batch_size=512, log=print, allow_mixed_settings=False,
                  use_server_token_ids=True, config_sha256=None):
    """Tokenize a raw_responses.jsonl into an Arrow IPC stream file; return the stats.

    Stats: {"rows", "skipped": {reason: n}, "tokens", "supervised_tokens"}.
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
    tokenizer = load_tokenizer(tokenizer_path)
    template_sha = chat_template_sha256(tokenizer)

    totals = {"rows": 0, "tokens": 0, "supervised_tokens": 0}
    skipped = Counter()
    records = 0
    started = last_progress = time.monotonic()
    first_error = None
    settings = Counter()
    schema = _schema()

    with atomic_path(output_path) as tmp:
        spool = tmp + ".spool"  # batches go here as they come; the final file needs the counts up front
        try:
            with pa.OSFile(spool, "wb") as sink, pa.ipc.new_stream(sink, schema) as writer:
                if processes == 1:
                    encoder = _Encoder(tokenizer, max_length, chat_template_kwargs, use_server_token_ids)
                    results = (_encode_chunk(encoder, chunk, input_path)
                               for chunk in _chunks(input_path, batch_size))
                    pool = None
                else:
                    import multiprocessing

                    pool = multiprocessing.get_context("spawn").Pool(
                        processes, initializer=_worker_init,
                        initargs=(tokenizer_path, max_length, chat_template_kwargs, input_path,
                                  _cpu_count() // processes, use_server_token_ids))
                    results = pool.imap(_worker_encode, _chunks(input_path, batch_size))
                try:
                    for batch, stats in results:
                        if batch is not None:
                            writer.write_batch(batch)
                        records += stats["records"]
                        settings.update(stats["settings"])
                        skipped.update(stats["skipped"])
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
            if len(settings) > 1 and not allow_mixed_settings:
                kinds = "; ".join(f"{n} x {k}" for k, n in settings.most_common())
                raise UserError(f"{input_path}: responses were generated with {len(settings)} different "
                                f"content settings ({kinds}); set tokenizer.allow_mixed_settings: true "
                                "(--allow-mixed-settings) to tokenize them together")
            metadata = {
                "generation_settings": [{"records": n, **json.loads(k)} for k, n in settings.most_common()],
                "tokenizer_sha256": tokenizer_sha256(tokenizer_path),
                "packages": package_versions(),
                "tokenizer_path": tokenizer_path,
                "chat_template_sha256": template_sha,
                "chat_template_kwargs": chat_template_kwargs or {},
                "max_length": int(max_length),
                "use_server_token_ids": bool(use_server_token_ids),
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

    log(format_summary(totals["rows"], skipped))
    return {"rows": totals["rows"], "skipped": dict(sorted(skipped.items())), "tokens": totals["tokens"],
            "supervised_tokens": totals["supervised_tokens"]}
