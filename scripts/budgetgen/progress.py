"""Progress of an inference job, and its formatting (shared with budgetgen.watch).

StreamProgress: how far one streaming request has got (what the budget rule counts in flight). Rates:
responses and tokens over a sliding window. RunStats: what this run did (retries, discarded tokens,
errors, responses) and the two progress lines: the full one for logs/inference/D.log and the compact
one for the run's terminal (TERMINAL_LINE reads it back). JobProgress: those lines of a running job,
per dataset and per lane, written where they go.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from typing import TYPE_CHECKING

from . import journal
from .entry import terminal
from .quality import budget_outcome

if TYPE_CHECKING:
    from collections.abc import Callable

    from .settings import InferenceSettings

log = logging.getLogger(__name__)


class Rates:
    """Responses and tokens over a sliding window, for req/s, tok/s and the ETA."""

    def __init__(self, window_s=60.0):
        self.window_s = window_s
        self.events = deque()  # (t, tokens)

    def add(self, tokens: int, now: float | None = None) -> None:
        self.events.append((now or time.monotonic(), tokens))

    def rates(self, now: float | None = None) -> tuple[float, float]:
        now = now or time.monotonic()
        while self.events and now - self.events[0][0] > self.window_s:
            self.events.popleft()
        if not self.events:
            return 0.0, 0.0
        span = max(1e-6, min(self.window_s, now - self.events[0][0]) or 1e-6)
        return len(self.events) / span, sum(t for _, t in self.events) / span


def fmt_eta(seconds: float | None) -> str:
    if seconds is None or seconds != seconds or seconds == float("inf"):
        return "?"
    seconds = int(seconds)
    h, rem = divmod(seconds, 3600)
    m, s = divmod(rem, 60)
    return f"{h}h{m:02d}m" if h else (f"{m}m{s:02d}s" if m else f"{s}s")


NAME_WIDTH = 40  # terminal_line's name column: `D/CELL/validation` names up to 40 characters align


class RunStats:
    """What this run did, for the progress line and the done marker."""

    def __init__(self):
        self.started = time.monotonic()
        self.retries = 0
        self.retry_kinds = {}
        self.discarded_tokens = 0  # streamed by attempts that failed or were cancelled
        self.errors = 0  # permanent errors of this run
        self.responses = 0  # responses journaled by this run
        self.rates = Rates()
        self.budget_passed = False  # the server let reasoning past thinking_budget (said once)

    def responded(self, tokens: int, usage: dict, budget: int | None) -> None:
        """A response of `tokens` journaled; said once per run where the server let its reasoning run past
        thinking_budget `budget` (never a silent ignore: vllm#54906 reports vLLM ignoring it with MTP on)."""
        self.rates.add(tokens)
        self.responses += 1
        passed = budget_outcome(usage, budget)[1]
        if passed is not None and not self.budget_passed:
            self.budget_passed = True
            log.warning(f"the server let a response reason for {passed} tokens, past thinking_budget {budget}: it "
                        "does not enforce the budget (vLLM with speculative decoding: vllm#54906; SGLang with "
                        "EAGLE/MTP speculation); those responses are not flagged reasoning_forced_end")

    def retried(self, exc: Exception) -> None:
        kind = str(exc).split(":")[0]
        self.retries += 1
        self.retry_kinds[kind] = self.retry_kinds.get(kind, 0) + 1

    def progress_line(self, journaled: journal.JournalState, budget: int, inflight: int, streaming: int,
                      queued: int) -> str:
        rps, tps = self.rates.rates()
        pct = 100.0 * journaled.tokens / budget if budget else 100.0
        eta = eta_s(journaled, budget, tps)
        dropped = sum(journaled.dropped.values())
        return (f"progress: {journaled.records} responses{f' ({dropped} dropped)' if dropped else ''}, "
                f"{journaled.tokens}/{budget} kept tokens ({pct:.1f}%), "
                f"{rps:.2f} req/s, {tps:.0f} tok/s, in flight {inflight} ({streaming} tokens streamed), "
                f"queued {queued}, retries {self.retries}, errors {self.errors}, ETA {fmt_eta(eta)}")

    def terminal_line(self, dataset: str, journaled: journal.JournalState, budget: int, inflight: int,
                      state: str = "running", rates: Rates | None = None) -> str:
        """The compact line for the run's terminal: dataset name first, fixed columns, so the lines of
        several datasets running at once stay readable (TERMINAL_LINE reads it back). `rates`: a lane's
        (`D/CELL`), else the dataset's."""
        _, tps = (rates or self.rates).rates()
        pct = 100.0 * journaled.tokens / budget if budget else 100.0
        eta = eta_s(journaled, budget, tps)
        if state.startswith("done"):
            eta = 0  # finished: exhausted short of the budget has nothing left to wait for
        return (f"budgetgen {dataset:<{NAME_WIDTH}} {journaled.tokens:>12,} / {budget:<12,} tok {pct:5.1f}%  "
                f"{tps:>8,.0f} tok/s  in flight {inflight:>5}  errors {self.errors:>5}  "
                f"dropped {sum(journaled.dropped.values()):>5}  ETA {fmt_eta(eta):>8}  {state}")


def eta_s(journaled: journal.JournalState, budget: int, tps: float) -> float | None:
    """Seconds until the kept tokens reach the budget at `tps` generated tokens/s, of which the share the
    quality gate has kept so far counts (None: no rate yet; 0: met)."""
    left = budget - journaled.tokens
    if left <= 0:
        return 0
    keep = journaled.tokens / journaled.generated_tokens if journaled.generated_tokens else 1.0
    return left / (tps * keep) if tps > 0 and keep > 0 else None


# What terminal_line writes, for whoever reads the run's terminal or its Snakemake log (tests, scripts).
TERMINAL_LINE = (r"^budgetgen (?P<dataset>\S+)\s+(?P<tokens>[\d,]+) / (?P<budget>[\d,]+)\s+tok\s+(?P<pct>[\d.]+)%\s+"
                 r"(?P<tps>[\d,]+) tok/s\s+in flight\s+(?P<inflight>\d+)\s+errors\s+(?P<errors>\d+)\s+"
                 r"dropped\s+(?P<dropped>\d+)\s+"
                 r"ETA\s+(?P<eta>\S+)\s+(?P<state>.+)$")


class StreamProgress:
    """How far one streaming request has got: tokens seen, and an estimate of tokens generated.

    Tokens arrive in chunks (a server batches several per SSE event), so at any moment the count
    seen lags what the server has generated by up to a chunk. Summed over a full batch of requests
    in flight that lag made the expected total too low and the rule dispatch too much (+0.2 to
    +0.4 % over the budget in a simulation of 150 streams in 13-token chunks). `generated(now)` adds the tokens
    expected since the last chunk at this stream's own rate, at most one average chunk.
    """

    __slots__ = ("seen", "first_tokens", "first_time", "last_time", "chunks")

    def __init__(self):
        self.reset()

    def reset(self) -> None:
        """Forget what was seen (a retried attempt starts from zero)."""
        self.seen = 0
        self.chunks = 0
        self.first_tokens = self.first_time = self.last_time = 0.0

    def add(self, n: int, now: float, chunks: int = 1) -> None:
        """n tokens in that many chunks, the last arrived at `now` (a stream worker reports the chunks of
        a flush at once: the same chunks, so the same per-chunk lag, as read in the job)."""
        if n <= 0:
            return
        if not self.chunks:
            self.first_tokens, self.first_time = n / chunks, now
        self.seen += n
        self.chunks += chunks
        self.last_time = now

    def generated(self, now: float) -> float:
        if self.chunks < 2 or self.last_time <= self.first_time:
            return self.seen
        later = self.seen - self.first_tokens  # tokens after the first chunk, over its time span
        rate = later / (self.last_time - self.first_time)
        per_chunk = later / (self.chunks - 1)
        return self.seen + min(per_chunk, rate * max(0.0, now - self.last_time))


class JobProgress:
    """The progress lines of one running job: what it has journaled (run_state), what is in flight (the
    job's `inflight` {task: StreamProgress} and `task_lane` {task: LaneRun}, shared, not copied)."""

    def __init__(self, dataset, budget, stats, run_state, inflight, task_lane):
        self.dataset, self.budget, self.stats, self.rs = dataset, budget, stats, run_state
        self.inflight, self.task_lane = inflight, task_lane

    def line(self) -> str:
        rs = self.rs
        line = self.stats.progress_line(rs.journaled, self.budget, len(self.inflight),
                                        sum(p.seen for p in self.inflight.values()), rs.queued())
        if len(rs.lanes) > 1:
            line += "; lanes: " + ", ".join(f"{k} {lr.tokens}/{lr.lane.budget}"
                                            + (f" ({sum(lr.dropped.values())} dropped)" if lr.dropped else "")
                                            for k, lr in rs.lanes.items())
        return line

    def to_terminal(self, state: str = "running") -> None:
        """The compact progress line on the run's terminal (entry.terminal(): under Snakemake, where
        the log lines go to the rule's log), and one per lane (`D/CELL`) for a dataset of several;
        nothing when the job runs from the command line."""
        out = terminal()
        if out is None:
            return
        rs = self.rs
        out.write(self.stats.terminal_line(self.dataset, rs.journaled, self.budget, len(self.inflight), state) + "\n")
        if len(rs.lanes) > 1:
            for k, lr in rs.lanes.items():
                counts = journal.JournalState(path="", tokens=lr.tokens, records=lr.records,
                                              generated_tokens=lr.generated_tokens, dropped=lr.dropped)
                lane_state = state if not state.startswith("done") else \
                    f"done: {'met' if lr.tokens >= lr.lane.budget else 'exhausted'}"
                out.write(self.stats.terminal_line(f"{self.dataset}/{k}", counts, lr.lane.budget,
                                                   sum(1 for t in self.inflight if self.task_lane.get(t) is lr),
                                                   lane_state, rates=lr.rates) + "\n")

    async def tick(self, writer: journal.JournalWriter, settings: InferenceSettings,
                   fail: Callable[[Exception], object]) -> None:
        """The progress lines every server.progress_interval_s (the log) and terminal_progress_interval_s
        (the terminal). Also the fsync clock: appends fsync every 2 s while responses arrive; this tick
        covers a quiet spell after the last one. If it fails (an fsync error), `fail(exc)` hands it to the
        dispatch loop, which raises it: the job fails with its one line."""
        s = settings
        tick = min(s.progress_interval_s, s.terminal_progress_interval_s, 2.0)
        last_line = last_terminal = time.monotonic()
        try:
            while True:
                await asyncio.sleep(tick)
                writer.sync()
                now = time.monotonic()
                if now - last_line >= s.progress_interval_s - 1e-3:
                    last_line = now
                    log.info(self.line())
                if now - last_terminal >= s.terminal_progress_interval_s - 1e-3:
                    last_terminal = now
                    self.to_terminal()
        except Exception as exc:  # noqa: BLE001 - handed to the dispatch loop, which raises it
            fail(exc)
