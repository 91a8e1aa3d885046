"""The tokenize job's file driver: raw_responses.jsonl -> an Arrow IPC stream of training rows
(budgetgen.rows makes each row), one split's records (budgetgen.mixture), in batches, on a pool of
worker processes when asked, written atomically with its provenance metadata; more than
max_skipped_pct percent of records skipped fails the job, naming the reason and the first id.

Each row also carries its `conversation_id` and `turn` (budgetgen.conversations: with turns: all one
row per generated turn), its `prompt_id`, generation `identity` and mixture `cell`. The output is what
`datasets.Dataset.from_file` reads.
"""

import itertools
import json
import os
import time
from collections import Counter
from dataclasses import dataclass, field

from budgetgen.conversations import record_place, record_prompt_id
from budgetgen.errors import UserError
from budgetgen.fsutil import atomic_path
from budgetgen.identity import record_settings, record_sha
from budgetgen.rows import SKIP_HINTS, RowEncoder
from budgetgen.turn_format import (
    chat_template_sha256,
    check_options,
    load_tokenizer,
    package_versions,
    tokenizer_sha256,
)


@dataclass(frozen=True)
class TokenizeOptions:
    """Everything tokenize_file needs besides its files (settings.TokenizeSettings.options() builds it
    from the config's tokenizer section; each field is that section's key of the same name).

    chat_template_kwargs: for records that carry no request params of their own; samples: the
    configured samples_per_prompt, for records written before identities; split: only the records of
    that split (train or validation: their `split` field, budgetgen.mixture), None for all;
    config_sha256: recorded in the metadata; batch_size: records per batch (and per worker task)."""

    tokenizer: str
    max_length: int
    processes: int = 1
    chat_template_kwargs: dict = field(default_factory=dict)
    use_server_token_ids: bool = True
    trust_remote_code: bool = False
    reasoning_tags: tuple | None = None
    allow_mixed_settings: bool = False
    max_skipped_pct: float = 1.0
    samples: int = 1
    split: str | None = None
    config_sha256: str | None = None
    batch_size: int = 512

    def encoder(self, tokenizer):
        """The RowEncoder these options make of a loaded tokenizer."""
        return RowEncoder(tokenizer, self.max_length, self.chat_template_kwargs, self.use_server_token_ids,
                          self.reasoning_tags, self.samples, self.split)

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


def _worker_init(options, input_path, threads):
    global _WORKER
    # Each worker gets its share of the cores for the Rust tokenizer's own threads (set before its
    # thread pool starts); with one core each, the processes are the only parallelism.
    if threads > 1:
        os.environ["TOKENIZERS_PARALLELISM"] = "true"
        os.environ.setdefault("RAYON_NUM_THREADS", str(threads))
    else:
        os.environ["TOKENIZERS_PARALLELISM"] = "false"
    _WORKER = (options.encoder(load_tokenizer(options.tokenizer, options.trust_remote_code)), input_path)


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


def tokenize_file(input_path, output_path, options, log=print):
    """Tokenize a raw_responses.jsonl into an Arrow IPC stream file under `options` (TokenizeOptions);
    return the stats.

    Stats: {"rows", "skipped": {reason: n}, "tokens", "supervised_tokens", "server_id_rows"}.
    More than options.max_skipped_pct percent of the records skipped is an error (nothing is written).
    """
    import pyarrow as pa

    o = options
    input_path, output_path = os.fspath(input_path), os.fspath(output_path)
    tokenizer_path = os.fspath(o.tokenizer)
    max_length, chat_template_kwargs, max_skipped_pct = o.max_length, o.chat_template_kwargs, o.max_skipped_pct
    check_options(max_length, chat_template_kwargs)
    processes = max(1, int(o.processes))
    batch_size = max(1, int(o.batch_size))
    if not os.path.isfile(input_path):
        raise UserError(f"{input_path}: no such file")
    # Loaded here even with workers: fails early with a clean error, and gives the template's hash.
    tokenizer = load_tokenizer(tokenizer_path, o.trust_remote_code)
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
                    encoder = o.encoder(tokenizer)
                    results = (_encode_chunk(encoder, chunk, input_path)
                               for chunk in _chunks(input_path, batch_size))
                    pool = None
                else:
                    import multiprocessing

                    pool = multiprocessing.get_context("spawn").Pool(
                        processes, initializer=_worker_init,
                        initargs=(o, input_path, _cpu_count() // processes))
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
            if len(settings) > 1 and not o.allow_mixed_settings:
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
                "split": o.split or "all",
                "cells": sorted({v.get("cell") for v in identities.values()} - {None}),
                "tokenizer_sha256": tokenizer_sha256(tokenizer_path),
                "packages": package_versions(),
                "tokenizer_path": tokenizer_path,
                "chat_template_sha256": template_sha,
                "chat_template_kwargs": chat_template_kwargs or {},
                "max_length": int(max_length),
                "use_server_token_ids": bool(o.use_server_token_ids),
                "server_id_rows": totals["server_id_rows"],
                "trust_remote_code": bool(o.trust_remote_code),
                "reasoning_tags": list(o.reasoning_tags) if o.reasoning_tags else None,
                "config_sha256": o.config_sha256,
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
