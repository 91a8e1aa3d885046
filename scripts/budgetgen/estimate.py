"""What the remaining work costs, before it starts: the table `snakemake -n` prints below the status.

Per dataset and in total: the kept tokens left (each lane's budget line minus the tokens the quality gate
kept in it; none in a lane or dataset that is met or exhausted, which no job will run), the completion
tokens still to generate for them (at each cell's keep share in the journal: a think/nothink mixture
whose think cell drops half its responses needs twice its tokens generated), the requests that takes (at
the journal's mean length), an estimated wall time, GPU-hours, and the hidden-state storage of the rows
still to come (budgetgen.forecast; prompt tokens counted once a journal gives their share, said so where
not).

The wall time comes from the throughput measured on this server: each journal's own rate at full
concurrency (its latest run, back to the first gap of GAP_S without a completion: the completion tokens/s
while at least FULL_SHARE of the run's most requests in flight were in flight, so neither the ramp nor a
finished run's drain, when few requests are left, sets the rate), plus the drain the next run ends with
(half a mean response latency), read from the journal's last TAIL_BYTES only, so `-n` stays as fast on
a journal of gigabytes; else `server.expected_tokens_per_s` (the server's aggregate); else unknown (said
so). How the lines add up is in format_table and the table's last line. GPU-hours = wall time x the
server's GPUs (`server.gpus`, or the parallel sizes of `server.launch`); unknown without either.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .forecast import human_bytes
from .journal import blamed_keys, is_blamed
from .mixture import DEFAULT_CELL
from .quality import record_flags
from .state import EXHAUSTED, MET

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence
    from typing import Any

    from .settings import InferenceSettings

TAIL_BYTES = 4 << 20
GAP_S = 120.0
FULL_SHARE = 0.9  # "full concurrency": at least this share of the most requests a run had in flight at once
IDLE_S = 1.0  # nothing in flight this long: one job ended, another (a rerun, a resume) began


@dataclass(frozen=True)
class Rate:
    """What a journal's latest run says of this server: completion tokens/s at the run's full concurrency
    (its steady part, not the ramp or the drain), the share of completion tokens the gate kept per cell,
    the mean completion length, prompt tokens per completion token, the mean latency of a response (a
    run ends with a drain of about half of one at falling concurrency), the records read."""

    tokens_per_s: float
    keep: dict[str, float]
    mean_length: float
    prompt_ratio: float
    records: int
    latency_s: float = 0.0

    def keep_of(self, cell: str) -> float:
        """The cell's keep share (1.0 where its records kept nothing yet or it has none)."""
        got = self.keep.get(cell)
        return got if got else 1.0


def tail_records(path: str | os.PathLike, limit: int = TAIL_BYTES) -> list[dict[str, Any]]:
    """The whole records in the last `limit` bytes of a journal (the first, likely cut, line skipped), less
    those blamed on the server (budgetgen.breaker: a broken server's fast garbage is no rate to plan by)."""
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
    out, blamed = [], blamed_keys(path)
    for raw in lines[:-1]:  # the last piece has no newline: torn or empty
        try:
            rec = json.loads(raw)
        except ValueError:
            continue
        if isinstance(rec, dict) and isinstance(rec.get("usage"), dict) and not is_blamed(blamed, rec.get("id"), rec):
            out.append(rec)
    return out


def full_concurrency_rate(spans: Sequence[tuple[float, float, int]], share: float = FULL_SHARE) -> float | None:
    """Completion tokens/s of the latest job (after the last IDLE_S with nothing in flight: a raised budget's
    rerun minutes after the first run is another job) between the first and the last moment at least `share`
    of its most requests in flight at once were in flight: each span (start, end, tokens) spreads its tokens evenly
    over its latency; the ramp before and the drain after (fewer in flight) are left out, the moments in
    between when a finished request was not yet replaced are kept (the run that follows has them too).
    None without such a stretch of time."""
    events = sorted([(a, 1, n / (b - a)) for a, b, n in spans if b > a]
                    + [(b, -1, n / (b - a)) for a, b, n in spans if b > a])
    busy, start = 0, 0  # the latest job: after the last stretch of IDLE_S with nothing in flight (runs apart)
    for i, (t, step, _) in enumerate(events):
        busy += step
        if not busy and i + 1 < len(events) and events[i + 1][0] - t >= IDLE_S:
            start = i + 1
    events = events[start:]
    busy, peak = 0, 0
    for _, step, _ in events:
        busy += step
        peak = max(peak, busy)
    if not peak:
        return None
    floor = max(1, peak * share)
    busy, rate, first, last_full = 0, 0.0, None, None
    for t, step, _ in events:  # the first moment at full concurrency and the last one it ends
        was = busy >= floor
        busy += step
        if busy >= floor and first is None:
            first = t
        if was and busy < floor:
            last_full = t
    if first is None or last_full is None or last_full <= first:
        return None
    tokens, busy, last = 0.0, 0, None
    for t, step, r in events:
        if last is not None:
            lo, hi = max(last, first), min(t, last_full)
            if hi > lo:
                tokens += rate * (hi - lo)
        rate += step * r
        last = t
    return tokens / (last_full - first)


