"""The prompts files checked when the Snakefile is parsed (issue 29), so `snakemake -n` on a login node
refuses a broken or empty prompts file, naming file:line, instead of the job doing so after queueing.

The verdict is the inference job's own (budgetgen.prompts.load_prompts), reached by its own functions:

- on_bad_line error: the first line load_prompts would refuse, with its reason: not UTF-8, malformed
  JSON, no usable prompt (prompts._normalise), a bad id (prompts._record_id), an id repeated with other
  messages (prompts.duplicate_reason); a file with no prompt at all;
- on_bad_line skip: a refusal only when no line holds a prompt (the first good line settles it).

Each line goes through the job's _parse_line, or a fast path that reaches the same decision with the
same functions: the line decoded as UTF-8, then the JSON decoder's own scanner (json.loads less its
Python wrapper) and, where that consumed the whole line, prompts._normalise and prompts._record_id on
the object; whatever the fast path does not accept in full goes to _parse_line, whose reason is the
one reported. The one difference: lines without an id get the job's content hash as their id
(prompts.stable_id) only when some line's own id looks like one (p + 20 hex digits); otherwise two
different id-less prompts could collide only through an 80-bit hash collision, which the job refuses
and the check does not see.

The verdict is remembered per file (real path, size, mtime, inode), on_bad_line and the source of this
module and budgetgen.prompts, in a small JSON file (cache_path), so a second `snakemake -n`, and the
Snakefile's parse in every job, read no prompts file again. Datasets given as a `source` are not
checked: their prompts.jsonl is the workflow's own import, validated row by row by the import job,
and may be about to be replaced.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import sys
from typing import TYPE_CHECKING

from . import prompts
from .processes import usable_cpus

if TYPE_CHECKING:
    from typing import Any

CHECK_VERSION = 1  # with the source of this module and prompts.py: part of the cache key
_CHUNK = 16 << 20
_PARALLEL_BYTES = 64 << 20  # a smaller file is checked in this process (a worker takes ~0.1 s to start)
_MAX_WORKERS = 8
_CACHE_ENTRIES = 256
_STABLE_SHAPE = re.compile(r"p[0-9a-f]{20}")  # what prompts.stable_id returns
_WS = " \t\n\r"  # json's whitespace (json.decoder.WHITESPACE)
_scan_once = json.JSONDecoder().scan_once  # what json.loads runs on the text, after the leading whitespace
_verdicts = {}  # cache key -> verdict, in this process


class _Restart(Exception):
    """An id of the stable-id shape: check again, hashing the id-less lines as the job does."""


def prompts_problem(config: dict[str, Any], cache_path: str | None = None) -> str | None:
    """The first dataset (in name order) whose prompts file the inference job would refuse, as one line
    `prompts file PATH:LINE: reason (datasets.D.prompts)`; None if every one is usable. cache_path: the
    JSON file remembering verdicts (None: this process only)."""
    from .settings import generation_setting

    for ds in sorted(config["datasets"]):
        own = config["datasets"][ds]
        if own.get("source") is not None or not os.path.isfile(own["prompts"]):
            continue
        verdict = check_cached(own["prompts"], generation_setting(config, ds, "on_bad_line"), cache_path)
        if verdict:
            return f"prompts file {message(own['prompts'], verdict)} (datasets.{ds}.prompts)"
    return None


def message(path: str, verdict: tuple[int | None, str]) -> str:
    """The job's own error text for a verdict: PATH:LINE: reason, or PATH: reason for the whole file."""
    line, reason = verdict
    return f"{path}:{line}: {reason}" if line else f"{path}: {reason}"


def check_cached(path: str, on_bad_line: str, cache_path: str | None = None) -> tuple[int | None, str] | None:
    """check_file's verdict, remembered under cache_key in this process and in cache_path."""
    key = cache_key(path, on_bad_line)
    if key in _verdicts:
        return _verdicts[key]
    entries = _read_cache(cache_path)
    if key in entries:
        verdict = entries[key]
    else:
        verdict = check_file(path, on_bad_line)
        verdict = list(verdict) if verdict else None
        if cache_path:
            _write_cache(cache_path, entries, key, verdict)
    _verdicts[key] = tuple(verdict) if verdict else None
    return _verdicts[key]


def cache_key(path: str, on_bad_line: str) -> str:
    st = os.stat(path)
    blob = [os.path.realpath(path), st.st_size, st.st_mtime_ns, st.st_ino, st.st_dev, on_bad_line,
            _parser_version()]
    return hashlib.sha256(json.dumps(blob).encode()).hexdigest()


def _parser_version():
    h = hashlib.sha256(f"{CHECK_VERSION} {sys.version_info[:2]}".encode())
    for module in (prompts, sys.modules[__name__]):
        with open(module.__file__, "rb") as f:
            h.update(f.read())
    return h.hexdigest()


def _read_cache(cache_path):
    if not cache_path:
        return {}
    try:
        with open(cache_path, encoding="utf-8") as f:
            entries = json.load(f)
    except (OSError, ValueError):
        return {}
    return entries if isinstance(entries, dict) else {}


