"""The inference job of one dataset: prompts -> journal, until the token budget is met.

Order of events:
  1. prepare(): load and normalise the prompts, lock the journal, remove what an earlier run
     finished (done marker, raw_responses.jsonl), repair torn tails, scan the journal and errors;
  2. if the journal already meets the budget (or no prompt is left), finish at once;
  3. check the server (one-line error naming the URL);
  4. dispatch generations (budgetgen.conversations: a prompt's, or each turn and sample of it) in the
     seeded order of conversations, at most `concurrency` in flight, while the budget rule
     (budget.DispatchPolicy) allows; journal each response the moment it completes. A conversation's
     next turn joins the head of the queue once its previous turn is journaled (a new request to the
     budget rule), sent to the endpoint its earlier turns went to. Each lane (budgetgen.mixture: a
     mixture cell in a split; one for a plain dataset) has its own queue, budget line and budget rule,
     and claims the next unclaimed prompt of its split when its queue runs dry; the lane furthest
     from its budget line that its rule lets dispatch goes first;
  5. on SIGTERM/SIGINT stop dispatching, cancel what is in flight, fsync, exit non-zero;
  6. when the budget is met or the prompts are exhausted, write the done marker atomically.

The pieces: RunState (what prepare() finds), RequestRetries (one prompt's attempts, backoff and the
unreachable deadline), PermanentErrors (held until a success proves them the prompts'; a streak of
identical ones is the server's), RunStats (counters, rates, the progress line) and InferenceJob
(dispatch, signals, finish). Messages go to the standard `logging` logger of this module.
"""

import asyncio
import logging
import os
import signal
import time
from collections import deque
from dataclasses import dataclass

from . import conversations, journal, mixture
from .budget import DispatchPolicy, LengthModel, StreamProgress, overshoot_pct
from .client import ChatClient, PermanentError, TransientError, backoff_delay
from .errors import UserError, terminal
from .failures import note_cause
from .forecast import human_bytes
from .fsutil import remove_outputs, write_json_atomic
from .launch import LaunchedServer
from .settings import InferenceSettings
from .state import lanes_state
from .status import compute_status, scan_lanes

log = logging.getLogger(__name__)

EXIT_SIGNAL = {signal.SIGTERM: 143, signal.SIGINT: 130}


class ServerDown(Exception):
    pass


class Rates:
    """Responses and tokens over a sliding window, for req/s, tok/s and the ETA."""

    def __init__(self, window_s=60.0):
        self.window_s = window_s
        self.events = deque()  # (t, tokens)

    def add(self, tokens, now=None):
        self.events.append((now or time.monotonic(), tokens))

    def rates(self, now=None):
        now = now or time.monotonic()
        while self.events and now - self.events[0][0] > self.window_s:
            self.events.popleft()
        if not self.events:
            return 0.0, 0.0
        span = max(1e-6, min(self.window_s, now - self.events[0][0]) or 1e-6)
        return len(self.events) / span, sum(t for _, t in self.events) / span


def fmt_eta(seconds):
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

    def retried(self, exc):
        kind = str(exc).split(":")[0]
        self.retries += 1
        self.retry_kinds[kind] = self.retry_kinds.get(kind, 0) + 1

    def progress_line(self, journaled, budget, inflight, streaming, queued):
        rps, tps = self.rates.rates()
        pct = 100.0 * journaled.tokens / budget if budget else 100.0
        left = budget - journaled.tokens
        eta = left / tps if tps > 0 and left > 0 else (0 if left <= 0 else None)
        return (f"progress: {journaled.records} responses, {journaled.tokens}/{budget} tokens ({pct:.1f}%), "
                f"{rps:.2f} req/s, {tps:.0f} tok/s, in flight {inflight} ({streaming} tokens streamed), "
                f"queued {queued}, retries {self.retries}, errors {self.errors}, ETA {fmt_eta(eta)}")

    def terminal_line(self, dataset, journaled, budget, inflight, state="running", rates=None):
        """The compact line for the run's terminal: dataset name first, fixed columns, so the lines of
        several datasets running at once stay readable (TERMINAL_LINE reads it back). `rates`: a lane's
        (`D/CELL`), else the dataset's."""
        _, tps = (rates or self.rates).rates()
        pct = 100.0 * journaled.tokens / budget if budget else 100.0
        left = budget - journaled.tokens
        eta = left / tps if tps > 0 and left > 0 else (0 if left <= 0 else None)
        if state.startswith("done"):
            eta = 0  # finished: exhausted short of the budget has nothing left to wait for
        return (f"budgetgen {dataset:<{NAME_WIDTH}} {journaled.tokens:>12,} / {budget:<12,} tok {pct:5.1f}%  "
                f"{tps:>8,.0f} tok/s  in flight {inflight:>5}  errors {self.errors:>5}  ETA {fmt_eta(eta):>8}  {state}")


