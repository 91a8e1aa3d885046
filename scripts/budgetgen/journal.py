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
line elsewhere `FILE:LINE: reason`) by `scan`/`iter_records`/`records_by_id`/`errors_by_identity`, and repaired with `repair_tail` (`scan(path,
repair=True)`), all by the inference job while it holds the journal's lock (`JournalLock` of
`journal.jsonl`, which covers `errors.jsonl` as well: one lock, one writer per dataset). A writer
never appends behind a torn line: opening a `JournalWriter` cuts a torn tail first (a kill during
the append of a large record leaves one), so the next record can never be glued onto it, whether
or not the caller scanned the file with repair=True before.
"""

import errno
import fcntl
import json
import os
import re
import time
from dataclasses import dataclass, field

from .errors import UserError

_ID_HEAD = re.compile(r'^\{"id": ?"((?:[^"\\]|\\.)*)"(?:, ?"identity": ?"([0-9a-f]+)")?')
_TOKENS_TAIL = re.compile(r'"completion_tokens": ?(\d+)')
_PROMPT_TAIL = re.compile(r'"prompt_tokens": ?(\d+)')


@dataclass
class IdentityCount:
    """The records of one generation identity (budgetgen.identity) in a journal, and its settings."""

    records: int = 0
    tokens: int = 0
    settings: dict | None = None
    cell: str | None = None  # the mixture cell its first record names (budgetgen.mixture)


@dataclass
class LaneCount:
    """The counted records of one lane (a mixture cell in one split, budgetgen.mixture)."""

    records: int = 0
    tokens: int = 0
    lengths: list = field(default_factory=list)  # completion_tokens per record, in journal order


@dataclass
class JournalState:
    """What a scan of the journal knows: the ids done and the tokens they count toward the budget,
    of the identities that count (`scan(accepts=)`); every identity's records in `by_identity`."""

    path: str
    ids: set = field(default_factory=set)
    tokens: int = 0
    records: int = 0
    duplicates: int = 0
    lengths: list = field(default_factory=list)  # completion_tokens per record, in journal order
    prompt_tokens: int = 0  # usage.prompt_tokens of the counted records (the storage forecast)
    repaired_bytes: int = 0
    by_identity: dict = field(default_factory=dict)  # identity sha -> IdentityCount, counted or not
    lanes: dict = field(default_factory=dict)  # lane key -> LaneCount (scan(lane_of=)), counted records only
    id_lane: dict = field(default_factory=dict)  # counted id -> its lane key (scan(lane_of=))


def repair_tail(path):
    """Truncate a torn last line (a record cut by a crash); return the number of bytes dropped."""
    try:
        f = open(path, "r+b")
    except FileNotFoundError:
        return 0
    with f:
        size = f.seek(0, os.SEEK_END)
        if size == 0:
            return 0
        f.seek(size - 1)
        if f.read(1) == b"\n":
            return 0
        # Walk back to the last newline in blocks; a torn record may be large.
        pos, block = size, 1 << 16
        keep = 0
        while pos > 0:
            start = max(0, pos - block)
            f.seek(start)
            chunk = f.read(pos - start)
            i = chunk.rfind(b"\n")
            if i >= 0:
                keep = start + i + 1
                break
            pos = start
        f.truncate(keep)
        f.flush()
        os.fsync(f.fileno())
        return size - keep


def whole_lines(path, strict_tail=False):
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
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise UserError(f"{path}:{lineno}: corrupt journal record (not UTF-8 at byte {exc.start})") from None
            if line.strip():
                yield lineno, line


def parse_line_fast(line):
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


def parse_line(line, where):
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


