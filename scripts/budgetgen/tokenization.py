"""The tokenize job's file driver: raw_responses.jsonl -> an Arrow IPC stream of training rows
(budgetgen.rows makes each row), one split's records (budgetgen.mixture), in batches, on a pool of
worker processes when asked, written atomically with its provenance metadata; more than
max_skipped_pct percent of records skipped fails the job, naming the reason and the first id.

Each row also carries its `conversation_id` and `turn` (budgetgen.conversations: with turns: all one
row per generated turn), its `prompt_id`, generation `identity` and mixture `cell`. The output is what
`datasets.Dataset.from_file` reads.
"""

from __future__ import annotations

import itertools
import json
import os
import time
from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from budgetgen.conversations import record_place, record_prompt_id
from budgetgen.errors import UserError
from budgetgen.fsutil import atomic_path
from budgetgen.identity import record_settings
from budgetgen.processes import usable_cpus
from budgetgen.quality import KEPT, dropped_text, gate_for, record_flags
from budgetgen.raw_records import line_batches, parse_record, record_cell, record_split, record_tokens
from budgetgen.rows import RowEncoder
from budgetgen.tokenize_counts import Tally, format_summary
from budgetgen.turn_format import (
    chat_template_sha256,
    check_options,
    load_tokenizer,
)
from budgetgen.usage_check import Agreement

if TYPE_CHECKING:
    from collections.abc import Callable

    from transformers import PreTrainedTokenizerBase



@dataclass(frozen=True)
class TokenizeOptions:
    """Everything tokenize_file needs besides its files (settings.TokenizeSettings.options() builds it
    from the config's tokenizer section; each field is that section's key of the same name).

    chat_template_kwargs: for records that carry no request params of their own; split: only the records of
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
    split: str | None = None
    config_sha256: str | None = None
    batch_size: int = 512
    gates: tuple = ()  # ((cell, quality.Gate), ...): the records each cell's gate drops make no row
    check_usage: bool = True  # rows built from text held against the server's usage (budgetgen.usage_check)
    engine: str = "openai"  # the server's dialect, named when that check refuses

    def __post_init__(self) -> None:
        check_options(self.max_length, self.chat_template_kwargs)  # once, before any tokenizer loads

    def encoder(self, tokenizer: PreTrainedTokenizerBase) -> RowEncoder:
        """The RowEncoder these options make of a loaded tokenizer."""
        return RowEncoder(tokenizer, self.max_length, self.chat_template_kwargs, self.use_server_token_ids,
                          self.reasoning_tags, self.split)

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
            ("flags", pa.list_(pa.string())),
            ("reasoning_forced_end", pa.bool_()),
        ]
    )


def _encode_chunk(encoder, chunk, input_path, gates=()):
    """Parse and encode (lineno, line) pairs of the encoder's split, the records the quality gate drops
    (`gates`: TokenizeOptions.gates) counted and left out, a kept one's flagged facts in its `flags`;
    return (RecordBatch or None, stats)."""
    records = [parse_record(line, lineno, input_path) for lineno, line in chunk]
    other = 0
    if encoder.split is not None:
        mine = [r for r in records if record_split(r[1]) == encoder.split]
        other, records = len(records) - len(mine), mine
    dropped = Counter()
    if gates:
        fates = [gate_for(gates, record_cell(r[1])).fate(record_flags(r[1], encoder.reasoning_tags),
                                                          record_tokens(r[1])) for r in records]
        dropped.update(f.reason for f in fates if not f.kept)
        records, fates = ([r for r, f in zip(records, fates, strict=True) if f.kept],
                          [f for f in fates if f.kept])
    else:
        fates = [KEPT] * len(records)
    results, error = encoder.encode([r[1] for r in records])
    skipped, first_skipped = Counter(), {}
    columns = [[] for _ in range(9)]  # the row columns but the encoded ones (_record_batch)
    (kept_ids, kept_finish, kept_conv, kept_turn, kept_prompt, kept_identity, kept_cell, kept_flags,
     kept_forced) = columns
    rows = []
    identities = {}  # sha -> readable settings, of the records of this chunk
    server_rows, agreement = 0, Agreement()
    for (rid, rec, finish, sha), res, fate in zip(records, results, fates, strict=True):
        if sha not in identities:
            identities[sha] = {"settings": record_settings(rec), "cell": record_cell(rec)}
        if isinstance(res, str):
            skipped[res] += 1
            first_skipped.setdefault(res, rid)
        else:
            server_rows += _held_against_usage(agreement, encoder, rid, rec, res)
            kept_ids.append(rid)
            kept_finish.append(finish)
            conv, turn = record_place(rid, rec)
            kept_conv.append(conv)
            kept_turn.append(turn)
            kept_prompt.append(record_prompt_id(rid, rec))
            kept_identity.append(sha)
            kept_cell.append(record_cell(rec))
            kept_flags.append(list(fate.flagged))
            kept_forced.append(bool(rec.get("reasoning_forced_end")))
            rows.append(res)
    stats = {"records": len(records), "other_split": other, "dropped": dict(dropped),
             "skipped": dict(skipped), "first_skipped": first_skipped,
             "error": error,
             "settings": dict(Counter(r[3] for r in records)), "identities": identities,
             "server_id_rows": server_rows, "usage": agreement,
             "rerender_checked": encoder.rerender_checked, "rerender_differs": encoder.rerender_differs}
    if not rows:
        stats.update(rows=0, tokens=0, supervised_tokens=0)
        return None, stats
    batch, total, supervised = _record_batch(rows, columns)
    stats.update(rows=len(rows), tokens=total, supervised_tokens=supervised)
    return batch, stats


def _held_against_usage(agreement, encoder, rid, rec, res):
    """A row held against its record's usage (budgetgen.usage_check) when rebuilt from text and whole (not
    cut at max_length); returns whether it is the server's ids instead (1) or not (0)."""
    if encoder.use_server_ids and rec.get("completion_token_ids"):
        return 1
    if len(res[0]) < encoder.max_length:
        usage = rec.get("usage") or {}
        agreement.add(rid, res[2] - res[1], usage.get("completion_tokens"), res[1], usage.get("prompt_tokens"))
    return 0


