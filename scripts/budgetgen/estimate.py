"""What the remaining work costs, before it starts: the table `snakemake -n` prints below the status.

Per dataset and in total: the kept tokens left (budget minus the tokens the quality gate kept), the
completion tokens still to generate for them (at the keep rate the journal shows), the requests that
takes (at the journal's mean length), an estimated wall time, GPU-hours, and the hidden-state storage of
the rows still to come (budgetgen.forecast).

The wall time comes from the throughput measured on this server: each journal's own rate (its latest
run: the completion tokens of its records over the span from the first one's start to the last one's
end, back to the first gap of GAP_S without a completion), read from its last TAIL_BYTES only, so `-n`
stays as fast on a journal of gigabytes; else `server.expected_tokens_per_s` (the server's aggregate);
else unknown (said so). The datasets' jobs share the server at once, so the total is the tokens to
generate over the sum of the rates (the server's aggregate). GPU-hours = wall time x the server's GPUs
(`server.gpus`, or the parallel sizes of `server.launch`); unknown without either.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .forecast import human_bytes
from .quality import record_flags

if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import Any

    from .settings import InferenceSettings

TAIL_BYTES = 4 << 20
GAP_S = 120.0


@dataclass(frozen=True)
class Rate:
    """What a journal's latest records say of this server: generated tokens/s, the share of completion
    tokens kept by the gate, the mean completion length, prompt tokens per completion token."""

    tokens_per_s: float
    keep: float
    mean_length: float
    prompt_ratio: float
    records: int


def tail_records(path: str | os.PathLike, limit: int = TAIL_BYTES) -> list[dict[str, Any]]:
    """The whole records in the last `limit` bytes of a journal (the first, likely cut, line skipped)."""
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as f:
            f.seek(max(0, size - limit))
            data = f.read()
    except FileNotFoundError:
        return []
    lines = data.split(b"\n")
    if size > limit:
        lines = lines[1:]
    out = []
    for raw in lines[:-1]:  # the last piece has no newline: torn or empty
        try:
            rec = json.loads(raw)
        except ValueError:
            continue
        if isinstance(rec, dict) and isinstance(rec.get("usage"), dict):
            out.append(rec)
    return out


def journal_rate(records: Sequence[dict[str, Any]], gate: Any = None) -> Rate | None:
    """The Rate of a journal's latest run (see the module docstring); None with fewer than 2 records
    timed. `gate`: a quality.Gate whose keep share counts (None: every record kept)."""
    timed = sorted(((float(r.get("created") or 0) + float(r.get("latency_s") or 0), r) for r in records
                    if r.get("created")), key=lambda x: x[0])
    if len(timed) < 2:
        return None
    run = [timed[-1]]
    for end, rec in reversed(timed[:-1]):
        if run[-1][0] - end > GAP_S:
            break
        run.append((end, rec))
    start = min(float(r["created"]) for _, r in run)
    span = max(e for e, _ in run) - start
    tokens = [int(r["usage"].get("completion_tokens") or 0) for _, r in run]
    if span <= 0 or not sum(tokens):
        return None
    kept = sum(n for (_, r), n in zip(run, tokens, strict=True)
               if gate is None or gate.fate(record_flags(r), n).kept)
    prompt = sum(int(r["usage"].get("prompt_tokens") or 0) for _, r in run)
    return Rate(sum(tokens) / span, kept / sum(tokens), sum(tokens) / len(run), prompt / sum(tokens), len(run))


@dataclass(frozen=True)
class Remaining:
    """One dataset's remaining work (see the module docstring); None where unknown."""

    dataset: str
    kept_left: int
    generate: float  # completion tokens still to generate
    requests: float | None
    tokens_per_s: float | None
    source: str  # where the rate comes from
    row_bytes: int | None  # hidden-state storage of the rows still to come (prompt tokens once journaled)