def journal_rate(records: Sequence[dict[str, Any]], cell_gate: Callable[[dict[str, Any]], tuple[str, Any]]
                 | None = None) -> Rate | None:
    """The Rate of a journal's latest run (see the module docstring); None with fewer than 2 records
    timed. `cell_gate(record) -> (cell, quality.Gate)`: the cell a record counts in and its gate (None:
    one cell, every record kept)."""
    timed = sorted(((float(r.get("created") or 0) + float(r.get("latency_s") or 0), r) for r in records
                    if r.get("created")), key=lambda x: x[0])
    if len(timed) < 2:
        return None
    run = [timed[-1]]
    for end, rec in reversed(timed[:-1]):
        if run[-1][0] - end > GAP_S:
            break
        run.append((end, rec))
    tokens = [int(r["usage"].get("completion_tokens") or 0) for _, r in run]
    if not sum(tokens):
        return None
    rate = full_concurrency_rate([(float(r["created"]), end, n) for (end, r), n in zip(run, tokens, strict=True)])
    if rate is None:
        return None
    generated, kept = {}, {}
    for (_, r), n in zip(run, tokens, strict=True):
        cell, gate = cell_gate(r) if cell_gate else (DEFAULT_CELL, None)
        generated[cell] = generated.get(cell, 0) + n
        if gate is None or gate.fate(record_flags(r), n).kept:
            kept[cell] = kept.get(cell, 0) + n
    keep = {c: kept.get(c, 0) / g for c, g in generated.items() if g}
    prompt = sum(int(r["usage"].get("prompt_tokens") or 0) for _, r in run)
    latency = sum(float(r.get("latency_s") or 0) for _, r in run) / len(run)
    return Rate(rate, keep, sum(tokens) / len(run), prompt / sum(tokens), len(run), latency)


@dataclass(frozen=True)
class Remaining:
    """One dataset's remaining work (see the module docstring); None where unknown."""

    dataset: str
    kept_left: int
    generate: float  # completion tokens still to generate
    requests: float | None
    tokens_per_s: float | None
    source: str  # where the rate comes from
    row_bytes: int | None  # hidden-state storage of the rows still to come
    drain_s: float = 0.0  # the run's tail at falling concurrency: half a mean response latency
    prompts_counted: bool = True  # row_bytes counts prompt tokens (a journal gave their share)

    @property
    def wall_s(self) -> float | None:
        """The dataset's wall time at its own rate (as measured, beside the other datasets' jobs)."""
        return self.generate / self.tokens_per_s + self.drain_s if self.tokens_per_s and self.generate else None