def _record_batch(rows, columns):
    """The Arrow batch of encoded rows ((ids, prompt_len, end) each; the loss mask is 1 on ids[prompt_len:end])
    and their other columns (id, finish_reason, conversation_id, turn, prompt_id, identity, cell): (batch,
    tokens, supervised tokens)."""
    import numpy as np
    import pyarrow as pa

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
    ids, finish, conv, turn, prompt, identity, cell, flags, forced = columns
    batch = pa.RecordBatch.from_arrays(
        [
            pa.array(ids, type=pa.string()),
            pa.ListArray.from_arrays(offsets32, pa.array(values, type=pa.int32())),
            pa.ListArray.from_arrays(offsets32, pa.array(mask.view(np.int8), type=pa.int8())),
            pa.array(lengths.astype(np.int32), type=pa.int32()),
            pa.array(supervised.astype(np.int32), type=pa.int32()),
            pa.array(finish, type=pa.string()),
            pa.array(conv, type=pa.string()),
            pa.array(turn, type=pa.int32()),
            pa.array(prompt, type=pa.string()),
            pa.array(identity, type=pa.string()),
            pa.array(cell, type=pa.string()),
            pa.array(flags, type=pa.list_(pa.string())),
            pa.array(forced, type=pa.bool_()),
        ],
        schema=_schema(),
    )
    return batch, total, int(supervised.sum())


# Worker-process state (multiprocessing): one encoder per process, built by the initializer.
_WORKER = None


