"""Append-only JSON Lines files: the response journal (the resumable state of one dataset's
generation) and the permanent-error log `errors.jsonl`.

Format: JSON Lines, one whole record per line, `"id"` the first key, `"identity"` (the sha of the
settings it was made under, budgetgen.identity) the second and `"usage"` the last, so a scan can read
the id and identity from the head of a line and the token count from its tail without parsing the
(possibly megabytes of) content in between. A crash can only leave a torn *last* line (no
trailing newline); `repair_tail` truncates it. A line that is whole but unparseable is corruption
from outside and is an error naming file:line, never silently dropped.

One machinery for every append-only file. Both `results/D/journal.jsonl` and
`results/D/errors.jsonl` are written only through `JournalWriter` (`append_error` is a
JournalWriter too), read through `whole_lines` (one tolerance policy: a torn tail skipped, a bad
line elsewhere `FILE:LINE: reason`) by `scan`/`iter_records`/`records_by_id`/`errors_by_identity` (and
budgetgen.journal_follow's JournalFollower, which watch reads a live journal with), and
repaired with `repair_tail` (`scan(path,
repair=True)`), all by the inference job while it holds the journal's lock (`JournalLock` of
`journal.jsonl`, which covers `errors.jsonl` as well: one lock, one writer per dataset). A writer
never appends behind a torn line: opening a `JournalWriter` cuts a torn tail first (a kill during
the append of a large record leaves one), so the next record can never be glued onto it, whether
or not the caller scanned the file with repair=True before.

Blamed responses: a response the breaker blames on the server (budgetgen.breaker) stays in the journal as
evidence; a line in the journal's blame file (`journal.blamed.jsonl` beside `journal.jsonl`:
blamed_path, append-only, written with append_error under the journal's lock) names it by its id and
`created`, and every reader (scan, iter_records, records_by_id, JournalFollower) skips it: it counts
nowhere, its id is not done, and the response asked again in its place is the one that counts.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from .errors import UserError
from .identity import IdentityCount, record_settings, record_sha
from .journal_write import (
    JournalLock,
    JournalWriter,
    append_error,
    encode_record,
    repair_tail,
    response_record,
)
from .quality import KEPT, record_flags

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Iterator
    from typing import Any

    from .quality import Fate, Gate

__all__ = ["JournalLock", "JournalWriter", "append_error", "encode_record", "repair_tail", "response_record",
           "whole_lines", "parse_line_fast", "parse_line", "line_flags", "scan", "iter_records", "records_by_id",
           "errors_by_identity", "blamed_path", "blamed_keys", "JournalState", "LaneCount"]

_ID_HEAD = re.compile(r'^\{"id": ?"((?:[^"\\]|\\.)*)"(?:, ?"identity": ?"([0-9a-f]+)")?')
_TOKENS_TAIL = re.compile(r'"completion_tokens": ?(\d+)')
_PROMPT_TAIL = re.compile(r'"prompt_tokens": ?(\d+)')
_FLAGS_TAIL = re.compile(r'"flags": ?\[([^\]]*)\], ?"usage":')
_FLAG_WORD = re.compile(r'"([a-z_]+)"')


@dataclass
class LaneCount:
    """The counted records of one lane (a mixture cell in one split, budgetgen.mixture): `tokens` the
    kept ones' (budgetgen.quality: what the budget counts), `generated_tokens` all of them, `dropped`
    {reason: records} of those the gate drops."""

    records: int = 0
    tokens: int = 0
    lengths: list = field(default_factory=list)  # completion_tokens per record, in journal order
    kept: list = field(default_factory=list)  # whether each of `lengths` is kept (a row), in journal order
    generated_tokens: int = 0
    dropped: dict = field(default_factory=dict)

    def add(self, tokens: int, fate: Fate) -> None:
        count_record(self, tokens, fate)


def count_record(counts: LaneCount | JournalState, tokens: int, fate: Fate) -> None:
    """One counted record of `tokens` completion tokens with its `fate` (budgetgen.quality) added to a
    lane's or the whole journal's counts (the same fields in both)."""
    counts.records += 1
    counts.generated_tokens += tokens
    counts.lengths.append(tokens)
    counts.kept.append(fate.kept)
    if fate.kept:
        counts.tokens += tokens
    else:
        counts.dropped[fate.reason] = counts.dropped.get(fate.reason, 0) + 1


@dataclass
class JournalState:
    """What a scan of the journal knows: the ids done and the tokens they count toward the budget,
    of the identities that count (`scan(accepts=)`); every identity's records in `by_identity`."""

    path: str
    ids: set = field(default_factory=set)
    tokens: int = 0  # kept by the quality gate (scan(gate_of=)): what the budget counts
    records: int = 0
    duplicates: int = 0
    lengths: list = field(default_factory=list)  # completion_tokens per record, in journal order
    kept: list = field(default_factory=list)  # whether each of `lengths` is kept (budgetgen.quality)
    generated_tokens: int = 0  # every counted record's, kept or dropped
    dropped: dict = field(default_factory=dict)  # reason -> counted records the gate drops
    prompt_tokens: int = 0  # usage.prompt_tokens of the counted records (the storage forecast)
    repaired_bytes: int = 0
    blamed: int = 0  # responses blamed on the server (blamed_path), skipped
    by_identity: dict = field(default_factory=dict)  # identity sha -> IdentityCount, counted or not
    lanes: dict = field(default_factory=dict)  # lane key -> LaneCount (scan(lane_of=)), counted records only
    id_lane: dict = field(default_factory=dict)  # counted id -> its lane key (scan(lane_of=))


