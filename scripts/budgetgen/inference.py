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

The pieces, one module per concern: budgetgen.plan (prepare(), RunState: what the job finds and has
left to ask, the dispatch order), budgetgen.retries (RequestRetries: one prompt's attempts, backoff and
the unreachable deadline; PermanentErrors: held until a success proves them the prompts', a streak of
identical ones is the server's), budgetgen.progress (RunStats, the progress lines, shared with watch),
budgetgen.breaker (the breaker: an endpoint whose responses went bad cut off, its responses blamed),
budgetgen.outcome (finish(): the outcome and the done marker; the failures of a server that makes no
data), and here InferenceJob (the dispatch loop, signals).
Messages go to the standard `logging` logger of this module.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import time
from typing import TYPE_CHECKING

from . import journal
from .breaker import Blame, Breaker, Response
from .client import ChatClient
from .errors import UserError
from .launch import LaunchedServer
from .outcome import EXIT_SIGNAL, finish, keep_failure, prove_server, release, server_broken, stopped
from .plan import Generation, prepare
from .progress import JobProgress, RunStats, StreamProgress
from .retries import PermanentErrors, RequestRetries, ServerDown
from .settings import InferenceSettings
from .stream_workers import StreamWorkers
from .streams import PermanentError, TransientError
from .turn_format import special_tokens

if TYPE_CHECKING:
    from typing import Any

    from .plan import LaneRun
    from .streams import ChatResult

log = logging.getLogger(__name__)

class InferenceJob:
    """One dataset's inference: the dispatch loop over its lanes, signals, and the counts it journals."""

    def __init__(self, settings: InferenceSettings):
        self.s = settings
        # task -> StreamProgress of its prompt's current attempt; task -> the LaneRun it generates for
        self.inflight, self.task_lane = {}, {}
        self.deferred = []  # prompts whose retries ran out this run
        self.failed = None  # an exception a background task (fsync clock) died of
        self.last_ok, self.stats = time.monotonic(), RunStats()
        self.lock = self.run_state = self.errors = self.progress = self.stop_signal = None
        self.client = self.server = self.writer = self.wake = self.blame = self.api_key = None
        self.specials = ()  # the target tokenizer's special tokens (quality's template_leak), read as it starts

    async def run_one(self, gen: Generation, progress: StreamProgress) -> None:
        """Ask one generation (its attempts: ask()) and journal its response."""
        lr, chain = self.run_state.lanes[gen.lane], gen.chain
        messages = chain.request(gen.k, gen.previous)
        # the turns of a conversation stay on one endpoint (its prefix cache holds their history)
        affinity = chain.id if chain.n_turns > 1 else None
        t0 = time.time()
        answer = await ask(self, gen, lr, messages, progress, affinity)
        if answer is not None:
            record_response(self, gen, lr, messages, answer[0], t0, answer[1])

    def fail(self, exc: Exception) -> None:
        """A background task (the fsync clock) died of exc: the dispatch loop is woken and raises it."""
        self.failed = exc
        self.wake.set()

    def _on_signal(self, signum):
        if self.stop_signal is None:
            log.info(f"{signal.Signals(signum).name} received: stop dispatching, cancel in flight, flush")
        self.stop_signal = signum
        self.wake.set()

    async def run(self) -> int:
        s = self.s
        self.lock, self.run_state = prepare(s)
        rs = self.run_state
        self.errors = PermanentErrors(s.paths.errors)
        self.progress = JobProgress(s.dataset, s.budget, self.stats, rs, self.inflight, self.task_lane)
        if not any(lr.tokens < lr.lane.budget and (lr.queue or rs.pool[lr.lane.split]) for lr in rs.lanes.values()):
            return finish(self)
        self.client, self.server, self.api_key = connect(s)
        self.blame = Blame(Breaker(*s.breaker), rs, self.client.pool, s.paths.journal)
        self.specials = special_tokens(s.tokenizer_path)
        loop = asyncio.get_running_loop()
        self.wake = asyncio.Event()
        for sig in EXIT_SIGNAL:
            loop.add_signal_handler(sig, self._on_signal, sig)
        self.writer = journal.JournalWriter(s.paths.journal)
        await self.serve()
        if self.stop_signal is not None:
            return stopped(self)
        return finish(self)

    async def serve(self) -> None:
        """Start (a launched server), check the server, dispatch until done or stopped; always closes
        what it opened and cancels what is in flight."""
        s, progress = self.s, None
        try:
            if self.server:
                self.server.start()
                await self.server.wait_ready(self.client, stopping=lambda: self.stop_signal is not None)
            if self.stop_signal is None:
                await self.client.check_server(wait_s=s.startup_wait_s)
                if self.server and s.canary is not None:  # no server before this job started it: asked here
                    log.info(await s.canary.check(self.client.urls, self.api_key, self.specials))
                urls = self.client.urls
                cap = f" ({s.endpoint_concurrency} per endpoint)" if s.endpoint_concurrency and len(urls) > 1 else ""
                log.info(f"Server {', '.join(urls)} serves {s.model}; dispatching up to {s.concurrency} at once{cap}")
            self.last_ok = time.monotonic()
            self.progress.to_terminal("started")
            progress = asyncio.create_task(self.progress.tick(self.writer, s, self.fail))
            await self.dispatch_loop()
            if self.stop_signal is None and self.stats.errors and not self.stats.responses:
                await prove_server(self)
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
            log_endpoint_requests(self.client)

    def generated_in_flight(self, lane: LaneRun) -> list[float]:
        return [p.generated(time.monotonic()) for t, p in self.inflight.items() if self.task_lane[t] is lane]

    async def dispatch_loop(self) -> None:
        s, rs = self.s, self.run_state
        while self.stop_signal is None:
            if self.failed is not None:
                raise self.failed
            if self.blame.none_left:
                raise UserError(server_broken(self))
            if why := keep_failure(self, final=False):
                raise UserError(why)
            while len(self.inflight) < s.concurrency:
                gen = rs.next_generation(self.generated_in_flight)
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
                if exc is not None and self.blame.none_left:  # (one that waited for an endpoint: none is left)
                    raise UserError(server_broken(self))
                if isinstance(exc, ServerDown):
                    raise UserError(str(exc))
                if exc is not None:
                    raise exc


def record_response(job: InferenceJob, gen: Generation, lr: LaneRun, messages: list[dict[str, Any]],
                    res: ChatResult, t0: float, attempts: int) -> None:
    """Journal one response and count it: the next turn of its conversation joins the head of its lane."""
    rs, chain, gid = job.run_state, gen.chain, gen.id
    if job.blame.follows_blamed(gen):  # built on a turn blamed since it was asked: not data, not journaled
        job.stats.discarded_tokens += int(res.usage.get("completion_tokens") or 0)
        return
    job.last_ok = time.monotonic()
    rec = journal.response_record(gid, messages, res, lr.cell.identity, lr.cell.params, t0, attempts,
                                  {**lr.where(), **chain.where(gen.k)}, job.s.reasoning_tags, job.specials)
    job.writer.append(rec)
    tokens = int(res.usage.get("completion_tokens") or 0)
    fate = lr.cell.gate.fate(rec["flags"], tokens)
    job.stats.responded(tokens, res.usage, lr.cell.params.get("thinking_budget"))
    response = Response.of(gen, lr, rec, tokens, fate)
    if job.blame.judge(response, res.endpoint):  # blamed on the server: counts nowhere, asked again
        return
    if gen.k < chain.n_turns:  # the next turn: a new request, at the head of its lane's queue
        lr.queue.appendleft(Generation(chain, gen.k + 1, rec, lane=lr.key))
    else:
        job.client.pool.forget(chain.id)
    rs.count(lr, gid, tokens, fate)
    job.blame.counts(response)
    job.errors.success()


async def ask(job: InferenceJob, gen: Generation, lr: LaneRun, messages: list[dict[str, Any]],
              progress: StreamProgress, affinity: str | None) -> tuple[ChatResult, int] | None:
    """One generation's attempts: (the response, attempts), or None when it failed permanently (held in
    job.errors) or ran out of retries for this run (deferred)."""
    s, rs, chain, gid = job.s, job.run_state, gen.chain, gen.id
    retries = RequestRetries(s.max_retries, s.unreachable_deadline_s)
    while True:
        progress.reset()

        def on_token(n, chunks=1, now=None, progress=progress):
            progress.add(n, time.monotonic() if now is None else now, chunks)

        try:
            res = await job.client.chat(messages, lr.cell.params, on_token=on_token,
                                         want_ids=s.want_ids, affinity=affinity)
        except TransientError as exc:
            job.stats.discarded_tokens += progress.seen
            if job.blame.follows_blamed(gen):  # its history holds a turn blamed since: dropped, not retried
                return None
            job.stats.retried(exc)
            delay = retries.delay_after(exc, max(job.last_ok, job.client.last_byte), job.client.urls)
            if delay is None:
                log.info(f"giving up on {gid} for this run after {retries.attempts} attempts: {exc}")
                job.deferred.append(gen)
                job.client.pool.forget(chain.id)
                return None
            await asyncio.sleep(delay)
            continue
        except PermanentError as exc:
            job.stats.discarded_tokens += progress.seen
            if job.blame.follows_blamed(gen):  # its history holds a blamed turn: not the prompt's error
                return None
            job.stats.errors += 1
            rs.errored.add(gid)
            lr.errored.add(gid)
            ended = f"; conversation {chain.id} ends at turn {gen.k - 1} of {chain.n_turns}" if gen.k > 1 else ""
            log.info(f"error (not retried) for {gid}: {exc}{ended}")
            job.errors.add(gid, messages, exc, lr.cell.identity, lr.cell.params,
                            {**lr.where(), **chain.where(gen.k)})
            job.client.pool.forget(chain.id)
            return None
        return res, retries.attempts + 1


def connect(s: InferenceSettings) -> tuple[ChatClient, LaunchedServer | None, str | None]:
    """(client, launched server or None, API key) of a job: the server it launches with server.launch; the
    API key from the environment."""
    api_key = None
    if s.api_key_env:
        api_key = os.environ.get(s.api_key_env)
        if not api_key:
            raise UserError(f"server.api_key_env names {s.api_key_env!r}, but that environment variable is not set")
    urls, server = s.urls, None
    if s.launch:
        server = LaunchedServer(s.launch, s.paths.server_log, model=s.model,
                                     model_path=s.model_path, dataset=s.dataset, port=s.launch_port,
                                     ready_timeout_s=s.launch_ready_timeout_s)
        urls = [server.base_url]
    workers = None
    if s.client_processes:
        workers = StreamWorkers(s.client_processes, api_key_env=s.api_key_env, concurrency=s.concurrency,
                                engine=s.engine)
    client = ChatClient(urls, s.model, api_key=api_key, timeout_s=s.request_timeout_s,
                             concurrency=s.concurrency, endpoint_concurrency=s.endpoint_concurrency,
                             recheck_s=s.endpoint_recheck_s, continuous_usage_stats=s.continuous_usage_stats,
                             engine=s.engine, thinking_processor=s.thinking_processor, workers=workers)
    return client, server, api_key


def log_endpoint_requests(client: ChatClient) -> None:
    if len(client.urls) > 1:
        log.info("Requests per endpoint: " + ", ".join(f"{e.base_url} {e.requests}" for e in client.pool.endpoints))


def run(settings: InferenceSettings) -> int:
    job = InferenceJob(settings)
    try:
        return asyncio.run(job.run())
    finally:
        release(job)