def _worker_init(options, input_path, threads):
    global _WORKER
    # Each worker gets its share of the cores for the Rust tokenizer's own threads (set before its
    # thread pool starts); with one core each, the processes are the only parallelism.
    if threads > 1:
        os.environ["TOKENIZERS_PARALLELISM"] = "true"
        os.environ.setdefault("RAYON_NUM_THREADS", str(threads))
    else:
        os.environ["TOKENIZERS_PARALLELISM"] = "false"
    _WORKER = (options.encoder(load_tokenizer(options.tokenizer, options.trust_remote_code)), input_path,
               options.gates)


def _worker_encode(chunk):
    encoder, input_path, gates = _WORKER
    return _encode_chunk(encoder, chunk, input_path, gates)


@contextmanager
def _encoded_batches(o, tokenizer, input_path):
    """(batch or None, stats) of every batch of the file, in order: in this process, or on a pool of
    o.processes spawned workers (terminated on exit)."""
    batch_size = max(1, int(o.batch_size))
    processes = max(1, int(o.processes))
    if processes == 1:
        encoder = o.encoder(tokenizer)
        yield (_encode_chunk(encoder, chunk, input_path, o.gates) for chunk in line_batches(input_path, batch_size))
        return
    import multiprocessing

    pool = multiprocessing.get_context("spawn").Pool(
        processes, initializer=_worker_init, initargs=(o, input_path, usable_cpus() // processes))
    try:
        yield pool.imap(_worker_encode, line_batches(input_path, batch_size))
    finally:
        pool.terminate()
        pool.join()


def tokenize_file(input_path: str | os.PathLike, output_path: str | os.PathLike, options: TokenizeOptions,
                  log: Callable[[str], object] = print) -> dict[str, int | dict[str, int]]:
    """Tokenize a raw_responses.jsonl into an Arrow IPC stream file under `options` (TokenizeOptions);
    return the stats.

    Stats: {"rows", "skipped": {reason: n}, "tokens", "supervised_tokens", "server_id_rows"}.
    More than options.max_skipped_pct percent of the records skipped is an error (nothing is written).
    """
    import pyarrow as pa

    o = options
    input_path, output_path = os.fspath(input_path), os.fspath(output_path)
    tokenizer_path = os.fspath(o.tokenizer)
    if not os.path.isfile(input_path):
        raise UserError(f"{input_path}: no such file")
    # Loaded here even with workers: fails early with a clean error, and gives the template's hash.
    tokenizer = load_tokenizer(tokenizer_path, o.trust_remote_code)
    template_sha = chat_template_sha256(tokenizer)
    tally, schema = Tally(), _schema()
    started = last_progress = time.monotonic()
    with atomic_path(output_path) as tmp:
        spool = tmp + ".spool"  # batches go here as they come; the final file needs the counts up front
        try:
            with pa.OSFile(spool, "wb") as sink, pa.ipc.new_stream(sink, schema) as writer, \
                    _encoded_batches(o, tokenizer, input_path) as results:
                for batch, stats in results:
                    if batch is not None:
                        writer.write_batch(batch)
                    error = tally.add(stats)
                    if error:
                        log(f"warning: chat template failed on a conversation: {error}")
                    now = time.monotonic()
                    if now - last_progress >= PROGRESS_SECONDS:
                        last_progress = now
                        log(f"Tokenizing: {tally.records} records, {tally.totals['rows']} rows, "
                            f"{tally.totals['tokens']} tokens ({tally.records / (now - started):.0f} records/s)")
            refusal = tally.refusal(input_path, o)
            if refusal:
                raise UserError(refusal)
            metadata = tally.metadata(o, tokenizer_path, template_sha)
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
    totals = tally.totals
    log(format_summary(totals["rows"], tally.skipped)
        + (f"; dropped by the quality gate: {dropped_text(tally.dropped)}" if tally.dropped else "")
        + (f"; {tally.other_split} records of the other split left to its own file" if tally.other_split else ""))
    return {"rows": totals["rows"], "skipped": dict(sorted(tally.skipped.items())),
            "dropped": dict(sorted(tally.dropped.items())), "tokens": totals["tokens"],
            "supervised_tokens": totals["supervised_tokens"], "server_id_rows": totals["server_id_rows"]}