def _write_cache(cache_path, entries, key, verdict):
    """Add one verdict (keeping the newest _CACHE_ENTRIES), written whole or not at all; a cache that
    cannot be written only costs a check next time."""
    entries = {k: v for k, v in entries.items() if k != key}
    entries[key] = verdict
    entries = dict(list(entries.items())[-_CACHE_ENTRIES:])
    directory = os.path.dirname(cache_path) or "."
    tmp = os.path.join(directory, f".{os.path.basename(cache_path)}.{os.getpid()}.tmp")
    try:
        os.makedirs(directory, exist_ok=True)
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(entries, f)
        os.replace(tmp, cache_path)
    except OSError:
        try:
            os.unlink(tmp)
        except OSError:
            pass


def check_file(path: str | os.PathLike, on_bad_line: str = "error",
               workers: int | None = None) -> tuple[int | None, str] | None:
    """What load_prompts(path, on_bad_line) would refuse, as (line or None, reason); None if it would
    load (module docstring). The file is read in chunks, never whole; under on_bad_line error a large
    file is split at line boundaries among worker processes (workers: how many; default one per
    available core, at most _MAX_WORKERS, and one for a file under _PARALLEL_BYTES)."""
    if on_bad_line not in prompts.ON_BAD_LINE:
        raise ValueError(f"on_bad_line must be one of {prompts.ON_BAD_LINE}, got {on_bad_line!r}")
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if workers is None:
                workers = 1 if size < _PARALLEL_BYTES else min(_MAX_WORKERS, usable_cpus())
            ranges = _ranges(f, size, 1 if on_bad_line == "skip" else max(1, workers))
    except OSError as exc:
        return None, f"cannot read prompts file ({exc.strerror or exc})"
    verdict = _check_ranges(path, on_bad_line, False, ranges)
    return _check_ranges(path, on_bad_line, True, ranges) if verdict == "restart" else verdict


def _ranges(f, size, n):
    """n byte ranges [start, end) of the file, each starting a line (fewer for a short file)."""
    cuts = [0]
    for i in range(1, n):
        at = max(size * i // n, cuts[-1])
        f.seek(at)
        f.readline()  # to the end of the line `at` is in
        if f.tell() >= size:
            break
        if f.tell() > cuts[-1]:
            cuts.append(f.tell())
    return list(zip(cuts, cuts[1:] + [size]))


def _check_ranges(path, on_bad_line, hash_all, ranges):
    """Check each range (in worker processes when several) and join their results in file order: the
    earliest refusal wins, an id first seen in an earlier range is checked as the job would."""
    args = [(path, on_bad_line, hash_all, start, end) for start, end in ranges]
    if len(args) == 1:
        return _join(path, on_bad_line == "skip", iter([_check_range(*args[0])]), False)
    procs = [_start_worker(a) for a in args]  # python -c, not multiprocessing: nothing of __main__ re-run
    try:
        return _join(path, on_bad_line == "skip", (_worker_result(p) for p in procs), True)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
            proc.stdout.close()


def _start_worker(args):
    import subprocess

    scripts = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    code = (f"import sys; sys.path.insert(0, {scripts!r}); from budgetgen.prompts_check import _worker; "
            "_worker(sys.argv[1:])")
    argv = [sys.executable, "-c", code, *map(str, args)]
    return subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE)


def _worker(argv):
    import pickle

    path, on_bad_line, hash_all, start, end = argv
    result = _check_range(path, on_bad_line, hash_all == "True", int(start), int(end))
    pickle.dump(result, sys.stdout.buffer, protocol=pickle.HIGHEST_PROTOCOL)


def _worker_result(proc):
    import pickle

    data = proc.stdout.read()
    if proc.wait() != 0 or not data:
        raise RuntimeError(f"prompts check worker failed (exit {proc.returncode})")
    return pickle.loads(data)


def _join(path, skip, results, several):
    seen, before, lines, first_bad, nonempty, reread = {}, 0, 0, None, False, _Reread(path)
    with reread:
        for r in results:
            if r["restart"]:
                return "restart"
            if r["error"]:
                return None, r["error"]
            nonempty = nonempty or r["nonempty"]
            for pid, offset in zip(r["ids"], r["offsets"]) if several else ():
                first = seen.setdefault(pid, offset)
                if first != offset and reread.messages(first) != reread.messages(offset):
                    return reread.line_number(offset), prompts.duplicate_reason(pid, reread.line_number(first))
            if r["dup"]:  # its first line: in an earlier range, if the id was there
                pid, first = r["dup"]
                return before + r["verdict"][0], prompts.duplicate_reason(pid, reread.line_number(seen.get(pid, first)))
            if r["verdict"]:
                line, reason = r["verdict"]
                return before + line, reason
            if r["good"]:
                return None
            lines += r["lines"]
            first_bad = first_bad or (r["first_bad"] and (before + r["first_bad"][0], r["first_bad"][1]))
            before += r["line_count"]
    if lines and not skip:
        return None
    return None, prompts.no_prompts_reason(lines, first_bad, nonempty)


