"""The inference job of one dataset: prompts -> journal, until the token budget is met.

Order of events:
  1. load and normalise the prompts (budgetgen.prompts), lock the journal, repair a torn tail, scan it;
  2. if the journal already meets the budget (or no prompt is left), finish at once;
  3. check the server (one-line error naming the URL);
  4. dispatch prompts in the seeded order, at most `concurrency` in flight, while the budget rule
     (budget.DispatchPolicy) allows; journal each response the moment it completes;
  5. on SIGTERM/SIGINT stop dispatching, cancel what is in flight, fsync, exit non-zero;
  6. when the budget is met or the prompts are exhausted, write the done marker atomically.
"""

import asyncio
import os
import signal
import time
from collections import deque
from dataclasses import dataclass, field

from . import journal, prompts, status
from .budget import DispatchPolicy, LengthModel, StreamProgress, overshoot_pct
from .client import ChatClient, PermanentError, TransientError, backoff_delay
from .errors import UserError
from .fsutil import write_json_atomic
from .launch import LaunchedServer
from .params import params_sha256, request_params
from .state import prompts_left

EXIT_SIGNAL = {signal.SIGTERM: 143, signal.SIGINT: 130}


@dataclass
class Settings:
    dataset: str
    prompts: str
    journal: str
    errors: str
    done: str
    budget: int
    base_url: str | list  # one URL or several (requests go to the least-loaded healthy one)
    model: str
    max_tokens: int = 1024
    concurrency: int = 64
    temperature: float | None = None
    top_p: float | None = None
    seed: int = 0
    extra_body: dict = field(default_factory=dict)
    api_key_env: str | None = None
    request_timeout_s: float = 600.0
    max_retries: int = 8
    unreachable_deadline_s: float = 600.0
    startup_wait_s: float = 10.0
    progress_interval_s: float = 10.0
    on_bad_line: str = "error"
    return_token_ids: bool | str = False  # False, "vllm" (True) or "sglang": which API asks for the ids
    continuous_usage_stats: bool = True  # ask for usage on every chunk (exact tokens in flight)
    endpoint_concurrency: int = 0  # per endpoint; 0 = no cap but `concurrency`
    endpoint_recheck_s: float = 10.0
    stale_outputs: tuple = ()  # files made from the journal (raw_responses.jsonl): removed at start
    launch: str | None = None  # command template of a server this job starts, uses and stops
    launch_log: str | None = None
    model_path: str | None = None
    launch_port: int = 0
    launch_ready_timeout_s: float = 1800.0

    @property
    def urls(self):
        return [self.base_url] if isinstance(self.base_url, str) else list(self.base_url)

    def request_params(self):
        """The request parameters that affect content; recorded with every response and error."""
        return request_params(self.model, self.max_tokens, self.temperature, self.top_p, self.extra_body)


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