def remaining(s: InferenceSettings, rows: Sequence[tuple], expected_tokens_per_s: float | None) -> Remaining:
    """The remaining work of the dataset of `s`, from its status rows (budgetgen.state.status_rows: the
    dataset's, then one per lane of a mixture or validation split: name, kept tokens, budget, left,
    responses, state). A dataset or lane whose state is met or exhausted has no work left that can run."""
    def runs(state: str) -> bool:
        return not state.startswith((MET, EXHAUSTED))

    lanes = {lane.key: lane for lane in s.mixture.lanes}
    head = rows[0]
    if len(rows) > 1:  # each lane its own budget line (a lane over its line gives nothing to the others)
        lefts = [(lanes[r[0].split("/", 1)[1]].cell.name, r[3]) for r in rows[1:] if runs(r[5]) and runs(head[5])]
    else:
        lefts = [(s.mixture.cells[0].name, head[3])] if runs(head[5]) else []
    left = sum(n for _, n in lefts)
    policy, gate_of = s.policy, s.mixture.gate_of(s.policy)

    def cell_gate(rec):
        sha, named = rec.get("identity"), rec.get("cell")
        return policy.cell_of(sha, named), gate_of(sha, named)

    rate = journal_rate(tail_records(s.paths.journal), cell_gate)
    generate = sum(n / (rate.keep_of(cell) if rate else 1.0) for cell, n in lefts)
    if rate is not None:
        tps, source = rate.tokens_per_s, f"its journal ({rate.records} latest records, at full concurrency)"
    elif expected_tokens_per_s:
        tps, source = None, "server.expected_tokens_per_s"
    else:
        tps, source = None, "unknown (no journal yet; set server.expected_tokens_per_s)"
    requests = generate / rate.mean_length if rate else None
    ratio = rate.prompt_ratio if rate else 0.0
    row_bytes = s.forecast.bytes_for(left * (1 + ratio)) if s.forecast is not None else None
    return Remaining(s.dataset, left, generate, requests, tps, source, row_bytes,
                     drain_s=rate.latency_s / 2 if rate else 0.0, prompts_counted=rate is not None)


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
    """The `budgetgen: ` lines `-n` prints: a line per dataset with work left, the total, and how they add
    up. Measured rates were measured with the datasets' jobs sharing the server, so each dataset's wall
    is its own at that rate and the total is the longest of them (they run at once); a dataset without a
    journal runs at server.expected_tokens_per_s, the server's aggregate, which those datasets share (their
    walls add up). GPU-hours: the server's GPUs for the total wall, split between the datasets by their
    tokens to generate, so the lines add up to the total."""
    todo = [r for r in rows if r.kept_left > 0]
    head = (f"budgetgen: {'remaining':<24} {'kept tokens':>12} {'to generate':>12} {'requests':>9} "
            f"{'wall':>9} {'GPU-hours':>9} {'hidden states':>13}")
    lines = [head]
    total_gen = sum(r.generate for r in todo)
    measured = [r for r in todo if r.tokens_per_s]
    rest = [r for r in todo if not r.tokens_per_s]
    walls = {r.dataset: r.wall_s for r in measured}
    shared_s = sum(r.generate for r in rest) / expected_tokens_per_s if rest and expected_tokens_per_s else None
    for r in rest:
        walls[r.dataset] = r.generate / expected_tokens_per_s if expected_tokens_per_s else None
    if not todo:
        total_wall = 0.0
    elif rest and shared_s is None:
        total_wall = None
    else:
        total_wall = max([w for r in measured if (w := walls[r.dataset]) is not None] + [shared_s or 0.0])
    total_gpu_h = total_wall * gpus / 3600 if total_wall is not None and gpus else None

    def line(name, left, gen, requests, wall, gpu_h, row_bytes):
        return (f"budgetgen: {name:<24} {left:>12,} {gen:>12,.0f} {requests:>9} {fmt_hours(wall):>9} "
                f"{f'{gpu_h:.1f}' if gpu_h is not None else '?':>9} "
                f"{human_bytes(row_bytes) if row_bytes is not None else '?':>13}")

    for r in todo:
        share = total_gpu_h * r.generate / total_gen if total_gpu_h is not None and total_gen else None
        lines.append(line(r.dataset, r.kept_left, r.generate, f"{r.requests:,.0f}" if r.requests else "?",
                          walls[r.dataset], share, r.row_bytes))
    sizes = [r.row_bytes for r in todo]
    lines.append(line("total", sum(r.kept_left for r in todo), total_gen,
                      f"{sum(r.requests for r in todo):,.0f}" if todo and all(r.requests for r in todo) else "?",
                      total_wall, total_gpu_h if todo else 0.0,
                      sum(sizes) if todo and None not in sizes else (0 if not todo else None)))
    lines.append(footnote(todo, expected_tokens_per_s, gpus, total_wall is not None))
    return "\n".join(lines)


def footnote(todo: Sequence[Remaining], expected_tokens_per_s: float | None, gpus: int | None,
             total_known: bool) -> str:
    """The table's last line: where each rate comes from, how the lines add up, what the storage counts."""
    by_source = {}
    for r in todo:
        by_source.setdefault(None if r.tokens_per_s else r.source, []).append(r)
    sources = "; ".join([f"{r.dataset} {r.tokens_per_s:,.0f} tok/s from {r.source}" for r in by_source.pop(None, [])]
                        + [f"{', '.join(r.dataset for r in rs)}: {src}" for src, rs in by_source.items()])
    rest = [r.dataset for r in todo if not r.tokens_per_s]
    adds = []
    if len(rest) < len(todo):
        adds.append("each measured dataset's wall at its own rate, beside the others' jobs on the server")
    if rest and expected_tokens_per_s:
        adds.append(f"{', '.join(rest)} sharing the server's {expected_tokens_per_s:,.0f} tok/s (their walls add up)")
    if todo and total_known:
        adds.append("the total wall: the longest of these, as the jobs run at once")
    adds.append(f"GPU-hours: {gpus} GPUs x the total wall, split by tokens to generate" if gpus
                else "GPU-hours need server.gpus or server.launch")
    uncounted = [r.dataset for r in todo if r.row_bytes is not None and not r.prompts_counted]
    if uncounted:
        adds.append(f"hidden states of {', '.join(uncounted)}: completion tokens only (no journal yet gives "
                    "their prompt tokens)")
    elif todo:
        adds.append("hidden states: prompt and completion tokens")
    return f"budgetgen: (estimate; throughput: {sources or 'nothing left'}; {'; '.join(adds)})"