# What terminal_line writes, for whoever reads the run's terminal or its Snakemake log (tests, scripts).
TERMINAL_LINE = (r"^budgetgen (?P<dataset>\S+)\s+(?P<tokens>[\d,]+) / (?P<budget>[\d,]+)\s+tok\s+(?P<pct>[\d.]+)%\s+"
                 r"(?P<tps>[\d,]+) tok/s\s+in flight\s+(?P<inflight>\d+)\s+errors\s+(?P<errors>\d+)\s+"
                 r"ETA\s+(?P<eta>\S+)\s+(?P<state>.+)$")


class RequestRetries:
    """One prompt's attempts. Failures of the HTTP class (5xx, 429, a stall, a cut stream) count toward
    max_retries; connection errors (an outage) do not, they retry until the unreachable deadline, which
    runs from the last sign of life of the server (a response completed or any byte received).
    Backoff is exponential with jitter; its exponent counts failures of the kind at hand, so after an
    outage's connection errors a 500 from the server that is back waits like a first retry."""

    def __init__(self, max_retries, deadline_s):
        self.max_retries = max_retries
        self.deadline_s = deadline_s
        self.attempts = 0
        self.http_failures = 0

    def delay_after(self, exc, last_alive, urls):
        """Seconds to wait before the next attempt, or None to give up for this run (raises ServerDown
        when the server has shown no sign of life for the deadline)."""
        down_for = time.monotonic() - last_alive
        if down_for > self.deadline_s:
            raise ServerDown(f"server at {', '.join(urls)} failing for {down_for:.0f} s "
                             f"(deadline {self.deadline_s:g} s; last error: {exc})")
        self.attempts += 1
        self.http_failures += not exc.connection
        if self.http_failures > self.max_retries:
            return None
        step = self.attempts if exc.connection else self.http_failures
        return backoff_delay(min(step, 6), retry_after=exc.retry_after)


class PermanentErrors:
    """This run's permanent errors (a 4xx that is the prompt's, e.g. context too long).

    Each is held until a later request succeeds, which proves the server works and the error the
    prompt's: then it goes to errors.jsonl, with the request params that produced it. A kill loses the
    held ones; their prompts are asked again. FAILURE_STREAK of them in a row with the same status and
    no success between is a server-wide failure (a broken deployment, a setting every request trips
    on): UserError, and none is recorded.
    """

    FAILURE_STREAK = 20

    def __init__(self, path):
        self.path = path
        self.pending = []
        self.streak_status, self.streak = None, 0

    def add(self, gen_id, messages, exc, identity, params, where=None):
        """`identity`, `params`: those of the lane (mixture cell) that made the request."""
        self.pending.append({"id": gen_id, "identity": identity.sha, **(where or {}), "messages": messages,
                             "status": exc.status, "error": exc.message, "identity_settings": identity.settings,
                             "params": params, "created": round(time.time(), 3), "usage": {}})
        self.streak = self.streak + 1 if self.streak_status == exc.status else 1
        self.streak_status = exc.status
        if self.streak >= self.FAILURE_STREAK:
            raise UserError(f"every request fails the same way: {self.streak} in a row with {exc} (last prompt "
                            f"{gen_id}); none recorded as the prompts' errors; fix the server or settings "
                            "and rerun")

    def success(self):
        self.streak_status, self.streak = None, 0
        self.flush()

    def flush(self):
        for rec in self.pending:
            journal.append_error(self.path, rec)
        self.pending.clear()

    def first(self):
        return self.pending[0] if self.pending else None


@dataclass(frozen=True)
class Generation:
    """One request to make: turn k of a chain, after `previous` (turn k-1's journal record; None for k 1),
    for the lane (LaneRun key) that holds its prompt."""

    chain: conversations.Chain
    k: int
    previous: dict | None = None
    lane: str = mixture.DEFAULT_CELL

    @property
    def id(self):
        return self.chain.turn_id(self.k)


