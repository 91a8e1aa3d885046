"""How an inference job ends (budgetgen.inference runs it): finish() (met, exhausted or partial by its
lanes; the done marker only for met or exhausted), stopped() (a signal), and the two failures of a server
or setup that answer but make no data: keep_failure() (a lane whose responses the quality gate does not
keep: quality.keep_problem) and server_broken() (every endpoint cut off by the breaker). Each failure's
line is the job's last, and its cause (budgetgen.failures); and prove_server(), the proof that the server works
when every request of a run failed permanently (before those errors are called the prompts').

`job` is the budgetgen.inference.InferenceJob (its settings `s`, `run_state`, `stats`, `errors`, `progress`,
`deferred`, `blame`, `stop_signal`); this module reads it and never imports that one.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import time
from typing import Any

from . import conversations, quality
from .budget import overshoot_pct
from .errors import UserError
from .failures import note_cause
from .fsutil import write_json_atomic
from .retries import RequestRetries
from .state import lanes_state, short_lanes
from .status import compute_status
from .streams import PermanentError, TransientError

log = logging.getLogger(__name__)

EXIT_SIGNAL = {signal.SIGTERM: 143, signal.SIGINT: 130}
Job = Any  # budgetgen.inference.InferenceJob


def keep_failure(job: Job, final: bool) -> str | None:
    """The line a run ends with when a lane's responses are not data (quality.keep_problem): never met or
    exhausted with nothing, or too little, kept. While the run goes on it stops the dispatch: the GPU time
    of every later request would go the same way. Kept nothing of a server the breaker did not cut off
    (its faults spread over endpoints, or quality.breaker.share 1): this run's faulty responses are blamed,
    so the rerun, the server fixed, asks their prompts again."""
    s = job.s
    for key, lr in job.run_state.lanes.items():
        problem = quality.keep_problem(lr.records, lr.dropped, s.min_keep_share, final, lr.cell.max_tokens)
        if problem:
            reason, why = problem
            where = f"dataset {s.dataset}" + ("" if s.mixture.plain else f", lane {key}")
            line = f"{where}: {why}; nothing more is asked; fix the cause, then rerun"
            if reason in quality.SERVER_FAULTS and job.blame is not None:  # the server's: asked again next run
                n = job.blame.blame_faults(lr, line)
                line += f" ({n} responses of this run blamed on the server: their prompts are asked again)"
            if not final:
                log.info(job.progress.line())
            job.progress.to_terminal("stopped: the responses are not data")
            note_cause(line)
            return line
    return None


def server_broken(job: Job) -> str:
    """The line a job stopped by the breaker ends with: each endpoint cut off, by what, and what happens
    to the responses it was blamed for."""
    trips = "; ".join(t.line() for t in job.blame.trips)
    n = len(job.blame.keys)
    line = (f"every endpoint was cut off by the breaker (quality.breaker): {trips}; {n} response"
            f"{'s' if n != 1 else ''} blamed on the server count nowhere (journal.blamed.jsonl) and their prompts "
            "are asked again by the next run; fix the server, then rerun")
    log.info(job.progress.line())
    job.progress.to_terminal("stopped: the server sends garbage")
    note_cause(line)
    return line


def stopped(job: Job) -> int:
    """The run stopped by a signal: what is held is flushed, the cause noted; the signal's exit status."""
    rs, name = job.run_state, signal.Signals(job.stop_signal).name
    if rs.journaled.records:
        job.errors.flush()
    log.info(job.progress.line())
    job.progress.to_terminal(f"stopped by {name}")
    log.info(f"Stopped by {name}: journal flushed ({rs.journaled.records} responses, {rs.journaled.tokens} tokens); "
             "rerun to resume")
    note_cause(f"stopped by {name} (scancel, a time limit, preemption or Ctrl-C) at {rs.journaled.tokens} tokens, "
               "journal flushed; rerun to resume")
    return EXIT_SIGNAL[job.stop_signal]