def scan(path, repair=False, accepts=None, lane_of=None):
    """Read a journal (or errors.jsonl) into a JournalState. With repair=True a torn tail is truncated
    first. `accepts(sha)`: whether records of an identity count (budgetgen.identity.Policy.accepts; all
    by default; a record without an identity is refused, budgetgen.migration); `lane_of(sha, id, cell named by the identity's records) -> key`: the lane a counted record
    belongs to (budgetgen.mixture.Mixture.lane_of), counted per lane in `lanes` and `id_lane`. Lines are parsed in full only where the head and tail do not say
    enough (a record without a stored identity; an identity's first record, for its settings)."""
    from .identity import record_settings, record_sha

    state = JournalState(path=os.fspath(path))
    if repair:
        state.repaired_bytes = repair_tail(path)
    for lineno, line in whole_lines(path, strict_tail=repair):
        got = parse_line_fast(line)
        rid = sha = settings = None
        if got is not None:
            rid, sha, tokens = got
        if sha is None or sha not in state.by_identity:
            rid, tokens, rec = parse_line(line, f"{path}:{lineno}")
            sha, settings = record_sha(rec, f"{path}:{lineno}"), record_settings(rec)
        count = state.by_identity.get(sha)
        if count is None:
            cell = rec.get("cell")
            count = state.by_identity[sha] = IdentityCount(settings=settings, cell=cell if isinstance(cell, str) else None)
        count.records += 1
        count.tokens += tokens
        if accepts is not None and not accepts(sha):
            continue
        if rid in state.ids:
            state.duplicates += 1  # keep the first; never count a response twice
            continue
        state.ids.add(rid)
        state.tokens += tokens
        state.records += 1
        state.lengths.append(tokens)
        prompt = _PROMPT_TAIL.search(line, max(0, line.rfind('"usage":')))
        state.prompt_tokens += int(prompt.group(1)) if prompt else 0
        if lane_of is not None:
            key = state.id_lane[rid] = lane_of(sha, rid, count.cell)
            lane = state.lanes.get(key)
            if lane is None:
                lane = state.lanes[key] = LaneCount()
            lane.records += 1
            lane.tokens += tokens
            lane.lengths.append(tokens)
    return state


def iter_records(path, accepts=None):
    """Yield (lineno, record) for every whole line, parsed; the first occurrence of an id only, of the
    identities `accepts` takes (all by default; see scan)."""
    from .identity import record_sha

    seen = set()
    for lineno, line in whole_lines(path):
        rid, _, rec = parse_line(line, f"{path}:{lineno}")
        if rid in seen or (accepts is not None and not accepts(record_sha(rec, f"{path}:{lineno}"))):
            continue
        seen.add(rid)
        yield lineno, rec


def records_by_id(path, ids, accepts=None):
    """{id: record} of the first whole record of each of `ids` among the identities `accepts` takes
    (only those lines are parsed in full): the turns a resumed conversation continues from."""
    from .identity import record_sha

    wanted, found = set(ids), {}
    if not wanted:
        return found
    for lineno, line in whole_lines(path):
        got = parse_line_fast(line)
        if got is not None and (got[0] not in wanted or got[0] in found):
            continue
        rid, _, rec = parse_line(line, f"{path}:{lineno}")
        if rid in wanted and rid not in found and (accepts is None or accepts(record_sha(rec, f"{path}:{lineno}"))):
            found[rid] = rec
            if len(found) == len(wanted):
                break
    return found


def errors_by_identity(errors_path):
    """{identity sha: ids} of the permanent errors in errors.jsonl, every record read (one id may have
    failed under several settings). An error holds only under the identity that produced it."""
    from .identity import record_sha

    found = {}
    for lineno, line in whole_lines(errors_path):
        rid, _, rec = parse_line(line, f"{errors_path}:{lineno}")
        found.setdefault(record_sha(rec, f"{errors_path}:{lineno}"), set()).add(rid)
    return found


def response_record(gen_id, messages, result, identity, params, created, attempts, where=None):
    """The journal record of one response (a client.ChatResult) to `messages`: the id and the identity
    it was made under (budgetgen.identity: its sha right after the id, its readable settings), the
    conversation with the generated assistant turn appended, the request params, and its usage (last,
    see above). `where`: the conversation it belongs to ({"conversation_id", "turn", "sample"?})."""
    assistant = {"role": "assistant", "content": result.content}
    if result.reasoning:
        assistant["reasoning_content"] = result.reasoning
    rec = {"id": gen_id, "identity": identity.sha, **(where or {}), "messages": list(messages) + [assistant],
           "finish_reason": result.finish_reason, "identity_settings": identity.settings, "params": params,
           "served_model": result.model,
           "created": round(created, 3), "latency_s": round(time.time() - created, 3), "attempts": attempts}
    if result.prompt_token_ids:
        rec["prompt_token_ids"] = result.prompt_token_ids
    if result.token_ids:
        rec["completion_token_ids"] = result.token_ids
    rec["usage"] = result.usage
    return rec


