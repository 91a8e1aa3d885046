"""Export a dataset to the layouts draft-model trainers read.

Every record and row also carries its mixture cell (`cell`, budgetgen.mixture; extra fields both
trainers pass over); a dataset with a validation split exports its validation rows the same way
under export/validation/.

- SpecForge (sgl-project/SpecForge): JSON Lines of {"id", "conversations": [{"role", "content"}]},
  which its data pipeline tokenizes with its own chat template. The generated turn keeps its
  `reasoning_content` beside `content`, for templates that render it. Each line also carries the chat
  template kwargs its request was made with (`enable_thinking: false` of a nothink cell) as top-level
  fields: SpecForge 0.2.0's `build_eagle3_dataset` hands every column of a row but conversations, id and
  tools to `apply_chat_template` as keyword arguments (data/preprocessing.py: `preprocess_conversations(
  ..., **examples)` -> `parser.parse(..., **kwargs_item)`), so the row renders as the server rendered it
  (its "thinking" parser forces `enable_thinking=True` for templates registered with thinking on).
- Pre-tokenized JSON Lines, one `{"id", "input_ids", "loss_mask"}` object per line (plain JSON
  integers, `loss_mask` 0/1): the rows exactly as tokenized.arrow holds them. Both trainers read this
  with their own data preparation and pass the rows through untouched (no chat template, no
  re-tokenization):
  * SpecForge 0.2.0: `data.prompts_path` (or `data.train_data_path`) of an online run;
    `specforge.data.prompt_builder.prepare_prompt_tasks` sees `input_ids` + `loss_mask` in the first
    record and takes every line as a pre-tokenized prompt task (truncated to `data.max_length`,
    rows with fewer supervised tokens than the algorithm's minimum dropped).
  * speculators 0.9.0: `speculators prepare-data --data FILE.jsonl` (the function
    `speculators.data_generation.preprocessing.load_and_preprocess_dataset`), whose
    `load_raw_dataset` reads a `.jsonl` path with `datasets.load_dataset("json")` and whose
    `_passthrough_pretokenized` keeps the rows as "speculator-format" rows (clipped to
    `--seq-length`, rows with no supervised token dropped, order shuffled by `--seed`).
  Neither reads an Arrow stream or a `save_to_disk` folder (speculators globs a folder for
  `*.json`/`*.jsonl`, which in a save_to_disk folder are its metadata files).
- Pre-tokenized for other HF-datasets trainers: `datasets.Dataset.save_to_disk` of
  tokenized.arrow, columns id, input_ids, loss_mask (as budgetgen wrote them) plus attention_mask;
  `datasets.load_from_disk(folder)` reads it back.
All appear atomically (written under a temporary name, then renamed).
"""

from __future__ import annotations

import json
import os
import shutil

import numpy as np

from budgetgen.errors import UserError
from budgetgen.fsutil import atomic_output
from budgetgen.raw_records import record_cell, record_split
from budgetgen.turn_format import record_kwargs


def to_specforge(raw_path: str | os.PathLike, out_path: str | os.PathLike, split: str = "train") -> int:
    """raw_responses.jsonl -> SpecForge conversations JSONL of the records of `split` (a record without
    one is train); returns the record count."""
    n = 0
    try:
        src = open(raw_path, "rb")
    except FileNotFoundError:
        raise UserError(f"{raw_path}: no such file") from None
    with src, atomic_output(out_path, "w") as out:
        for lineno, line in enumerate(src, 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
                turns = [{k: m[k] for k in ("role", "content", "reasoning_content") if k in m}
                         for m in rec["messages"]]
            except (ValueError, KeyError, TypeError) as exc:
                raise UserError(f"{raw_path}:{lineno}: not a budgetgen response record ({exc})") from None
            if record_split(rec) != split:
                continue
            row = {"id": rec["id"], "conversations": turns, "cell": record_cell(rec), **record_kwargs(rec, {})}
            out.write(json.dumps(row, ensure_ascii=False) + "\n")
            n += 1
    return n


def to_hf_dataset(tokenized_path: str | os.PathLike, out_dir: str | os.PathLike) -> int:
    """tokenized.arrow -> a save_to_disk folder with attention_mask added; returns the row count."""
    from datasets import Dataset

    if not os.path.isfile(tokenized_path):
        raise UserError(f"{tokenized_path}: no such file")
    ds = Dataset.from_file(os.fspath(tokenized_path))
    # in memory: a map's cache file would land beside tokenized.arrow (results/D/cache-*.arrow, ~1.2x its size)
    ds = ds.map(lambda row: {"attention_mask": [1] * len(row["input_ids"])}, desc=None, keep_in_memory=True)
    tmp = f"{out_dir}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    ds.save_to_disk(tmp)
    shutil.rmtree(out_dir, ignore_errors=True)  # a previous export: replaced whole
    os.replace(tmp, out_dir)
    return ds.num_rows


PRETOKENIZED_FIELDS = ("id", "input_ids", "loss_mask")  # and `cell`, where the rows have it


def to_pretokenized_jsonl(tokenized_path: str | os.PathLike, out_path: str | os.PathLike) -> int:
    """tokenized.arrow -> pre-tokenized JSON Lines (`id`, `input_ids`, `loss_mask`); returns the row
    count. Streams one record batch at a time (memory: one batch, never the dataset), writes under a
    temporary name and renames it into place when whole."""
    import pyarrow as pa

    tokenized_path = os.fspath(tokenized_path)
    if not os.path.isfile(tokenized_path):
        raise UserError(f"{tokenized_path}: no such file")
    dumps = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode
    n = 0
    with pa.memory_map(tokenized_path, "r") as source, atomic_output(out_path, "w") as out:
        try:
            reader = pa.ipc.open_stream(source)
        except pa.ArrowInvalid as exc:
            raise UserError(f"{tokenized_path}: not an Arrow IPC stream ({exc})") from None
        missing = [f for f in PRETOKENIZED_FIELDS if f not in reader.schema.names]
        if missing:
            raise UserError(f"{tokenized_path}: not a budgetgen tokenized file (no column {', '.join(missing)})")
        for batch in reader:
            ids = batch.column("id").to_pylist()
            cells = batch.column("cell").to_pylist() if "cell" in batch.schema.names else None
            tok_off, tok_val = _list_parts(batch.column("input_ids"), tokenized_path)
            mask_off, mask_val = _list_parts(batch.column("loss_mask"), tokenized_path)
            lines = []
            for i, row_id in enumerate(ids):
                input_ids = tok_val[tok_off[i]:tok_off[i + 1]].tolist()
                loss_mask = mask_val[mask_off[i]:mask_off[i + 1]].tolist()
                if len(input_ids) != len(loss_mask):
                    raise UserError(f"{tokenized_path}: row {n + i} (id {row_id!r}): {len(input_ids)} input_ids "
                                    f"but {len(loss_mask)} loss_mask values")
                row = {"id": row_id, "input_ids": input_ids, "loss_mask": loss_mask}
                if cells is not None:
                    row["cell"] = cells[i]
                lines.append(dumps(row))
            if lines:
                out.write("\n".join(lines) + "\n")
            n += len(ids)
    return n


def _list_parts(col, where):
    """(offsets, values) numpy views of a list column, values widened to int64 so `tolist()` gives
    plain Python ints (JSON integers). Offsets index into values as stored, so a sliced array works."""
    if col.null_count:
        raise UserError(f"{where}: a row has a null token list")
    return col.offsets.to_numpy(), col.values.to_numpy(zero_copy_only=False).astype(np.int64, copy=False)