def _check_range(path, on_bad_line, hash_all, start, end):
    """One range's lines, numbered from 1 at `start` (module docstring); a dict of what _join needs."""
    check = _Range(on_bad_line == "skip", hash_all, _Reread(path))
    out = {"restart": False, "error": None, "verdict": None, "good": False, "nonempty": end > start}
    try:
        with open(path, "rb") as f, check.reread:
            f.seek(start)
            out["verdict"], out["line_count"] = check.read(f, start, end)
    except _Restart:
        out["restart"] = True
    except OSError as exc:
        out["error"] = f"cannot read prompts file ({exc.strerror or exc})"
    if out["verdict"] == "good":
        out["verdict"], out["good"] = None, True
    out.update(lines=check.lines, first_bad=check.first_bad, dup=check.dup, ids=list(check.seen),
               offsets=list(check.seen.values()))
    return out


class _Reread:
    """A prompts file opened again to look at one line by its byte offset."""

    def __init__(self, path):
        self.path, self.f = path, None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if self.f:
            self.f.close()

    def _open(self):
        if self.f is None:
            self.f = open(self.path, "rb")
        return self.f

    def messages(self, offset):
        """The normalised messages of the (good) line starting at byte offset."""
        f = self._open()
        f.seek(offset)
        raw = f.readline()
        return prompts._parse_line(raw[:-1] if raw.endswith(b"\n") else raw, 1 if offset == 0 else 2)[1]

    def line_number(self, offset):
        f = self._open()
        f.seek(0)
        count, left = 1, offset
        while left > 0:
            block = f.read(min(left, _CHUNK))
            count += block.count(b"\n")
            left -= len(block)
        return count


class _Range:
    def __init__(self, skip, hash_all, reread):
        self.skip, self.hash_all, self.reread = skip, hash_all, reread
        self.lines = 0  # non-blank lines
        self.first_bad = None  # (line, reason) under skip
        self.seen = {}  # id -> byte offset of its first line, in order
        self.dup = None  # (id, byte offset of its first line) of a line repeating it with other messages

    def read(self, f, start, end):
        """(verdict, lines in the range): verdict (line, reason), "good" (skip: a prompt) or None."""
        carry, offset, lineno, left = b"", start, 0, end - start
        self.shift = 1 if start else 0  # _parse_line strips a BOM on the file's line 1 only
        while True:
            block = f.read(min(_CHUNK, left)) if left > 0 else b""
            left -= len(block)
            if not block:
                data, last = carry, True
            else:
                data = carry + block if carry else block
                cut = data.rfind(b"\n")
                if cut < 0:
                    carry = data
                    continue
                data, carry, last = data[:cut], data[cut + 1:], False
            if data or not last:
                verdict, lineno = self._lines(data, offset, lineno)
                if verdict is not False:
                    return verdict, lineno
            if last:
                return None, lineno
            offset += len(data) + 1

    def _lines(self, data, offset, lineno):
        """Check the lines of data (no final newline); (verdict, last line number); verdict False: go on."""
        scan, normalise, record_id, bad = _scan_once, prompts._normalise, prompts._record_id, prompts._Bad
        escape = prompts._SURROGATE_ESCAPE.search
        for raw in data.split(b"\n"):
            lineno += 1
            start, offset = offset, offset + len(raw) + 1
            pid = messages = None
            try:  # the fast path: _parse_line's steps without its error formatting
                text = raw.decode("utf-8")
                obj, end = scan(text, 0)
                if end != len(text) and text[end:].strip(_WS):
                    raise ValueError
                messages = normalise(obj, check_unicode=escape(text) is not None)
                pid = record_id(obj, messages) if "id" in obj else ""
            except (bad, ValueError, StopIteration, RecursionError):
                messages = None  # anything not accepted in full: the job's own function says what
            if messages is None:
                if prompts.is_blank(raw):
                    continue
                try:
                    pid, messages = prompts._parse_line(raw, lineno + self.shift)
                except bad as exc:
                    if not self.skip:
                        return (lineno, str(exc)), lineno
                    self.lines += 1
                    self.first_bad = self.first_bad or (lineno, str(exc))
                    continue
                if _STABLE_SHAPE.fullmatch(pid) and pid == prompts.stable_id(messages):
                    pid = ""  # its content hash (an id of its own equal to it is the same to the job)
            self.lines += 1
            if self.skip:
                return "good", lineno  # the first good line is a prompt: the file loads
            if pid == "":  # no id of its own: the content hash, only where an own id could equal one
                if not self.hash_all:
                    continue
                pid = prompts.stable_id(messages)
            elif not self.hash_all and _STABLE_SHAPE.fullmatch(pid):
                raise _Restart
            first = self.seen.setdefault(pid, start)
            if first != start and self.reread.messages(first) != messages:
                self.dup = pid, first
                return (lineno, None), lineno
        return False, lineno