@dataclass
class LaneRun:
    """One lane in this run (budgetgen.mixture): its budget line, the chains of the prompts it holds,
    what is left to ask of them (continuations first), its counts, its permanent errors, its budget
    rule over its own lengths."""

    lane: mixture.Lane
    queue: deque
    chains: list
    tokens: int
    records: int
    errored: set
    lengths: LengthModel
    policy: DispatchPolicy
    rates: object = None

    @property
    def key(self):
        return self.lane.key

    @property
    def cell(self):
        return self.lane.cell

    def where(self):
        """What a record of this lane says of it, before its conversation place."""
        return {"cell": self.cell.name, "split": self.lane.split}

    def claim(self, prompt):
        """Take an unclaimed prompt of the lane's split: its chains join the end of the queue."""
        for chain in conversations.chains([prompt], self.cell.plan):
            self.chains.append(chain)
            self.queue.append(Generation(chain, 1, lane=self.key))

    def nothing_left(self, journaled_ids, pool):
        return conversations.left(self.chains, journaled_ids, self.errored).to_ask <= 0 and not pool


@dataclass
class RunState:
    """What prepare() finds: the prompts, the lanes with what each has left to ask (in dispatch order),
    the unclaimed prompts of each split (in dispatch order), the journal's counts and the generations
    failed permanently under the identities that count now."""

    prompt_ids: set
    lanes: dict  # lane key -> LaneRun, in the mixture's order
    pool: dict  # split -> deque of prompts.Prompt no lane holds yet
    journaled: journal.JournalState
    errored: set

    @property
    def chains(self):
        return [c for lr in self.lanes.values() for c in lr.chains]

    def queued(self):
        return sum(len(lr.queue) for lr in self.lanes.values()) + sum(len(p) for p in self.pool.values())