def remaining(s: InferenceSettings, kept: int, expected_tokens_per_s: float | None) -> Remaining:
    """The remaining work of the dataset of `s` with `kept` kept tokens journaled so far."""
    left = max(0, s.budget - kept)
    gate = s.mixture.cells[0].gate if s.mixture.plain else None
    rate = journal_rate(tail_records(s.paths.journal), gate)
    keep = rate.keep if rate and rate.keep > 0 else 1.0
    generate = left / keep
    if rate is not None:
        tps, source = rate.tokens_per_s, f"its journal ({rate.records} latest records)"
    elif expected_tokens_per_s:
        tps, source = None, "server.expected_tokens_per_s"
    else:
        tps, source = None, "unknown (no journal yet; set server.expected_tokens_per_s)"
    requests = generate / rate.mean_length if rate else None
    ratio = rate.prompt_ratio if rate else 0.0
    row_bytes = s.forecast.bytes_for(left * (1 + ratio)) if s.forecast is not None else None
    return Remaining(s.dataset, left, generate, requests, tps, source, row_bytes)


def server_gpus(server: dict[str, Any]) -> int | None:
    """The GPUs the server holds: server.gpus, else the parallel sizes of server.launch; None if unknown."""
    if server.get("gpus"):
        return int(server["gpus"])
    if server.get("launch"):
        from .cluster import launch_gpus

        return launch_gpus(server["launch"])
    return None


def fmt_hours(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    if seconds < 600:
        return f"{seconds:.0f} s"
    if seconds < 36000:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def format_table(rows: Sequence[Remaining], expected_tokens_per_s: float | None, gpus: int | None) -> str:
    """The `budgetgen: ` lines `-n` prints: a line per dataset with work left, the total, the sources."""
    todo = [r for r in rows if r.kept_left > 0]
    measured = sum(r.tokens_per_s for r in todo if r.tokens_per_s)
    aggregate = measured if all(r.tokens_per_s for r in todo) and todo else expected_tokens_per_s
    head = (f"budgetgen: {'remaining':<24} {'kept tokens':>12} {'to generate':>12} {'requests':>9} "
            f"{'wall':>9} {'GPU-hours':>9} {'hidden states':>13}")
    lines = [head]
    total_gen = sum(r.generate for r in todo)

    def line(name, left, gen, requests, wall, row_bytes):
        gpu_h = f"{wall * gpus / 3600:.1f}" if wall is not None and gpus else "?"
        return (f"budgetgen: {name:<24} {left:>12,} {gen:>12,.0f} {requests:>9} {fmt_hours(wall):>9} {gpu_h:>9} "
                f"{human_bytes(row_bytes) if row_bytes is not None else '?':>13}")

    for r in todo:
        tps = r.tokens_per_s or expected_tokens_per_s
        lines.append(line(r.dataset, r.kept_left, r.generate, f"{r.requests:,.0f}" if r.requests else "?",
                          r.generate / tps if tps else None, r.row_bytes))
    sizes = [r.row_bytes for r in todo]
    lines.append(line("total", sum(r.kept_left for r in todo), total_gen,
                      f"{sum(r.requests for r in todo):,.0f}" if todo and all(r.requests for r in todo) else "?",
                      total_gen / aggregate if aggregate and todo else (0.0 if not todo else None),
                      sum(sizes) if todo and None not in sizes else (0 if not todo else None)))
    by_source = {}
    for r in todo:
        by_source.setdefault(None if r.tokens_per_s else r.source, []).append(r)
    sources = "; ".join([f"{r.dataset} {r.tokens_per_s:,.0f} tok/s from {r.source}" for r in by_source.pop(None, [])]
                        + [f"{', '.join(r.dataset for r in rs)}: {src}" for src, rs in by_source.items()])
    lines.append(f"budgetgen: (estimate; throughput: {sources or 'nothing left'}"
                 + (f"; total at {aggregate:,.0f} tok/s, the jobs sharing the server" if aggregate else "")
                 + (f"; GPU-hours at {gpus} GPUs" if gpus else "; GPU-hours need server.gpus or server.launch")
                 + ")")
    return "\n".join(lines)
