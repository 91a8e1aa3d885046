"""Prompt sets from Hugging Face `datasets` sources (Parquet, Arrow, JSON Lines, CSV, save_to_disk
folders), converted once into a prompts.jsonl the rest of the workflow reads.

A column mapping renames source columns to the fields budgetgen reads (see budgetgen.prompts):
`{"messages": "conversation", "id": "uid"}` reads the chat from column "conversation" and the id from
"uid". Columns not named in the mapping keep their names; when the mapping names one prompt field
(messages, conversations, prompt, instruction), the other prompt fields are dropped, so an unmapped
column that happens to be called "messages" cannot win over the one the user chose.

Text: Arrow strings are UTF-8, so a row cannot hold the lone surrogates a prompts.jsonl line can
(budgetgen.prompts); a JSON Lines source with such an escape fails to load, naming the parser's
reason. A Parquet or Arrow file written by other tools may still hold bytes that are not UTF-8
in a string column: that row stops the import, naming its row and column, under either
on_bad_line (it cannot be carried into prompts.jsonl to be skipped there).
"""

from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING

from budgetgen import prompts
from budgetgen.errors import UserError
from budgetgen.fsutil import atomic_output

if TYPE_CHECKING:
    from collections.abc import Collection, Mapping
    from typing import Any

    from datasets import Dataset

FIELDS = ("id", "messages", "conversations", "prompt", "instruction", "input", "system")
FORMATS = ("parquet", "arrow", "json", "csv", "disk")
_BY_EXTENSION = {".parquet": "parquet", ".arrow": "arrow", ".jsonl": "json", ".json": "json", ".csv": "csv"}


def detect_format(path: str | os.PathLike) -> str:
    """The `datasets` builder for path: by extension, or "disk" for a save_to_disk folder."""
    if os.path.isdir(path):
        if os.path.exists(os.path.join(path, "dataset_info.json")) or os.path.exists(
                os.path.join(path, "dataset_dict.json")):
            return "disk"
        raise UserError(f"{path}: a folder that is not a datasets save_to_disk folder; "
                        "point source.path at a data file or give source.format")
    ext = os.path.splitext(path)[1].lower()
    if ext not in _BY_EXTENSION:
        raise UserError(f"{path}: cannot tell the format from the extension; set source.format "
                        f"(one of {', '.join(FORMATS)})")
    return _BY_EXTENSION[ext]


def load_source(path: str | os.PathLike, fmt: str | None = None, split: str = "train") -> Dataset:
    """A `datasets.Dataset` for the source (local files only)."""
    path = os.fspath(path)
    if not os.path.exists(path):
        raise UserError(f"{path}: source not found")
    fmt = fmt or detect_format(path)
    if fmt not in FORMATS:
        raise UserError(f"source.format {fmt!r}: must be one of {', '.join(FORMATS)}")
    import datasets

    datasets.disable_progress_bars()
    try:
        if fmt == "disk":
            ds = datasets.load_from_disk(path)
        else:
            files = path
            if os.path.isdir(path):
                ext = {v: k for k, v in _BY_EXTENSION.items()}[fmt]
                files = sorted(os.path.join(path, n) for n in os.listdir(path) if n.endswith(ext))
            ds = datasets.load_dataset(fmt, data_files=files, split=split)
    except UserError:
        raise
    except Exception as exc:  # datasets raises many kinds; the first line says what went wrong
        raise UserError(f"{path}: cannot load as {fmt}: {_first_line(exc)}") from None
    if isinstance(ds, datasets.DatasetDict):
        if split not in ds:
            raise UserError(f"{path}: no split {split!r} (has {', '.join(ds)})")
        ds = ds[split]
    return ds


def _first_line(exc):
    """exc's first line, and its cause's: datasets wraps the parser's reason (e.g. "JSON parse
    error: ...") in a generic "An error occurred while generating the dataset"."""
    first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    cause = exc.__cause__
    if cause is not None:
        first += f" ({(str(cause).strip().splitlines() or [type(cause).__name__])[0]})"
    return first


def _rows(ds, path):
    """ds's rows as dicts; a row with a string that is not UTF-8 is a UserError naming it."""
    it, n = iter(ds), 0
    while True:
        try:
            row = next(it)
        except StopIteration:
            return
        except UnicodeDecodeError:  # the iterator decodes ahead: find the row from n on
            raise UserError(_undecodable(ds, n, path)) from None
        n += 1
        yield row


def _undecodable(ds, start, path):
    for i in range(start, len(ds)):
        for column in ds.column_names:
            try:
                ds.select_columns([column])[i]
            except UnicodeDecodeError as exc:
                return f"{path}: row {i + 1}: not valid UTF-8 (bad byte at offset {exc.start}) in column {column!r}"
    return f"{path}: row {start + 1}: not valid UTF-8"


def check_columns(columns: Mapping[str, str], available: Collection[str], path: str | os.PathLike) -> None:
    unknown = sorted(set(columns) - set(FIELDS))
    if unknown:
        raise UserError(f"source.columns: unknown field {unknown[0]!r} (fields: {', '.join(FIELDS)})")
    missing = sorted(c for c in columns.values() if c not in available)
    if missing:
        raise UserError(f"{path}: no column {missing[0]!r} (columns: {', '.join(available)})")


def map_row(row: Mapping[str, Any], columns: Mapping[str, str]) -> dict[str, Any]:
    """row with the mapped columns renamed to budgetgen's fields (see the module docstring)."""
    out = dict(row)
    for name in columns.values():
        out.pop(name, None)
    if any(f in columns for f in prompts.PROMPT_FIELDS):
        for f in prompts.PROMPT_FIELDS:
            if f not in columns:
                out.pop(f, None)
    for field, name in columns.items():
        out[field] = row[name]
    return out


def import_prompts(source: str | os.PathLike, output: str | os.PathLike, fmt: str | None = None, split: str = "train",
                   columns: Mapping[str, str] | None = None, validate: bool = True) -> int:
    """Write the source's rows, mapped, as prompts.jsonl (atomically); return the row count.

    validate: check every row as a prompt now, so a bad one is named by its source row.
    """
    columns = dict(columns or {})
    ds = load_source(source, fmt, split)
    check_columns(columns, ds.column_names, source)
    n = 0
    with atomic_output(output, "w") as f:
        for n, row in enumerate(_rows(ds, source), 1):
            record = map_row(row, columns)
            if validate:
                prompts.normalise_record(record, f"{source}: row {n}")
            f.write(json.dumps(record, ensure_ascii=False, default=str) + "\n")
    if not n:
        raise UserError(f"{source}: the dataset has no rows")
    return n