def finish(job: Job) -> int:
    """The run's outcome: met, exhausted or partial by its lanes; the done marker only for met or exhausted
    (0), 1 when requests still fail or the budget is short; no response at all is the server's failure."""
    s, rs, stats = job.s, job.run_state, job.stats
    st = rs.journaled
    lanes = {k: {"tokens": lr.tokens, "budget": lr.lane.budget, "responses": lr.records,
                 "generated_tokens": lr.generated_tokens, "dropped": dict(lr.dropped),
                 "exhausted": not job.deferred and lr.nothing_left(st.ids, rs.pool[lr.lane.split])}
             for k, lr in rs.lanes.items()}
    state = lanes_state(lanes)
    met = state == "met"
    left = conversations.left(rs.chains, st.ids, rs.errored)
    log.info(job.progress.line())
    if job.deferred and not met:  # with the budget met, a deferred prompt is simply not needed
        if st.records:
            job.errors.flush()
        log.info(f"{len(job.deferred)} requests still failing after {s.max_retries} retries; rerun to retry them")
        job.progress.to_terminal(f"partial: {len(job.deferred)} requests still failing; rerun")
        note_cause(f"{len(job.deferred)} requests still failing after {s.max_retries} retries "
                   "(server.max_retries); their errors are in the log; rerun to retry them")
        return 1
    why = keep_failure(job, final=True)
    if why:
        raise UserError(why)
    if state == "exhausted" and st.records == 0:
        # errors alone never make a dataset "exhausted": without one response there is no proof
        # that the prompts, not the server or the settings, are at fault (nothing is recorded)
        first = job.errors.first()
        why = f" (first: {first['id']}: HTTP {first['status']}: {first['error']})" if first else ""
        raise UserError(f"no response from the server for any prompt: {stats.errors} failed permanently "
                        f"in this run{why}; nothing recorded; fix the server or settings and rerun")
    job.errors.flush()
    dropped = (f" (generated {st.generated_tokens}; dropped by the quality gate: {quality.dropped_text(st.dropped)})"
               if st.dropped else "")
    short = short_lanes(lanes) if state == "met" else ""
    log.info(f"Done: budget {state}{short}: kept {st.tokens} tokens in {st.records} responses{dropped}, "
             f"budget {s.budget} ({overshoot_pct(st.tokens, s.budget):+.3f}%), discarded {stats.discarded_tokens} "
             f"tokens, retries {stats.retries} {stats.retry_kinds or ''}, errors {len(rs.errored)}".rstrip()
             + (f"; conversations: {len(rs.chains)}, {left.chains_open} not finished, "
                f"{left.chains_ended_by_error} ended by an error" if s.plan.turns == "all" else ""))
    if len(lanes) > 1:
        log.info("Lanes: " + "; ".join(
            f"{k}: {v['tokens']}/{v['budget']} ({overshoot_pct(v['tokens'], v['budget']):+.3f}%), "
            f"{v['responses']} responses" + (f" (dropped {quality.dropped_text(v['dropped'])})" if v["dropped"] else "")
            + f", {lanes_state({k: v})}" for k, v in lanes.items()))
    trips = job.blame.trips if job.blame is not None else []
    if trips:
        log.info(f"Endpoints cut off by the breaker (quality.breaker): {'; '.join(t.line() for t in trips)}; "
                 f"{len(job.blame.keys)} responses blamed on the server counted nowhere, their prompts asked again")
    job.progress.to_terminal(f"done: {state}")
    if state == "partial":
        note_cause(f"stopped short of the budget at {st.tokens} of {s.budget} tokens (partial); rerun to resume")
        return 1
    write_done(job, state, lanes, left, trips)
    return 0


def write_done(job: Job, state: str, lanes: dict, left: Any, trips: list) -> None:
    """The done marker of a run that ended met or exhausted: its counts, lanes and settings' key."""
    s, rs, stats, st = job.s, job.run_state, job.stats, job.run_state.journaled
    write_json_atomic(s.paths.done, {
        "dataset": s.dataset, "state": state, "tokens": st.tokens, "generated_tokens": st.generated_tokens,
        "dropped": dict(st.dropped), "responses": st.records,
        "budget": s.budget, "prompts": len(rs.prompt_ids), "conversations": len(rs.chains),
        "conversations_ended_by_error": left.chains_ended_by_error, "errors": len(rs.errored),
        "discarded_tokens": stats.discarded_tokens, "retries": stats.retries,
        "blamed": len(job.blame.keys) if job.blame is not None else 0,
        "cut_off": [t.line() for t in trips],
        "overshoot_pct": round(overshoot_pct(st.tokens, s.budget), 4), **s.policy.key(),
        "lanes": {k: {**rs.lanes[k].lane.describe(), **v} for k, v in lanes.items()},
        "wall_s": round(time.monotonic() - stats.started, 2),
    })


def release(job: Job) -> None:
    """Rewrite the status checkpoint's file with the journal's counts as this run leaves it (the
    checkpoint wrote it before the run, and never runs again for it), then release the journal."""
    if not job.lock:
        return
    try:
        write_json_atomic(job.s.paths.status, compute_status(job.s))
    except Exception as exc:  # never hide why the run ended; the next checkpoint run recounts
        log.info(f"budget status not rewritten ({job.s.paths.status}): {exc}")
    finally:
        job.lock.release()


async def prove_server(job: Job) -> None:
    """Every request of this run failed permanently: that the server works under these settings must
    be proved in this run before the errors are the prompts' (an earlier run's records prove nothing
    about a setting changed since). One prompt answered before is asked again (the answer is not
    kept): answered, the errors are recorded and the run goes on to its end; refused too, the
    settings are at fault: one line, nothing recorded."""
    s, rs = job.s, job.run_state
    first = job.errors.first()
    failed = f"{job.stats.errors} requests of this run failed permanently (first: {first['id']}: HTTP " \
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
            await job.client.chat(probe.request(1), lr.cell.params, want_ids=s.want_ids)
            break
        except TransientError as exc:
            delay = retries.delay_after(exc, max(job.last_ok, job.client.last_byte), job.client.urls)
            if delay is None:
                raise UserError(f"{failed}, and {probe.turn_id(1)}, answered before, now fails too: {exc}; "
                                "nothing recorded; rerun when the server answers") from None
            await asyncio.sleep(delay)
        except PermanentError as exc:
            raise UserError(f"{failed}, and {probe.turn_id(1)}, answered before, now fails the same way ({exc}): "
                            f"the settings, not the prompts, are at fault; nothing recorded; "
                            f"{likely_setting(str(exc), s)}") from None
    log.info(f"{probe.turn_id(1)} answered: the server works under these settings; the errors are the prompts'")
    job.errors.success()


def likely_setting(message: str, s: Any) -> str:
    """The setting a permanent error that every request meets most likely comes from, for its one line."""
    text = message.lower()
    if any(w in text for w in ("context", "max_tokens", "maximum", "too long", "length")):
        return (f"likely generation.max_tokens ({s.max_tokens}): prompt + max_tokens past the model's context "
                "length; lower it")
    return ("likely a setting every request sends: server.model, generation.temperature / top_p / extra_body "
            "(e.g. a chat_template_kwargs key the server refuses)")