def prepare(s):
    """Lock the journal and read where the dataset stands; returns (lock, RunState)."""
    pset = s.load_prompts()
    log.info(f"Prompts: {len(pset.prompts)} unique in {s.paths.prompts} ({pset.duplicates} duplicates dropped, "
             f"{len(pset.skipped)} bad lines skipped"
             + (f", {pset.in_earlier} left to an earlier dataset (generation.dedup_across_datasets)"
                if pset.in_earlier else "") + ")")
    for line, reason in pset.skipped[:20]:
        log.info(f"  skipped {s.paths.prompts}:{line}: {reason}")
    lock = journal.JournalLock(s.paths.journal).acquire()
    try:
        # The done marker and the files made from the journal say "finished with these settings"; from
        # here on this run decides. Left in place, a run interrupted, refused or failed after a settings
        # change (budget raised, prompts added) would leave them to satisfy the DAG with the old data
        # (Snakemake records the interrupted job's new params, and a consumer whose output exists is not
        # rerun for a missing input), and rows, plots and a summary that look finished. Removed, the next
        # run must go through this job again, and only a run that ends met or exhausted remakes them.
        removed = remove_outputs(s.paths.finished_outputs())
        if removed:
            log.info("Removed the earlier run's outputs until this run ends met or exhausted: " + ", ".join(removed))
        policy, samples, mix = s.policy, s.plan.samples, s.mixture
        journaled = scan_lanes(s, pset.prompts, repair=True)
        if journaled.repaired_bytes:
            log.info(f"Repaired torn journal tail: dropped {journaled.repaired_bytes} bytes")
        if journaled.duplicates:
            log.info(f"Journal holds {journaled.duplicates} duplicate ids (first kept, counted once)")
        # errors.jsonl is append-only too, written only under this lock: its torn tail is cut here
        repaired = journal.repair_tail(s.paths.errors)
        if repaired:
            log.info(f"Repaired torn tail of {s.paths.errors}: dropped {repaired} bytes")
        refusal = policy.refusal(s.dataset, journaled.by_identity)
        if refusal:
            raise UserError(refusal)
    except BaseException:
        lock.release()
        raise
    for name, ident in policy.identities:
        log.info(f"Generation identity{'' if mix.plain else ' of cell ' + name} {ident.sha} ({ident.settings_json}); "
                 f"on_settings_change: {policy.on_change}")
    others = {sha: c for sha, c in journaled.by_identity.items() if sha not in policy.shas}
    if others:
        kept = "counted toward the budget and kept in the outputs" if policy.on_change == "extend" else \
            "kept in the journal, out of every count and output"
        log.info(f"Journal holds records of {len(others)} other identities "
                 f"({sum(c.records for c in others.values())} records, {sum(c.tokens for c in others.values())} "
                 f"tokens): {kept} (generation.on_settings_change: {policy.on_change})")
    by_identity = journal.errors_by_identity(s.paths.errors, samples)
    accounts, pool = mixture.account(mix, policy, pset.prompts, journaled, by_identity)
    errored = set().union(*(by_identity.get(sha, set()) for sha in policy.shas))
    elsewhere = set().union(*by_identity.values()) - errored - journaled.ids
    log.info(f"Resuming: {journaled.records} already done ({journaled.tokens} tokens)"
             + (f", {len(errored)} failed permanently earlier" if errored else "")
             + (f", {len(elsewhere)} failed earlier under other settings (asked again)" if elsewhere else ""))
    log.info(f"remaining budget: {max(0, s.budget - journaled.tokens)} of {s.budget} tokens")
    if not mix.plain:
        log.info("Lanes: " + "; ".join(
            f"{k} {a.tokens}/{a.lane.budget} tokens (share {a.lane.cell.share:g}"
            f"{', validation ' + format(mix.validation_share, 'g') if a.lane.split == mixture.VALIDATION else ''}), "
            f"{len(a.prompts)} prompts held" for k, a in accounts.items())
            + "; unclaimed prompts: " + ", ".join(f"{split} {len(ps)}" for split, ps in pool.items()))
    lanes, started_all = {}, []
    for key, acc in accounts.items():
        started, fresh = [], []
        for c in acc.chains:
            k = c.first_missing(journaled.ids)
            if k is not None and c.turn_id(k) not in errored:
                (started if k > 1 else fresh).append((c, k))
        started_all += [(key, c, k) for c, k in started]
        got = journaled.lanes.get(key)
        lengths = LengthModel(acc.lane.cell.max_tokens, got.lengths if got else ())
        queue = deque(Generation(c, k, lane=key) for c, k in fresh)
        lanes[key] = LaneRun(acc.lane, queue, list(acc.chains), acc.tokens, acc.records,
                             errored & {g for c in acc.chains for g in c.ids()}, lengths,
                             DispatchPolicy(acc.lane.budget, lengths), Rates())
    # conversations under way continue first, each from its last journaled turn
    previous = journal.records_by_id(s.paths.journal, [c.turn_id(k - 1) for _, c, k in started_all],
                                     accepts=policy.accepts, samples=samples)
    for key, c, k in reversed(started_all):
        lanes[key].queue.appendleft(Generation(c, k, previous[c.turn_id(k - 1)], lane=key))
    if started_all:
        log.info(f"Conversations under way: {len(started_all)} continue from their last journaled turn")
    log_forecast(s, journaled)
    return lock, RunState({p.id for p in pset.prompts}, lanes, {k: deque(v) for k, v in pool.items()}, journaled,
                          errored)


def log_forecast(s, journaled):
    """The storage forecast of an EAGLE-3 hidden-state dump of the full budget's rows (budgetgen.forecast):
    completion tokens plus the prompt tokens per completion token the journal shows so far."""
    shape = s.forecast
    if shape is None:
        return
    ratio = journaled.prompt_tokens / journaled.tokens if journaled.tokens else None
    tokens = s.budget * (1 + (ratio or 0))
    log.info(f"Storage forecast: an EAGLE-3 hidden-state dump of this dataset's rows at its full budget needs about "
             f"{human_bytes(shape.bytes_for(tokens))} ({tokens:,.0f} row tokens x {shape.describe()}"
             + (f"; prompt tokens at {ratio:.2f} per completion token, as journaled so far)" if ratio is not None else
                "; completion tokens only, prompt tokens unknown until responses are journaled)"))


