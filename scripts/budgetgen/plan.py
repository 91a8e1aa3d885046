"""What an inference job finds when it starts, and what it has left to ask: the plan of a run.

prepare(): load the prompts, lock the journal, remove what an earlier run finished (done marker, the
files made from the journal), repair torn tails, scan the journal and errors under the identities that
count now, and lay out the lanes (budgetgen.mixture) with what each has left to ask, conversations
under way first. RunState holds it; RunState.next_generation() is the dispatch order.
"""

from __future__ import annotations

import logging
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from . import conversations, journal, mixture
from .budget import DispatchPolicy
from .errors import UserError
from .forecast import human_bytes
from .fsutil import remove_outputs
from .lengths import LengthModel
from .progress import Rates
from .quality import KEPT, Fate
from .status import scan_lanes

if TYPE_CHECKING:
    from collections.abc import Callable, Collection, Container, Sequence

    from .prompts import Prompt
    from .settings import InferenceSettings

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Generation:
    """One request to make: turn k of a chain, after `previous` (turn k-1's journal record; None for k 1),
    for the lane (LaneRun key) that holds its prompt."""

    chain: conversations.Chain
    k: int
    previous: dict | None = None
    lane: str = mixture.DEFAULT_CELL

    @property
    def id(self) -> str:
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
    generated_tokens: int = 0  # kept or dropped (`tokens`: the kept, budgetgen.quality)
    dropped: dict = field(default_factory=dict)  # reason -> responses the gate dropped

    @property
    def key(self) -> str:
        return self.lane.key

    @property
    def cell(self) -> mixture.Cell:
        return self.lane.cell

    def where(self) -> dict[str, str]:
        """What a record of this lane says of it, before its conversation place."""
        return {"cell": self.cell.name, "split": self.lane.split}

    def claim(self, prompt: Prompt) -> None:
        """Take an unclaimed prompt of the lane's split: its chains join the end of the queue."""
        for chain in conversations.chains([prompt], self.cell.plan):
            self.chains.append(chain)
            self.queue.append(Generation(chain, 1, lane=self.key))

    def nothing_left(self, journaled_ids: Container[str], pool: Collection[Prompt]) -> bool:
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
    def chains(self) -> list[conversations.Chain]:
        return [c for lr in self.lanes.values() for c in lr.chains]

    def count(self, lr: LaneRun, gid: str, tokens: int, fate: Fate = KEPT) -> None:
        """A response of `tokens` journaled for lane `lr` with its `fate` under the lane's quality gate:
        the dataset's and the lane's counts (the kept tokens what the budget counts)."""
        kept = tokens if fate.kept else 0
        j = self.journaled
        if gid in j.ids:  # never a response counted twice (scan keeps the first of an id too)
            return
        j.ids.add(gid)
        j.tokens += kept
        j.generated_tokens += tokens
        j.records += 1
        lr.tokens += kept
        lr.generated_tokens += tokens
        lr.records += 1
        if not fate.kept:
            j.dropped[fate.reason] = j.dropped.get(fate.reason, 0) + 1
            lr.dropped[fate.reason] = lr.dropped.get(fate.reason, 0) + 1
        lr.lengths.observe(tokens, fate.kept)
        lr.rates.add(tokens)

    def uncount(self, lr: LaneRun, gid: str, tokens: int, fate: Fate = KEPT) -> None:
        """A response count() counted, then blamed on the server (budgetgen.breaker): out of every count
        again, its id no longer done (the length model keeps what it learned of it)."""
        kept = tokens if fate.kept else 0
        j = self.journaled
        j.ids.discard(gid)
        j.tokens -= kept
        j.generated_tokens -= tokens
        j.records -= 1
        lr.tokens -= kept
        lr.generated_tokens -= tokens
        lr.records -= 1
        if not fate.kept:
            for counts in (j.dropped, lr.dropped):
                counts[fate.reason] -= 1
                if not counts[fate.reason]:
                    del counts[fate.reason]

    def queued(self) -> int:
        return sum(len(lr.queue) for lr in self.lanes.values()) + sum(len(p) for p in self.pool.values())

    def next_generation(self, in_flight: Callable[[LaneRun], Sequence[float]]) -> Generation | None:
        """The next request: from the lane furthest from its budget line (by share of it expected: the
        tokens journaled and those its requests in flight are expected to end with, by its budget rule's
        length model) whose budget rule lets it dispatch and that has a generation to ask or an
        unclaimed prompt of its split to take; None when no lane may. `in_flight(lane)`: the tokens
        generated so far by each of the lane's requests in flight. Counting what is in flight keeps the
        lanes of a small split (a validation split of a few prompts) from all claiming prompts while
        nothing has finished: they draw in proportion to their lines."""
        ready = []
        for lr in self.lanes.values():
            inflight = in_flight(lr)
            if (lr.queue or self.pool[lr.lane.split]) and lr.policy.may_dispatch(lr.tokens, inflight):
                expected = lr.policy.expected_total(lr.tokens, inflight)[0] if inflight else lr.tokens
                ready.append((expected / lr.lane.budget if lr.lane.budget else float("inf"), lr))
        if not ready:
            return None
        lr = min(ready, key=lambda x: x[0])[1]
        if not lr.queue:
            lr.claim(self.pool[lr.lane.split].popleft())
        return lr.queue.popleft()


