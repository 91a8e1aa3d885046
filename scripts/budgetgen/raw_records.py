"""The records of raw_responses.jsonl, read one way: each line validated as a response record
(parse_record: FILE:LINE on a bad one), their split and cell with the defaults of records that name
none (record_split, record_cell), and the file's lines in batches (line_batches).
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from budgetgen.errors import UserError
from budgetgen.identity import record_sha
from budgetgen.mixture import DEFAULT_CELL, TRAIN

if TYPE_CHECKING:
    import os
    from collections.abc import Iterator
    from typing import Any


def parse_record(line: bytes | str, lineno: int,
                 input_path: str | os.PathLike) -> tuple[str, dict[str, Any], str | None, str]:
    """One line of raw_responses.jsonl, validated: (id, record, finish_reason, identity sha); a line that
    is not a response record is one line naming FILE:LINE."""
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
    return str(rid), record, finish, record_sha(record, where)


def record_split(record: dict[str, Any]) -> str:
    """The split a raw_responses.jsonl record belongs to (finalize writes it; budgetgen.mixture)."""
    return record.get("split") or TRAIN


def record_cell(record: dict[str, Any]) -> str:
    """The mixture cell a record was made for (finalize writes it; budgetgen.mixture)."""
    return record.get("cell") if isinstance(record.get("cell"), str) and record.get("cell") else DEFAULT_CELL


def record_tokens(record: dict[str, Any]) -> int:
    """A record's usage.completion_tokens (parse_record checked the usage is there)."""
    return int((record.get("usage") or {}).get("completion_tokens") or 0)


def line_batches(input_path: str | os.PathLike, batch_size: int) -> Iterator[list[tuple[int, bytes]]]:
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