class InferenceJob:
    def __init__(self, settings: InferenceSettings):
        self.s = settings
        self.stop_signal = None
        self.inflight = {}  # task -> StreamProgress of its prompt's current attempt
        self.task_lane = {}  # task -> the LaneRun it generates for
        self.deferred = []  # prompts whose retries ran out this run
        self.failed = None  # an exception a background task (fsync clock) died of
        self.last_ok = time.monotonic()
        self.stats = RunStats()
        self.lock = self.run_state = self.errors = None
        self.client = self.server = self.writer = self.wake = None

    # -- requests ------------------------------------------------------------------------
    async def run_one(self, gen, progress):
        s, rs = self.s, self.run_state
        lr = rs.lanes[gen.lane]
        chain, gid = gen.chain, gen.id
        messages = chain.request(gen.k, gen.previous)
        # the turns of a conversation stay on one endpoint (its prefix cache holds their history)
        affinity = chain.id if chain.n_turns > 1 else None
        retries = RequestRetries(s.max_retries, s.unreachable_deadline_s)
        t0 = time.time()
        while True:
            progress.reset()

            def on_token(n, progress=progress):
                progress.add(n, time.monotonic())

            try:
                res = await self.client.chat(messages, lr.cell.params, on_token=on_token,
                                             want_ids=s.want_ids, affinity=affinity)
            except TransientError as exc:
                self.stats.discarded_tokens += progress.seen
                self.stats.retried(exc)
                delay = retries.delay_after(exc, max(self.last_ok, self.client.last_byte), self.client.urls)
                if delay is None:
                    log.info(f"giving up on {gid} for this run after {retries.attempts} attempts: {exc}")
                    self.deferred.append(gen)
                    self.client.pool.forget(chain.id)
                    return
                await asyncio.sleep(delay)
                continue
            except PermanentError as exc:
                self.stats.discarded_tokens += progress.seen
                self.stats.errors += 1
                rs.errored.add(gid)
                lr.errored.add(gid)
                ended = f"; conversation {chain.id} ends at turn {gen.k - 1} of {chain.n_turns}" if gen.k > 1 else ""
                log.info(f"error (not retried) for {gid}: {exc}{ended}")
                self.errors.add(gid, messages, exc, lr.cell.identity, lr.cell.params,
                                {**lr.where(), **chain.where(gen.k)})
                self.client.pool.forget(chain.id)
                return
            break
        self.last_ok = time.monotonic()
        rec = journal.response_record(gid, messages, res, lr.cell.identity, lr.cell.params, t0, retries.attempts + 1,
                                      {**lr.where(), **chain.where(gen.k)})
        self.writer.append(rec)
        if gen.k < chain.n_turns:  # the next turn: a new request, at the head of its lane's queue
            lr.queue.appendleft(Generation(chain, gen.k + 1, rec, lane=lr.key))
        else:
            self.client.pool.forget(chain.id)
        tokens = int(res.usage.get("completion_tokens") or 0)
        rs.journaled.ids.add(gid)
        rs.journaled.tokens += tokens
        rs.journaled.records += 1
        lr.tokens += tokens
        lr.records += 1
        lr.lengths.observe(tokens)
        lr.rates.add(tokens)
        self.stats.rates.add(tokens)
        self.stats.responses += 1
        self.errors.success()

    # -- progress ------------------------------------------------------------------------
    def progress_line(self):
        rs = self.run_state
        line = self.stats.progress_line(rs.journaled, self.s.budget, len(self.inflight),
                                        sum(p.seen for p in self.inflight.values()), rs.queued())
        if len(rs.lanes) > 1:
            line += "; lanes: " + ", ".join(f"{k} {lr.tokens}/{lr.lane.budget}" for k, lr in rs.lanes.items())
        return line

    def to_terminal(self, state="running"):
        """The compact progress line on the run's terminal (errors.terminal(): under Snakemake, where
        the log lines go to the rule's log), and one per lane (`D/CELL`) for a dataset of several;
        nothing when the job runs from the command line."""
        out = terminal()
        if out is not None:
            rs = self.run_state
            out.write(self.stats.terminal_line(self.s.dataset, rs.journaled, self.s.budget, len(self.inflight),
                                               state) + "\n")
            if len(rs.lanes) > 1:
                for k, lr in rs.lanes.items():
                    counts = journal.JournalState(path="", tokens=lr.tokens, records=lr.records)
                    lane_state = state if not state.startswith("done") else \
                        f"done: {'met' if lr.tokens >= lr.lane.budget else 'exhausted'}"
                    out.write(self.stats.terminal_line(f"{self.s.dataset}/{k}", counts, lr.lane.budget,
                                                       sum(1 for t in self.inflight if self.task_lane.get(t) is lr),
                                                       lane_state, rates=lr.rates) + "\n")

    async def progress_loop(self):
        # Also the fsync clock: appends fsync every 2 s while responses arrive; this tick
        # covers a quiet spell after the last one. If it fails (an fsync error), the job fails
        # with its one line: the dispatch loop is woken and raises it.
        s = self.s
        tick = min(s.progress_interval_s, s.terminal_progress_interval_s, 2.0)
        last_line = last_terminal = time.monotonic()
        try:
            while True:
                await asyncio.sleep(tick)
                self.writer.sync()
                now = time.monotonic()
                if now - last_line >= s.progress_interval_s - 1e-3:
                    last_line = now
                    log.info(self.progress_line())
                if now - last_terminal >= s.terminal_progress_interval_s - 1e-3:
                    last_terminal = now
                    self.to_terminal()
        except Exception as exc:  # noqa: BLE001 - handed to the dispatch loop, which raises it
            self.failed = exc
            self.wake.set()

    # -- main loop -----------------------------------------------------------------------
    def _on_signal(self, signum):
        if self.stop_signal is None:
            log.info(f"{signal.Signals(signum).name} received: stop dispatching, cancel in flight, flush")
        self.stop_signal = signum
        self.wake.set()

    async def run(self):
        s = self.s
        self.lock, self.run_state = prepare(s)
        rs = self.run_state
        self.errors = PermanentErrors(s.paths.errors)
        if not any(lr.tokens < lr.lane.budget and (lr.queue or rs.pool[lr.lane.split]) for lr in rs.lanes.values()):
            return self.finish()
        api_key = None
        if s.api_key_env:
            api_key = os.environ.get(s.api_key_env)
            if not api_key:
                raise UserError(f"server.api_key_env names {s.api_key_env!r}, but that environment variable is not set")
        loop = asyncio.get_running_loop()
        self.wake = asyncio.Event()
        for sig in EXIT_SIGNAL:
            loop.add_signal_handler(sig, self._on_signal, sig)
        urls = s.urls
        if s.launch:
            self.server = LaunchedServer(s.launch, s.paths.server_log, model=s.model,
                                         model_path=s.model_path, dataset=s.dataset, port=s.launch_port,
                                         ready_timeout_s=s.launch_ready_timeout_s)
            urls = [self.server.base_url]
        self.client = ChatClient(urls, s.model, api_key=api_key, timeout_s=s.request_timeout_s,
                                 concurrency=s.concurrency, endpoint_concurrency=s.endpoint_concurrency,
                                 recheck_s=s.endpoint_recheck_s, continuous_usage_stats=s.continuous_usage_stats,
                                 engine=s.engine)
        self.writer = journal.JournalWriter(s.paths.journal)
        progress = None
        try:
            if self.server:
                self.server.start()
                await self.server.wait_ready(self.client, stopping=lambda: self.stop_signal is not None)
            if self.stop_signal is None:
                await self.client.check_server(wait_s=s.startup_wait_s)
                where = ", ".join(u for u in self.client.urls)
                cap = f" ({s.endpoint_concurrency} per endpoint)" if s.endpoint_concurrency and len(urls) > 1 else ""
                log.info(f"Server {where} serves {s.model}; dispatching up to {s.concurrency} at once{cap}")
            self.last_ok = time.monotonic()
            self.to_terminal("started")
            progress = asyncio.create_task(self.progress_loop())
            await self.dispatch_loop()
            if self.stop_signal is None and self.stats.errors and not self.stats.responses:
                await self.prove_server()
        finally:
            if progress:
                progress.cancel()
            for task in list(self.inflight):
                task.cancel()
            if self.inflight:
                await asyncio.gather(*self.inflight, return_exceptions=True)
                self.stats.discarded_tokens += sum(p.seen for p in self.inflight.values())
            self.writer.close()
            await self.client.aclose()
            if self.server:
                self.server.stop()
            if len(self.client.urls) > 1:
                log.info("Requests per endpoint: " + ", ".join(
                    f"{e.base_url} {e.requests}" for e in self.client.pool.endpoints))
        if self.stop_signal is not None:
            if rs.journaled.records:
                self.errors.flush()
            log.info(self.progress_line())
            self.to_terminal(f"stopped by {signal.Signals(self.stop_signal).name}")
            log.info(f"Stopped by {signal.Signals(self.stop_signal).name}: journal flushed "
                     f"({rs.journaled.records} responses, {rs.journaled.tokens} tokens); rerun to resume")
            note_cause(f"stopped by {signal.Signals(self.stop_signal).name} (scancel, a time limit, preemption or "
                       f"Ctrl-C) at {rs.journaled.tokens} tokens, journal flushed; rerun to resume")
            return EXIT_SIGNAL[self.stop_signal]
        return self.finish()

    async def prove_server(self):
        """Every request of this run failed permanently: that the server works under these settings must
        be proved in this run before the errors are the prompts' (an earlier run's records prove nothing
        about a setting changed since). One prompt answered before is asked again (the answer is not
        kept): answered, the errors are recorded and the run goes on to its end; refused too, the
        settings are at fault: one line, nothing recorded."""
        s, rs = self.s, self.run_state
        first = self.errors.first()
        failed = f"{self.stats.errors} requests of this run failed permanently (first: {first['id']}: HTTP " \
                 f"{first['status']}: {first['error'][:200]})"
        probe, lr = next(((c, lr) for lr in rs.lanes.values() for c in lr.chains if c.turn_id(1) in rs.journaled.ids),
                         (None, None))
        if probe is None:
            raise UserError(f"no response from the server for any prompt of this run: {failed}; nothing recorded; "
                            f"{likely_setting(first['error'], s)}")
        log.info(f"{failed}; asking {probe.turn_id(1)}, answered before, again to tell the prompts' errors "
                 "from the server's or the settings'")
        retries = RequestRetries(s.max_retries, s.unreachable_deadline_s)
        while True:
            try:
                await self.client.chat(probe.request(1), lr.cell.params, want_ids=s.want_ids)
                break
            except TransientError as exc:
                delay = retries.delay_after(exc, max(self.last_ok, self.client.last_byte), self.client.urls)
                if delay is None:
                    raise UserError(f"{failed}, and {probe.turn_id(1)}, answered before, now fails too: {exc}; "
                                    "nothing recorded; rerun when the server answers") from None
                await asyncio.sleep(delay)
            except PermanentError as exc:
                raise UserError(f"{failed}, and {probe.turn_id(1)}, answered before, now fails the same way ({exc}): "
                                f"the settings, not the prompts, are at fault; nothing recorded; "
                                f"{likely_setting(str(exc), s)}") from None
        log.info(f"{probe.turn_id(1)} answered: the server works under these settings; the errors are the prompts'")
        self.errors.success()

    def generated_in_flight(self, lane):
        now = time.monotonic()
        return [p.generated(now) for t, p in self.inflight.items() if self.task_lane[t] is lane]

    def next_generation(self):
        """The next request: from the lane furthest from its budget line (by share of it expected: the
        tokens journaled and those its requests in flight are expected to end with, by its budget rule's
        length model) whose budget rule lets it dispatch and that has a generation to ask or an
        unclaimed prompt of its split to take; None when no lane may. Counting what is in flight keeps
        the lanes of a small split (a validation split of a few prompts) from all claiming prompts
        while nothing has finished: they draw in proportion to their lines."""
        rs = self.run_state
        ready = []
        for lr in rs.lanes.values():
            inflight = self.generated_in_flight(lr)
            if (lr.queue or rs.pool[lr.lane.split]) and lr.policy.may_dispatch(lr.tokens, inflight):
                expected = lr.policy.expected_total(lr.tokens, inflight)[0] if inflight else lr.tokens
                ready.append((expected / lr.lane.budget if lr.lane.budget else float("inf"), lr))
        if not ready:
            return None
        lr = min(ready, key=lambda x: x[0])[1]
        if not lr.queue:
            lr.claim(rs.pool[lr.lane.split].popleft())
        return lr.queue.popleft()

    async def dispatch_loop(self):
        s, rs = self.s, self.run_state
        while self.stop_signal is None:
            if self.failed is not None:
                raise self.failed
            while len(self.inflight) < s.concurrency:
                gen = self.next_generation()
                if gen is None:
                    break
                progress = StreamProgress()
                task = asyncio.create_task(self.run_one(gen, progress))
                self.inflight[task] = progress
                self.task_lane[task] = rs.lanes[gen.lane]
            if not self.inflight:
                return
            self.wake.clear()
            waiter = asyncio.create_task(self.wake.wait())
            done, _ = await asyncio.wait(list(self.inflight) + [waiter], return_when=asyncio.FIRST_COMPLETED)
            waiter.cancel()
            for task in done:
                if task is waiter:
                    continue
                self.inflight.pop(task)
                self.task_lane.pop(task, None)
                exc = task.exception()
                if isinstance(exc, ServerDown):
                    raise UserError(str(exc))
                if exc is not None:
                    raise exc

    def finish(self):
        s, rs, stats = self.s, self.run_state, self.stats
        st = rs.journaled
        lanes = {k: {"tokens": lr.tokens, "budget": lr.lane.budget, "responses": lr.records,
                     "exhausted": not self.deferred and lr.nothing_left(st.ids, rs.pool[lr.lane.split])}
                 for k, lr in rs.lanes.items()}
        state = lanes_state(lanes)
        met = state == "met"
        left = conversations.left(rs.chains, st.ids, rs.errored)
        log.info(self.progress_line())
        if self.deferred and not met:  # with the budget met, a deferred prompt is simply not needed
            if st.records:
                self.errors.flush()
            log.info(f"{len(self.deferred)} requests still failing after {s.max_retries} retries; rerun to retry them")
            self.to_terminal(f"partial: {len(self.deferred)} requests still failing; rerun")
            note_cause(f"{len(self.deferred)} requests still failing after {s.max_retries} retries "
                       "(server.max_retries); their errors are in the log; rerun to retry them")
            return 1
        if state == "exhausted" and st.records == 0:
            # errors alone never make a dataset "exhausted": without one response there is no proof
            # that the prompts, not the server or the settings, are at fault (nothing is recorded)
            first = self.errors.first()
            why = f" (first: {first['id']}: HTTP {first['status']}: {first['error']})" if first else ""
            raise UserError(f"no response from the server for any prompt: {stats.errors} failed permanently "
                            f"in this run{why}; nothing recorded; fix the server or settings and rerun")
        self.errors.flush()
        log.info(f"Done: budget {state}: kept {st.tokens} tokens in {st.records} responses, budget {s.budget} "
                 f"({overshoot_pct(st.tokens, s.budget):+.3f}%), discarded {stats.discarded_tokens} tokens, "
                 f"retries {stats.retries} {stats.retry_kinds or ''}, errors {len(rs.errored)}".rstrip()
                 + (f"; conversations: {len(rs.chains)}, {left.chains_open} not finished, "
                    f"{left.chains_ended_by_error} ended by an error" if s.plan.turns == "all" else ""))
        if len(lanes) > 1:
            log.info("Lanes: " + "; ".join(
                f"{k}: {v['tokens']}/{v['budget']} ({overshoot_pct(v['tokens'], v['budget']):+.3f}%), "
                f"{v['responses']} responses, {lanes_state({k: v})}" for k, v in lanes.items()))
        self.to_terminal(f"done: {state}")
        if state == "partial":
            note_cause(f"stopped short of the budget at {st.tokens} of {s.budget} tokens (partial); rerun to resume")
            return 1
        write_json_atomic(s.paths.done, {
            "dataset": s.dataset, "state": state, "tokens": st.tokens, "responses": st.records,
            "budget": s.budget, "prompts": len(rs.prompt_ids), "conversations": len(rs.chains),
            "conversations_ended_by_error": left.chains_ended_by_error, "errors": len(rs.errored),
            "discarded_tokens": stats.discarded_tokens, "retries": stats.retries,
            "overshoot_pct": round(overshoot_pct(st.tokens, s.budget), 4), **s.policy.key(),
            "lanes": {k: {**rs.lanes[k].lane.describe(), **v} for k, v in lanes.items()},
            "wall_s": round(time.monotonic() - stats.started, 2),
        })
        return 0

    def close(self):
        """Rewrite the status checkpoint's file with the journal's counts as this run leaves it (the
        checkpoint wrote it before the run, and never runs again for it), then release the journal."""
        if not self.lock:
            return
        try:
            write_json_atomic(self.s.paths.status, compute_status(self.s))
        except Exception as exc:  # never hide why the run ended; the next checkpoint run recounts
            log.info(f"budget status not rewritten ({self.s.paths.status}): {exc}")
        finally:
            self.lock.release()


def likely_setting(message, s):
    """The setting a permanent error that every request meets most likely comes from, for its one line."""
    text = message.lower()
    if any(w in text for w in ("context", "max_tokens", "maximum", "too long", "length")):
        return (f"likely generation.max_tokens ({s.max_tokens}): prompt + max_tokens past the model's context "
                "length; lower it")
    return ("likely a setting every request sends: server.model, generation.temperature / top_p / extra_body "
            "(e.g. a chat_template_kwargs key the server refuses)")


def run(settings):
    job = InferenceJob(settings)
    try:
        return asyncio.run(job.run())
    finally:
        job.close()