def prepare(s: InferenceSettings) -> tuple[journal.JournalLock, RunState]:
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
        journaled = _read_journal(s, pset.prompts)
    except BaseException:
        lock.release()
        raise
    _log_identities(s, journaled)
    by_identity = journal.errors_by_identity(s.paths.errors)
    accounts, pool = mixture.account(s.mixture, s.policy, pset.prompts, journaled, by_identity)
    errored = set().union(*(by_identity.get(sha, set()) for sha in s.policy.shas))
    elsewhere = set().union(*by_identity.values()) - errored - journaled.ids
    log.info(f"Resuming: {journaled.records} already done ({journaled.tokens} tokens)"
             + (f", {len(errored)} failed permanently earlier" if errored else "")
             + (f", {len(elsewhere)} failed earlier under other settings (asked again)" if elsewhere else ""))
    log.info(f"remaining budget: {max(0, s.budget - journaled.tokens)} of {s.budget} tokens")
    if not s.mixture.plain:
        log.info("Lanes: " + "; ".join(
            f"{k} {a.tokens}/{a.lane.budget} tokens (share {a.lane.cell.share:g}"
            + (f", validation {s.mixture.validation_share:g}" if a.lane.split == mixture.VALIDATION else "") + "), "
            f"{len(a.prompts)} prompts held" for k, a in accounts.items())
            + "; unclaimed prompts: " + ", ".join(f"{split} {len(ps)}" for split, ps in pool.items()))
    lanes = _lane_runs(s, accounts, journaled, errored)
    log_forecast(s, journaled)
    return lock, RunState({p.id for p in pset.prompts}, lanes, {k: deque(v) for k, v in pool.items()}, journaled,
                          errored)


def _read_journal(s, prompts):
    """Under the lock: scan the journal (repairing its torn tail), refuse (one line) what the settings-change
    policy refuses, remove what says "finished", repair errors.jsonl's torn tail."""
    # The done marker and the files made from the journal say "finished with these settings"; from
    # here on this run decides. Left in place, a run interrupted, refused or failed after a settings
    # change (budget raised, prompts added) would leave them to satisfy the DAG with the old data
    # (Snakemake records the interrupted job's new params, and a consumer whose output exists is not
    # rerun for a missing input), and rows, plots and a summary that look finished. Removed, the next
    # run must go through this job again, and only a run that ends met or exhausted remakes them.
    # A refused settings change is refused before that: a refusal touches nothing (the workflow refuses it
    # before any job starts; this is the job started some other way).
    journaled = scan_lanes(s, prompts, repair=True)
    refusal = s.policy.refusal(s.dataset, journaled.by_identity)
    if refusal:
        raise UserError(refusal)
    removed = remove_outputs(s.paths.finished_outputs())
    if removed:
        log.info("Removed the earlier run's outputs until this run ends met or exhausted: " + ", ".join(removed))
    if journaled.repaired_bytes:
        log.info(f"Repaired torn journal tail: dropped {journaled.repaired_bytes} bytes")
    if journaled.duplicates:
        log.info(f"Journal holds {journaled.duplicates} duplicate ids (first kept, counted once)")
    # errors.jsonl is append-only too, written only under this lock: its torn tail is cut here
    repaired = journal.repair_tail(s.paths.errors)
    if repaired:
        log.info(f"Repaired torn tail of {s.paths.errors}: dropped {repaired} bytes")
    return journaled


def _log_identities(s, journaled):
    policy = s.policy
    for name, ident in policy.identities:
        log.info(f"Generation identity{'' if s.mixture.plain else ' of cell ' + name} {ident.sha} "
                 f"({ident.settings_json}); on_settings_change: {policy.on_change}")
    others = {sha: c for sha, c in journaled.by_identity.items() if sha not in policy.shas}
    if others:
        kept = "counted toward the budget and kept in the outputs" if policy.on_change == "extend" else \
            "kept in the journal, out of every count and output"
        log.info(f"Journal holds records of {len(others)} other identities "
                 f"({sum(c.records for c in others.values())} records, {sum(c.tokens for c in others.values())} "
                 f"tokens): {kept} (generation.on_settings_change: {policy.on_change})")


def _lane_runs(s, accounts, journaled, errored):
    """The LaneRun of every lane: fresh prompts queued in dispatch order, conversations under way first,
    each from its last journaled turn."""
    lanes, started_all = {}, []
    for key, acc in accounts.items():
        started, fresh = [], []
        for c in acc.chains:
            k = c.first_missing(journaled.ids)
            if k is not None and c.turn_id(k) not in errored:
                (started if k > 1 else fresh).append((c, k))
        started_all += [(key, c, k) for c, k in started]
        got = journaled.lanes.get(key)
        lengths = LengthModel(acc.lane.cell.max_tokens, got.lengths if got else (), got.kept if got else None)
        queue = deque(Generation(c, k, lane=key) for c, k in fresh)
        lanes[key] = LaneRun(acc.lane, queue, list(acc.chains), acc.tokens, acc.records,
                             errored & {g for c in acc.chains for g in c.ids()}, lengths,
                             DispatchPolicy(acc.lane.budget, lengths), Rates(), acc.generated_tokens,
                             dict(acc.dropped or {}))
    previous = journal.records_by_id(s.paths.journal, [c.turn_id(k - 1) for _, c, k in started_all],
                                     accepts=s.policy.accepts)
    for key, c, k in reversed(started_all):
        lanes[key].queue.appendleft(Generation(c, k, previous[c.turn_id(k - 1)], lane=key))
    if started_all:
        log.info(f"Conversations under way: {len(started_all)} continue from their last journaled turn")
    return lanes


def log_forecast(s: InferenceSettings, journaled: journal.JournalState) -> None:
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