class InferenceJob:
    # This many permanent errors in a row with the same status and no success between them is a
    # server-wide failure (a broken deployment, a setting every request trips on), not bad prompts:
    # the job fails in one line and records none of them.
    FAILURE_STREAK = 20

    def __init__(self, settings: Settings, log=print):
        self.s = settings
        self.log = log
        self.stop_signal = None
        self.inflight = {}  # task -> StreamProgress of its prompt's current attempt
        self.retries = 0
        self.retry_kinds = {}
        self.discarded_tokens = 0  # streamed by attempts that failed or were cancelled
        self.errors = 0
        self.deferred = []  # prompts whose retries ran out this run
        # Permanent errors wait here until a later request succeeds (proof that the server works and
        # the error is the prompt's): then they go to errors.jsonl. A kill loses them; they are asked again.
        self.pending_errors = []
        self.streak = (None, 0, None)  # (status, count, last error) of permanent errors since a success
        self.successes = 0  # responses journaled by this run
        self.failed = None  # an exception a background task (fsync clock) died of
        self.started = time.monotonic()
        self.last_ok = time.monotonic()
        self.rates = Rates()

    # -- state ---------------------------------------------------------------------------
    def load(self):
        s = self.s
        pset = prompts.load_prompts(s.prompts, on_bad_line=s.on_bad_line)
        self.log(f"Prompts: {len(pset.prompts)} unique in {s.prompts} ({pset.duplicates} duplicates dropped, "
                 f"{len(pset.skipped)} bad lines skipped)")
        for line, reason in pset.skipped[:20]:
            self.log(f"  skipped {s.prompts}:{line}: {reason}")
        self.lock = journal.JournalLock(s.journal).acquire()
        # The done marker and the files finalized from the journal say "finished with these settings";
        # from here on this run decides. Left in place, a run interrupted after a settings change
        # (budget raised, prompts added) would leave them to satisfy the DAG with the old data: Snakemake
        # records the interrupted job's new params, and a consumer whose output exists is not rerun
        # for a missing input. Removed, the next run must go through this job again.
        for path in (s.done, *s.stale_outputs):
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass
        self.state = journal.scan(s.journal, repair=True)
        if self.state.repaired_bytes:
            self.log(f"Repaired torn journal tail: dropped {self.state.repaired_bytes} bytes")
        if self.state.duplicates:
            self.log(f"Journal holds {self.state.duplicates} duplicate ids (first kept, counted once)")
        # errors.jsonl is append-only too, written only under this lock: its torn tail is cut here
        repaired = journal.scan(s.errors, repair=True).repaired_bytes
        if repaired:
            self.log(f"Repaired torn tail of {s.errors}: dropped {repaired} bytes")
        self.params = s.request_params()
        by_params = status.errors_by_params(s.errors)
        self.errored = set(by_params.get(params_sha256(self.params), ()))
        elsewhere = set().union(*by_params.values()) - self.errored - self.state.ids
        self.log(f"Resuming: {self.state.records} already done ({self.state.tokens} tokens)"
                 + (f", {len(self.errored)} failed permanently earlier" if self.errored else "")
                 + (f", {len(elsewhere)} failed earlier under other settings (asked again)" if elsewhere else ""))
        self.log(f"remaining budget: {max(0, s.budget - self.state.tokens)} of {s.budget} tokens")
        by_id = {p.id: p for p in pset.prompts}
        todo = [i for i in prompts.dispatch_order(by_id, s.seed)
                if i not in self.state.ids and i not in self.errored]
        self.queue = deque(by_id[i] for i in todo)
        self.total_prompts = len(by_id)
        self.prompt_ids = set(by_id)
        self.model = LengthModel(s.max_tokens, self.state.lengths)
        self.policy = DispatchPolicy(s.budget, self.model)

    # -- requests ------------------------------------------------------------------------
    async def run_one(self, prompt, progress):
        s = self.s
        messages = [dict(m) for m in prompt.messages]
        attempt = 0
        http_retries = 0  # connection errors retry until the deadline and do not use up max_retries
        t0 = time.time()
        while True:
            progress.reset()

            def on_token(n, progress=progress):
                progress.add(n, time.monotonic())

            try:
                res = await self.client.chat(messages, self.params, on_token=on_token,
                                             return_token_ids=s.return_token_ids)
            except TransientError as exc:
                self.discarded_tokens += progress.seen
                kind = str(exc).split(":")[0]
                self.retries += 1
                self.retry_kinds[kind] = self.retry_kinds.get(kind, 0) + 1
                # any byte received proves the server alive: long streams still delivering count
                down_for = time.monotonic() - max(self.last_ok, self.client.last_byte)
                if down_for > s.unreachable_deadline_s:
                    raise ServerDown(f"server at {', '.join(self.client.urls)} failing for {down_for:.0f} s "
                                     f"(deadline {s.unreachable_deadline_s:g} s; last error: {exc})") from None
                attempt += 1
                http_retries += not exc.connection
                if http_retries > s.max_retries:
                    self.log(f"giving up on {prompt.id} for this run after {attempt} attempts: {exc}")
                    self.deferred.append(prompt)
                    return
                # the exponent counts failures of this kind: after an outage's connection errors, a
                # 500 or 429 from the server that is back waits like a first retry, not up to the cap
                step = attempt if exc.connection else http_retries
                await asyncio.sleep(backoff_delay(min(step, 6), retry_after=exc.retry_after))
                continue
            except PermanentError as exc:
                self.discarded_tokens += progress.seen
                self.permanent_error(prompt, messages, exc)
                return
            break
        self.last_ok = time.monotonic()
        self.successes += 1
        self.streak = (None, 0, None)
        assistant = {"role": "assistant", "content": res.content}
        if res.reasoning:
            assistant["reasoning_content"] = res.reasoning
        tokens = int(res.usage.get("completion_tokens") or 0)
        self.writer.append({
            "id": prompt.id,
            "messages": messages + [assistant],
            "finish_reason": res.finish_reason,
            "params": self.params,
            "served_model": res.model,
            "created": round(t0, 3),
            "latency_s": round(time.time() - t0, 3),
            "attempts": attempt + 1,
            "usage": res.usage,
            **({"prompt_token_ids": res.prompt_token_ids} if res.prompt_token_ids else {}),
            **({"completion_token_ids": res.token_ids} if res.token_ids else {}),
        })
        self.state.ids.add(prompt.id)
        self.state.tokens += tokens
        self.state.records += 1
        self.model.observe(tokens)
        self.rates.add(tokens)
        self.flush_errors()

    def permanent_error(self, prompt, messages, exc):
        """Hold a permanent error until a success proves it the prompt's; fail on a streak of them."""
        self.errors += 1
        self.errored.add(prompt.id)
        self.pending_errors.append({"id": prompt.id, "messages": messages, "status": exc.status,
                                    "error": exc.message, "params": self.params,
                                    "created": round(time.time(), 3), "usage": {}})
        self.log(f"error (not retried) for {prompt.id}: {exc}")
        status_, count, _ = self.streak
        count = count + 1 if status_ == exc.status else 1
        self.streak = (exc.status, count, exc)
        if count >= self.FAILURE_STREAK:
            raise UserError(f"every request fails the same way: {count} in a row with {exc} (last prompt "
                            f"{prompt.id}); none recorded as the prompts' errors; fix the server or settings "
                            "and rerun")

    def flush_errors(self):
        for rec in self.pending_errors:
            journal.append_error(self.s.errors, rec)
        self.pending_errors.clear()
    # -- progress ------------------------------------------------------------------------
    def progress_line(self):
        s, st = self.s, self.state
        rps, tps = self.rates.rates()
        pct = 100.0 * st.tokens / s.budget if s.budget else 100.0
        streaming = sum(p.seen for p in self.inflight.values())
        eta = (s.budget - st.tokens) / tps if tps > 0 and st.tokens < s.budget else (0 if st.tokens >= s.budget else None)
        return (f"progress: {st.records} responses, {st.tokens}/{s.budget} tokens ({pct:.1f}%), "
                f"{rps:.2f} req/s, {tps:.0f} tok/s, in flight {len(self.inflight)} ({streaming} tokens streamed), "
                f"queued {len(self.queue)}, retries {self.retries}, errors {self.errors}, ETA {fmt_eta(eta)}")

    async def progress_loop(self):
        # Also the fsync clock: appends fsync every 2 s while responses arrive; this tick
        # covers a quiet spell after the last one. If it fails (an fsync error), the job fails
        # with its one line: the dispatch loop is woken and raises it.
        tick = min(self.s.progress_interval_s, 2.0)
        last_line = time.monotonic()
        try:
            while True:
                await asyncio.sleep(tick)
                self.writer.sync()
                if time.monotonic() - last_line >= self.s.progress_interval_s - 1e-3:
                    last_line = time.monotonic()
                    self.log(self.progress_line())
        except Exception as exc:  # noqa: BLE001 - handed to the dispatch loop, which raises it
            self.failed = exc
            self.wake.set()

    # -- main loop -----------------------------------------------------------------------
    def _on_signal(self, signum):
        if self.stop_signal is None:
            self.log(f"{signal.Signals(signum).name} received: stop dispatching, cancel in flight, flush")
        self.stop_signal = signum
        self.wake.set()

    async def run(self):
        s = self.s
        self.load()
        if self.state.tokens >= s.budget or not self.queue:
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
        self.server = None
        if s.launch:
            self.server = LaunchedServer(s.launch, s.launch_log or f"{s.journal}.server.log", model=s.model,
                                         model_path=s.model_path, dataset=s.dataset, port=s.launch_port,
                                         ready_timeout_s=s.launch_ready_timeout_s, log=self.log)
            urls = [self.server.base_url]
        self.client = ChatClient(urls, s.model, api_key=api_key, timeout_s=s.request_timeout_s,
                                 concurrency=s.concurrency, endpoint_concurrency=s.endpoint_concurrency,
                                 recheck_s=s.endpoint_recheck_s, log=self.log,
                                 continuous_usage_stats=s.continuous_usage_stats)
        self.writer = journal.JournalWriter(s.journal)
        progress = None
        try:
            if self.server:
                self.server.start()
                await self.server.wait_ready(self.client, stopping=lambda: self.stop_signal is not None)
            if self.stop_signal is None:
                await self.client.check_server(wait_s=s.startup_wait_s)
                where = ", ".join(u for u in self.client.urls)
                cap = f" ({s.endpoint_concurrency} per endpoint)" if s.endpoint_concurrency and len(urls) > 1 else ""
                self.log(f"Server {where} serves {s.model}; dispatching up to {s.concurrency} at once{cap}")
            self.last_ok = time.monotonic()
            progress = asyncio.create_task(self.progress_loop())
            await self.dispatch_loop()
        finally:
            if progress:
                progress.cancel()
            for task in list(self.inflight):
                task.cancel()
            if self.inflight:
                await asyncio.gather(*self.inflight, return_exceptions=True)
                self.discarded_tokens += sum(p.seen for p in self.inflight.values())
            self.writer.close()
            await self.client.aclose()
            if self.server:
                self.server.stop()
            if len(self.client.urls) > 1:
                self.log("Requests per endpoint: " + ", ".join(
                    f"{e.base_url} {e.requests}" for e in self.client.pool.endpoints))
        if self.stop_signal is not None:
            if self.state.records:
                self.flush_errors()
            self.log(self.progress_line())
            self.log(f"Stopped by {signal.Signals(self.stop_signal).name}: journal flushed "
                     f"({self.state.records} responses, {self.state.tokens} tokens); rerun to resume")
            return EXIT_SIGNAL[self.stop_signal]
        return self.finish()

    def generated_in_flight(self):
        now = time.monotonic()
        return [p.generated(now) for p in self.inflight.values()]

    async def dispatch_loop(self):
        s = self.s
        while self.stop_signal is None:
            if self.failed is not None:
                raise self.failed
            while (len(self.inflight) < s.concurrency and self.queue
                   and self.policy.may_dispatch(self.state.tokens, self.generated_in_flight())):
                prompt = self.queue.popleft()
                progress = StreamProgress()
                task = asyncio.create_task(self.run_one(prompt, progress))
                self.inflight[task] = progress
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
                exc = task.exception()
                if isinstance(exc, ServerDown):
                    raise UserError(str(exc))
                if exc is not None:
                    raise exc

    def finish(self):
        s, st = self.s, self.state
        met = st.tokens >= s.budget
        exhausted = not self.deferred and prompts_left(self.prompt_ids, st.ids, self.errored) == 0
        self.log(self.progress_line())
        if self.deferred and not met:  # with the budget met, a deferred prompt is simply not needed
            if st.records:
                self.flush_errors()
            self.log(f"{len(self.deferred)} prompts still failing after {s.max_retries} retries; rerun to retry them")
            return 1
        if exhausted and not met and st.records == 0:
            # errors alone never make a dataset "exhausted": without one response there is no proof
            # that the prompts, not the server or the settings, are at fault (nothing is recorded)
            first = self.pending_errors[0] if self.pending_errors else None
            why = f" (first: {first['id']}: HTTP {first['status']}: {first['error']})" if first else ""
            raise UserError(f"no response from the server for any prompt: {self.errors} failed permanently "
                            f"in this run{why}; nothing recorded; fix the server or settings and rerun")
        self.flush_errors()
        state = "met" if met else ("exhausted" if exhausted else "partial")
        self.log(f"Done: budget {state}: kept {st.tokens} tokens in {st.records} responses, budget {s.budget} "
                 f"({overshoot_pct(st.tokens, s.budget):+.3f}%), discarded {self.discarded_tokens} tokens, "
                 f"retries {self.retries} {self.retry_kinds or ''}, errors {len(self.errored)}".rstrip())
        if state == "partial":
            return 1
        write_json_atomic(s.done, {
            "dataset": s.dataset, "state": state, "tokens": st.tokens, "responses": st.records,
            "budget": s.budget, "prompts": self.total_prompts, "errors": len(self.errored),
            "discarded_tokens": self.discarded_tokens, "retries": self.retries,
            "overshoot_pct": round(overshoot_pct(st.tokens, s.budget), 4),
            "wall_s": round(time.monotonic() - self.started, 2),
        })
        return 0

    def close(self):
        lock = getattr(self, "lock", None)
        if lock:
            lock.release()


def run(settings, log=print):
    job = InferenceJob(settings, log=log)
    try:
        return asyncio.run(job.run())
    finally:
        job.close()
