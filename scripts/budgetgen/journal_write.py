"""Writing the append-only JSON Lines files (budgetgen.journal says the format and reads them): the
record a response becomes, its one line (`id` first, `identity` next, `usage` last), the lock that keeps
one writer per dataset, the writer that appends whole lines and cuts a torn tail before it appends,
and the repair of a torn tail.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import time
from typing import TYPE_CHECKING

from .errors import UserError
from .quality import budget_outcome, observe

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping
    from typing import Any

    from .identity import Identity
    from .streams import ChatResult


def repair_tail(path: str | os.PathLike) -> int:
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


def response_record(gen_id: str, messages: Iterable[dict[str, Any]], result: ChatResult, identity: Identity,
                    params: dict[str, Any], created: float, attempts: int,
                    where: Mapping[str, Any] | None = None,
                    reasoning_tags: tuple[str, str] | None = None, specials: tuple[str, ...] = ()) -> dict[str, Any]:
    """The journal record of one response (a streams.ChatResult) to `messages`: the id and the identity
    it was made under (budgetgen.identity: its sha right after the id, its readable settings), the
    conversation with the generated assistant turn appended, the request params, and its usage (last,
    see above). `where`: the conversation it belongs to ({"conversation_id", "turn", "sample"?}); its `flags`:
    what budgetgen.quality.observe sees in it (`reasoning_tags`, `specials`: the tags and the target's special
    tokens it looks for), journaled just before usage, where scan reads them."""
    assistant = {"role": "assistant", "content": result.content}
    if result.reasoning:
        assistant["reasoning_content"] = result.reasoning
    rec = {"id": gen_id, "identity": identity.sha, **(where or {}), "messages": list(messages) + [assistant],
           "finish_reason": result.finish_reason, "identity_settings": identity.settings, "params": params,
           "served_model": result.model, **({"endpoint": result.endpoint} if result.endpoint else {}),
           "created": round(created, 3), "latency_s": round(time.time() - created, 3), "attempts": attempts}
    if result.prompt_token_ids:
        rec["prompt_token_ids"] = result.prompt_token_ids
    if result.token_ids:
        rec["completion_token_ids"] = result.token_ids
    forced = budget_outcome(result.usage, params.get("thinking_budget"))[0]
    if params.get("thinking_budget") is not None:
        rec["reasoning_forced_end"] = forced
    rec["flags"] = observe(result.content, result.reasoning, result.finish_reason, forced, reasoning_tags,
                           specials)
    rec["usage"] = result.usage
    return rec


def encode_record(rec: Mapping[str, Any]) -> str:
    """One journal line. `id` first, `identity` next (when the record has one) and `usage` last (see the
    module docstring)."""
    ordered = {"id": rec["id"]}
    if "identity" in rec:
        ordered["identity"] = rec["identity"]
    ordered.update((k, v) for k, v in rec.items() if k not in ("id", "identity", "flags", "usage"))
    if "flags" in rec:
        ordered["flags"] = rec["flags"]
    ordered["usage"] = rec.get("usage") or {}
    return json.dumps(ordered, ensure_ascii=False) + "\n"


class JournalLock:
    """An exclusive lock so two inference processes can never append to one journal."""

    def __init__(self, journal_path):
        self.path = os.fspath(journal_path) + ".lock"
        self.fd = None

    def acquire(self) -> JournalLock:
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

    def release(self) -> None:
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

    def append(self, rec: Mapping[str, Any]) -> None:
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

    def sync(self) -> None:
        if self._dirty:
            try:
                os.fsync(self.fd)
            except OSError as exc:
                raise UserError(f"{self.path}: cannot sync journal ({os.strerror(exc.errno)})") from None
            self._dirty = False
        self._last_sync = time.monotonic()

    def close(self) -> None:
        if self.fd is not None:
            try:
                self.sync()
            finally:
                os.close(self.fd)
                self.fd = None


def append_error(path: str | os.PathLike, rec: Mapping[str, Any]) -> int:
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