def encode_record(rec):
    """One journal line. `id` first, `identity` next (when the record has one) and `usage` last (see the
    module docstring)."""
    ordered = {"id": rec["id"]}
    if "identity" in rec:
        ordered["identity"] = rec["identity"]
    ordered.update((k, v) for k, v in rec.items() if k not in ("id", "identity", "usage"))
    ordered["usage"] = rec.get("usage") or {}
    return json.dumps(ordered, ensure_ascii=False) + "\n"


class JournalLock:
    """An exclusive lock so two inference processes can never append to one journal."""

    def __init__(self, journal_path):
        self.path = os.fspath(journal_path) + ".lock"
        self.fd = None

    def acquire(self):
        os.makedirs(os.path.dirname(self.path) or ".", exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise UserError(
                    f"{self.path}: another inference process (pid {holder}) is writing this journal"
                ) from None
            raise
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        except OSError as exc:  # a full disk: one line, not a traceback
            os.close(fd)
            raise UserError(f"{self.path}: cannot write the lock file ({os.strerror(exc.errno)})") from None
        self.fd = fd
        return self

    def release(self):
        if self.fd is not None:
            fcntl.flock(self.fd, fcntl.LOCK_UN)
            os.close(self.fd)
            self.fd = None

    def __enter__(self):
        return self.acquire()

    def __exit__(self, *exc):
        self.release()


class JournalWriter:
    """Appends whole records: one write() of one line, flushed at once, fsynced every few seconds.

    The file is opened O_APPEND so each record lands at the end even across processes, and
    written with a single os.write of the encoded line: a crash leaves a record whole or torn at
    the tail, never interleaved. Opening cuts a torn tail first (`repaired_bytes` says how many
    bytes), so every record this writer appends starts a line of its own. The caller holds the
    journal's lock (see the module docstring).
    """

    def __init__(self, path, fsync_interval_s=2.0):
        self.path = os.fspath(path)
        os.makedirs(os.path.dirname(self.path) or ".", exist_ok=True)
        try:
            self.repaired_bytes = repair_tail(self.path)
        except OSError as exc:
            raise UserError(f"{self.path}: cannot repair the torn tail ({os.strerror(exc.errno)})") from None
        self.fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self.fsync_interval_s = fsync_interval_s
        self._last_sync = time.monotonic()
        self._dirty = False

    def append(self, rec):
        data = encode_record(rec).encode("utf-8")
        try:
            n = os.write(self.fd, data)
            if n != len(data):  # short write (disk full): undo the partial tail now
                raise OSError(errno.ENOSPC, "short write")
        except OSError as exc:
            try:  # a short write left a torn tail: cut it now, so the file ends on a whole record
                repair_tail(self.path)
            except OSError:
                pass
            raise UserError(f"{self.path}: cannot append to journal ({os.strerror(exc.errno)})") from None
        self._dirty = True
        if time.monotonic() - self._last_sync >= self.fsync_interval_s:
            self.sync()

    def sync(self):
        if self._dirty:
            try:
                os.fsync(self.fd)
            except OSError as exc:
                raise UserError(f"{self.path}: cannot sync journal ({os.strerror(exc.errno)})") from None
            self._dirty = False
        self._last_sync = time.monotonic()

    def close(self):
        if self.fd is not None:
            try:
                self.sync()
            finally:
                os.close(self.fd)
                self.fd = None


def append_error(path, rec):
    """Append one permanent error (non-transient 4xx) to errors.jsonl: the journal's machinery.

    A JournalWriter: a torn tail (a kill during an earlier append) is cut before the record is
    written, the record is one whole line, fsynced before this returns. Called under the journal's
    lock; return the number of torn bytes dropped (0 almost always).
    """
    w = JournalWriter(path)
    try:
        w.append(rec)
    finally:
        w.close()
    return w.repaired_bytes
