"""Shared by every benchmark: timing medians, the mock server, and the result tables.

Each benchmark compares budgetgen against a baseline in the same run and reports ratios (this
machine is noisy); each prints one Markdown table and writes it to bench/results/<name>.md.
"""

import contextlib
import statistics
import sys
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
RESULTS = BENCH / "results"
sys.path.insert(0, str(REPO / "scripts"))

from budgetgen_testkit import mock_server  # noqa: E402


def median(values):
    return statistics.median(values)


def timed(fn, *args, **kwargs):
    """(seconds, result) of one call, wall clock."""
    t0 = time.perf_counter()
    out = fn(*args, **kwargs)
    return time.perf_counter() - t0, out


def start_server(args, workdir):
    """A mock OpenAI-compatible server on 127.0.0.1 (budgetgen_testkit.mock_server); returns (proc, base_url)."""
    return mock_server.spawn([str(a) for a in args], workdir)


def stop_server(proc):
    mock_server.stop(proc)


@contextlib.contextmanager
def stopping(procs):
    """Kill and reap `procs` (subprocesses started for the run) however the block ends."""
    try:
        yield procs
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


def markdown_table(headers, rows):
    def cell(v):
        if isinstance(v, float):
            return f"{v:.3g}" if abs(v) < 1000 else f"{v:,.0f}"
        return str(v)

    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def report(name, title, headers, rows, notes=()):
    """Print the table and write it (with title, notes and the time it was run) to bench/results/NAME.md."""
    text = f"## {title}\n\n{markdown_table(headers, rows)}\n"
    if notes:
        text += "\n" + "\n".join(f"- {n}" for n in notes) + "\n"
    text += f"\n_run {time.strftime('%Y-%m-%d %H:%M:%S')}_\n"
    print(text, flush=True)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{name}.md").write_text(text)
    return text


def server_stats(base_url):
    """GET /stats of a mock server, given its .../v1 base URL."""
    import httpx

    return httpx.get(base_url.rsplit("/v1", 1)[0] + "/stats", timeout=10).json()


def settled_stats(base_url, timeout=10.0):
    """/stats once nothing is generating or waiting any more (cancelled streams take a moment to unwind)."""
    deadline = time.monotonic() + timeout
    while True:
        st = server_stats(base_url)
        if (st["active"] == 0 and st["waiting"] == 0) or time.monotonic() > deadline:
            return st
        time.sleep(0.05)


def occupancy(timeline, slots):
    """From a /stats occupancy timeline ([t, active] samples): (busy share, share of time with fewer than
    half the slots busy, span s), time-weighted from the first sample with a request running to the last."""
    busy = [i for i, (_, a) in enumerate(timeline) if a > 0]
    if len(busy) < 2:
        return float("nan"), float("nan"), 0.0
    pts = timeline[busy[0]:busy[-1] + 1]
    span = pts[-1][0] - pts[0][0]
    if span <= 0:
        return float("nan"), float("nan"), 0.0
    slot_s = low_s = 0.0
    for (t0, a), (t1, _) in zip(pts, pts[1:]):
        slot_s += min(a, slots) * (t1 - t0)
        low_s += (t1 - t0) if a < slots / 2 else 0.0
    return slot_s / (slots * span), low_s / span, span


def exit_on_sigterm():
    """Turn SIGTERM into SystemExit, so `finally` blocks stop the servers a benchmark started."""
    import signal

    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
