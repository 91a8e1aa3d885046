"""A journal followed while a run appends to it (budgetgen.watch): JournalFollower reads only what was
appended since its last refresh, read-only and without the lock, with every reader's rules
(budgetgen.journal: whole lines, the stored identity, the quality gate's fate, blamed responses skipped).
"""

from __future__ import annotations

import os
from collections import deque
from dataclasses import dataclass, field

from .errors import UserError
from .identity import IdentityCount, record_settings, record_sha
from .journal import blamed_keys, blamed_path, decode_line, is_blamed, parse_line
from .quality import KEPT, record_flags


def _size(path: str) -> int:
    try:
        return os.stat(path).st_size
    except FileNotFoundError:
        return 0


@dataclass
class JournalFollower:
    """One journal read incrementally, read only (no lock, no writes: beside a run that appends to it).

    Each refresh() reads only the bytes appended since the last one, up to the last whole line (a torn
    tail is read once it is whole), and starts over when the file was replaced or shrank. Lines are
    decoded and parsed as every reader does (decode_line, parse_line, the identity a record stores);
    the first bad one stops the following and is kept as its one line in `problem`. Counts as scan():
    every identity's records in `by_identity`, the ids, tokens (kept by `gate_of`'s gate: scan) and
    records of those `accepts` takes (first of an id), and (completed at, tokens, kept tokens) of those
    in `recent` for rates."""

    path: str
    accepts: object = None  # identity.Policy.accepts
    gate_of: object = None  # mixture.Mixture.gate_of (None: every record kept)
    offset: int = 0
    inode: int | None = None
    tokens: int = 0  # kept (budgetgen.quality)
    generated_tokens: int = 0
    prompt_tokens: int = 0  # usage.prompt_tokens of the counted records (the storage forecast)
    dropped: dict = field(default_factory=dict)  # reason -> records the gate drops
    records: int = 0
    ids: set = field(default_factory=set)
    by_identity: dict = field(default_factory=dict)
    recent: deque = field(default_factory=deque)  # (completed at, tokens) of the counted records
    problem: str | None = None  # a whole line that does not parse: FILE:LINE: reason
    lineno: int = 0
    blamed: dict = field(default_factory=dict)  # blamed_keys, read anew when the blame file grows
    blamed_size: int = 0

    def reset(self) -> None:
        self.offset, self.tokens, self.records, self.lineno, self.problem = 0, 0, 0, 0, None
        self.generated_tokens, self.prompt_tokens, self.dropped = 0, 0, {}
        self.ids, self.by_identity, self.recent = set(), {}, deque()

    def refresh(self) -> JournalFollower:
        """Read what was appended since the last refresh; returns self."""
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            self.reset()
            self.inode = None
            return self
        blamed_size = _size(blamed_path(self.path))
        if st.st_ino != self.inode or st.st_size < self.offset or blamed_size != self.blamed_size:
            self.reset()  # replaced or cut, or responses counted were blamed since: read it anew
            self.inode, self.blamed_size = st.st_ino, blamed_size
            self.blamed = blamed_keys(self.path) if blamed_size else {}
        if st.st_size == self.offset or self.problem:
            return self
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read(st.st_size - self.offset)
        except FileNotFoundError:
            return self
        whole = data[: data.rfind(b"\n") + 1]  # a torn tail waits until it is whole
        for raw in whole.splitlines():
            self.lineno += 1
            if raw.strip():
                try:
                    self._count(decode_line(raw, self.path, self.lineno))
                except UserError as exc:
                    self.problem = str(exc)
                    break
        self.offset += len(whole)
        return self

    def _count(self, line):
        where = f"{self.path}:{self.lineno}"
        rid, tokens, rec = parse_line(line, where)
        if is_blamed(self.blamed, rid, rec):
            return
        sha = record_sha(rec, where)
        count = self.by_identity.get(sha)
        if count is None:
            count = self.by_identity[sha] = IdentityCount(settings=record_settings(rec))
        count.records += 1
        count.tokens += tokens
        if (self.accepts is not None and not self.accepts(sha)) or rid in self.ids:
            return
        self.ids.add(rid)
        fate = KEPT
        if self.gate_of is not None:
            gate = self.gate_of(sha, rec.get("cell") if isinstance(rec.get("cell"), str) else None)
            if not gate.passes_all:
                fate = gate.fate(record_flags(rec), tokens)
        kept = tokens if fate.kept else 0
        if not fate.kept:
            self.dropped[fate.reason] = self.dropped.get(fate.reason, 0) + 1
        self.tokens += kept
        self.generated_tokens += tokens
        self.prompt_tokens += int((rec.get("usage") or {}).get("prompt_tokens") or 0)
        self.records += 1
        self.recent.append((float(rec.get("created") or 0) + float(rec.get("latency_s") or 0), tokens, kept))

    def rates(self, now: float, window_s: float = 60.0) -> tuple[float, float, float]:
        """(req/s, generated tok/s, kept tok/s) over the last window_s seconds of completions."""
        while self.recent and now - self.recent[0][0] > window_s:
            self.recent.popleft()
        if not self.recent:
            return 0.0, 0.0, 0.0
        span = max(1.0, min(window_s, now - min(r[0] for r in self.recent)))
        return (len(self.recent) / span, sum(r[1] for r in self.recent) / span,
                sum(r[2] for r in self.recent) / span)
