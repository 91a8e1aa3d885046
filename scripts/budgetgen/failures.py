"""The cause of each failed job, said last: a job run by Snakemake that fails records its one-line cause
(the `error: ...` line it printed, or what ended it), and the run's `onerror` prints one line per failed
job at the end of the run, with the log to read, on the terminal of whoever started it (on a cluster:
the head node, which reads the records from the shared working directory).

    FAILED_DIR/RULE.WILDCARDS.json   {"rule", "wildcards", "cause", "log", "at"}

onstart empties FAILED_DIR (so every record there at the end is of this run); a job clears its own
record as it starts. A job killed by a signal (SIGKILL, out of memory, a cluster's time limit) records
nothing: the summary line says so.
"""

from __future__ import annotations

import json
import os
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence

FAILED_DIR = ".snakemake/budgetgen/failed"

_cause = None


def note_cause(text: object) -> None:
    """The one-line cause of a nonzero exit the job is about to make (the last one noted wins)."""
    global _cause
    _cause = " ".join(str(text).split())


def noted_cause() -> str | None:
    return _cause


def record_path(rule: str, wildcards: Iterable[object]) -> str:
    name = ".".join([rule, *(str(v) for v in wildcards)]) or rule
    return os.path.join(FAILED_DIR, "".join(c if c.isalnum() or c in "._-" else "_" for c in name) + ".json")


def clear(rule: str, wildcards: Iterable[object]) -> None:
    try:
        os.unlink(record_path(rule, wildcards))
    except FileNotFoundError:
        pass


def record(rule: str, wildcards: Sequence[object], cause: str, log: str | None) -> None:
    """Write a failed job's record (atomically: whole or absent)."""
    from .fsutil import write_json_atomic

    os.makedirs(FAILED_DIR, exist_ok=True)
    write_json_atomic(record_path(rule, wildcards), {
        "rule": rule, "wildcards": [str(v) for v in wildcards], "cause": cause, "log": log,
        "at": time.strftime("%Y-%m-%d %H:%M:%S")})


def reset() -> None:
    """onstart: forget the records of earlier runs."""
    if os.path.isdir(FAILED_DIR):
        for name in os.listdir(FAILED_DIR):
            if name.endswith(".json"):
                os.unlink(os.path.join(FAILED_DIR, name))


def summary_lines(keep_going: bool) -> list[str]:
    """The lines onerror prints: one per failed job with a record (sorted by rule and wildcards), then
    one with the count (and, without records, where to look), and whether the other jobs went on."""
    records = []
    if os.path.isdir(FAILED_DIR):
        for name in sorted(os.listdir(FAILED_DIR)):
            try:
                with open(os.path.join(FAILED_DIR, name)) as f:
                    records.append(json.load(f))
            except (OSError, ValueError):
                continue
    lines = [f"budgetgen: FAILED {r['rule']} {' '.join(r['wildcards'])}".rstrip() + f": {r['cause']}"
             + (f" (log: {r['log']})" if r.get("log") else "") for r in records]
    lines.append(f"budgetgen: {len(records)} job(s) failed with a cause above"
                 + ("; a job killed by a signal (out of memory, a time limit, scancel) records none: see Snakemake's "
                    "lines above and logs/" if not records else "")
                 + ("; every other job went on (keep-going)" if keep_going else
                    "; jobs not started yet were not started (keep-going is off)")
                 + "; fix and rerun: work journaled is kept")
    return lines