def blamed_path(path: str | os.PathLike) -> str:
    """The blame file of a journal: `journal.blamed.jsonl` beside `journal.jsonl` (see the module docstring)."""
    base, ext = os.path.splitext(os.fspath(path))
    return f"{base}.blamed{ext}"


def blamed_keys(path: str | os.PathLike) -> dict[str, set]:
    """{id: {created, ...}} of the responses of the journal at `path` blamed on the server."""
    found, where = {}, blamed_path(path)
    for lineno, line in whole_lines(where):
        rid, _, rec = parse_line(line, f"{where}:{lineno}")
        found.setdefault(rid, set()).add(rec.get("created"))
    return found


def is_blamed(blamed: dict[str, set], rid: str, rec: dict[str, Any]) -> bool:
    return rid in blamed and rec.get("created") in blamed[rid]


def decode_line(raw: bytes, path: str | os.PathLike, lineno: int) -> str:
    """A whole line's text; a line that is not UTF-8 is corruption from outside: `FILE:LINE: reason`."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UserError(f"{path}:{lineno}: corrupt journal record (not UTF-8 at byte {exc.start})") from None


def whole_lines(path: str | os.PathLike, strict_tail: bool = False) -> Iterator[tuple[int, str]]:
    """The one reader of every append-only file: yield (lineno, line) for each whole, non-blank line.

    A torn tail (a last line without its newline: a crash mid-append) is not a record: it is skipped
    (the writer cuts it when it opens the file), or, with strict_tail (the caller holds the lock and has
    just repaired the file), an error, since it can only come from another writer. A whole line that
    is not UTF-8 is corruption from outside: `FILE:LINE: reason`, never dropped silently."""
    try:
        f = open(path, "rb")
    except FileNotFoundError:
        return
    with f:
        for lineno, raw in enumerate(f, 1):
            if not raw.endswith(b"\n"):
                if strict_tail:
                    raise UserError(f"{path}:{lineno}: journal changed while being read")
                return
            line = decode_line(raw, path, lineno)
            if line.strip():
                yield lineno, line


def parse_line_fast(line: str) -> tuple[str, str | None, int] | None:
    """Return (id, identity sha or None, completion_tokens) from one journal line, or None if it is not in
    our layout."""
    head = _ID_HEAD.match(line)
    if not head:
        return None
    k = line.rfind('"usage":')
    if k < 0:
        return None
    tail = _TOKENS_TAIL.search(line, k)
    if not tail:
        return None
    rid = head.group(1)
    if "\\" in rid:
        rid = json.loads('"' + rid + '"')
    return rid, head.group(2), int(tail.group(1))


def parse_line(line: str, where: str) -> tuple[str, int, dict[str, Any]]:
    """Full parse of one line: (id, completion_tokens, record)."""
    try:
        rec = json.loads(line)
    except json.JSONDecodeError as exc:
        raise UserError(f"{where}: corrupt journal record ({exc.msg} at column {exc.colno})") from None
    if not isinstance(rec, dict) or "id" not in rec:
        raise UserError(f"{where}: corrupt journal record (no id)")
    usage = rec.get("usage") if isinstance(rec.get("usage"), dict) else {}
    try:
        tokens = int(usage.get("completion_tokens") or 0)
    except (TypeError, ValueError):
        raise UserError(f"{where}: corrupt journal record (usage.completion_tokens is not a number)") from None
    return str(rec["id"]), tokens, rec


def line_flags(line: str, rec: dict[str, Any] | None, where: str) -> list[str]:
    """The quality facts of one journal line: its `flags` read from just before `usage` (no parse),
    else from its record (parsed here if `rec` is None: one journaled before flags, quality.record_flags)."""
    k = line.rfind('"usage":')
    got = _FLAGS_TAIL.search(line, max(0, k - 200), k + 8) if k >= 0 else None
    if got is not None:
        return _FLAG_WORD.findall(got.group(1))
    if rec is None:
        rec = parse_line(line, where)[2]
    return record_flags(rec)


def scan(path: str | os.PathLike, repair: bool = False, accepts: Callable[[str], bool] | None = None,
         lane_of: Callable[[str, str, str | None], str] | None = None,
         gate_of: Callable[[str, str | None], Gate] | None = None) -> JournalState:
    """Read a journal (or errors.jsonl) into a JournalState. With repair=True a torn tail is truncated
    first. `accepts(sha)`: whether records of an identity count (budgetgen.identity.Policy.accepts; all
    by default; a record without an identity is refused, budgetgen.migration); `lane_of(sha, id, cell
    named by the identity's records) -> key`: the lane a counted record belongs to
    (budgetgen.mixture.Mixture.lane_of), counted per lane in `lanes` and `id_lane`; `gate_of(sha, cell
    named)`: the quality gate of a counted record (Mixture.gate_of; none: every record kept), whose fate
    decides whether its tokens are kept (`tokens`, what the budget counts) or dropped (`dropped`), all
    of them in `generated_tokens`. Lines are parsed in full only where the head and tail do not say
    enough (a record without a stored identity; an identity's first record, for its settings; one
    journaled before flags, when a gate asks)."""
    state = JournalState(path=os.fspath(path))
    if repair:
        state.repaired_bytes = repair_tail(path)
        repair_tail(blamed_path(path))
    blamed = blamed_keys(path)
    for lineno, line in whole_lines(path, strict_tail=repair):
        got = parse_line_fast(line)
        rid = sha = settings = rec = None
        if got is not None:
            rid, sha, tokens = got
        if sha is None or sha not in state.by_identity or rid in blamed:
            rid, tokens, rec = parse_line(line, f"{path}:{lineno}")
            sha, settings = record_sha(rec, f"{path}:{lineno}"), record_settings(rec)
            if is_blamed(blamed, rid, rec):
                state.blamed += 1
                continue
        count = state.by_identity.get(sha)
        if count is None:
            cell = rec.get("cell")
            count = state.by_identity[sha] = IdentityCount(settings=settings,
                                                           cell=cell if isinstance(cell, str) else None)
        count.records += 1
        count.tokens += tokens
        if accepts is not None and not accepts(sha):
            continue
        if rid in state.ids:
            state.duplicates += 1  # keep the first; never count a response twice
            continue
        state.ids.add(rid)
        fate = KEPT
        if gate_of is not None:
            gate = gate_of(sha, count.cell)
            if not gate.passes_all:
                fate = gate.fate(line_flags(line, rec, f"{path}:{lineno}"), tokens)
        count_record(state, tokens, fate)
        prompt = _PROMPT_TAIL.search(line, max(0, line.rfind('"usage":')))
        state.prompt_tokens += int(prompt.group(1)) if prompt else 0
        if lane_of is not None:
            key = state.id_lane[rid] = lane_of(sha, rid, count.cell)
            lane = state.lanes.get(key)
            if lane is None:
                lane = state.lanes[key] = LaneCount()
            lane.add(tokens, fate)
    return state


def iter_records(path: str | os.PathLike,
                 accepts: Callable[[str], bool] | None = None) -> Iterator[tuple[int, dict[str, Any]]]:
    """Yield (lineno, record) for every whole line, parsed; the first occurrence of an id only, of the
    identities `accepts` takes (all by default; see scan)."""
    seen, blamed = set(), blamed_keys(path)
    for lineno, line in whole_lines(path):
        rid, _, rec = parse_line(line, f"{path}:{lineno}")
        if rid in seen or is_blamed(blamed, rid, rec) or (
                accepts is not None and not accepts(record_sha(rec, f"{path}:{lineno}"))):
            continue
        seen.add(rid)
        yield lineno, rec


def records_by_id(path: str | os.PathLike, ids: Iterable[str],
                  accepts: Callable[[str], bool] | None = None) -> dict[str, dict[str, Any]]:
    """{id: record} of the first whole record of each of `ids` among the identities `accepts` takes
    (only those lines are parsed in full): the turns a resumed conversation continues from."""
    wanted, found = set(ids), {}
    if not wanted:
        return found
    blamed = blamed_keys(path)
    for lineno, line in whole_lines(path):
        got = parse_line_fast(line)
        if got is not None and (got[0] not in wanted or got[0] in found):
            continue
        rid, _, rec = parse_line(line, f"{path}:{lineno}")
        if rid in wanted and rid not in found and not is_blamed(blamed, rid, rec) and (
                accepts is None or accepts(record_sha(rec, f"{path}:{lineno}"))):
            found[rid] = rec
            if len(found) == len(wanted):
                break
    return found


def errors_by_identity(errors_path: str | os.PathLike) -> dict[str, set[str]]:
    """{identity sha: ids} of the permanent errors in errors.jsonl, every record read (one id may have
    failed under several settings). An error holds only under the identity that produced it."""
    found = {}
    for lineno, line in whole_lines(errors_path):
        rid, _, rec = parse_line(line, f"{errors_path}:{lineno}")
        found.setdefault(record_sha(rec, f"{errors_path}:{lineno}"), set()).add(rid)
    return found
