"""The breaker: an endpoint whose responses went bad gets no more requests (issue 42).

A server can break while it still answers HTTP 200: empty text, loops, mojibake, another turn's
template tokens (budgetgen.quality.SERVER_FAULTS, observed per response). Counting errors never sees
it. So, per endpoint, the breaker keeps the facts of its last `window` responses; when more than `share`
of them are server faults, the endpoint *trips*:

- it gets no more requests (EndpointPool.retire); the other endpoints go on; with none left the job stops,
  exit non-zero, its last line Trip.line(): "48 of the last 50 responses from URL were empty";
- the faulty responses of its window, and every later one of the endpoint, are **blamed on the server**:
  each stays in the journal as evidence, and a blame line in `journal.blamed.jsonl` (budgetgen.journal)
  takes it out of every count and output, so its prompt is asked again (by another endpoint now, or by
  the next run). The responses before the window and the good ones in it are kept as they were.

The breaker only decides; the job (budgetgen.inference) journals, uncounts and asks again. Each response
is judged once, in journal order, so a rerun after a kill finds every blame it had written, and a blame
line is written only after its response is journaled (a kill between the two leaves the response
counted, as it would have been without the breaker).
"""

from __future__ import annotations

import time
from collections import Counter, deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from .journal import append_error, blamed_path
from .quality import EMPTY, SERVER_FAULTS

if TYPE_CHECKING:
    from collections.abc import Iterable
    from typing import Any

WORDS = {EMPTY: "empty", "repetition": "loops (repetition)", "replacement_chars": "mojibake (replacement_chars)",
         "template_leak": "leaked template tokens (template_leak)"}


@dataclass(frozen=True)
class Trip:
    """An endpoint cut off: the most common fault of its window and how many of the window had one."""

    endpoint: str
    fact: str
    faults: int
    window: int

    def line(self) -> str:
        return f"{self.faults} of the last {self.window} responses from {self.endpoint} were {WORDS[self.fact]}"


@dataclass
class Seen:
    """One judged response: its fault (None: a good one) and what the job needs to blame it (`item`)."""

    fault: str | None
    item: Any


@dataclass
class Breaker:
    """quality.breaker of one dataset: `window` responses per endpoint, tripped above `share` faults."""

    window: int
    share: float
    seen: dict = field(default_factory=dict)  # endpoint -> deque of Seen
    trips: dict = field(default_factory=dict)  # endpoint -> Trip

    @staticmethod
    def fault_of(flags: Iterable[str]) -> str | None:
        flags = set(flags)
        return next((f for f in SERVER_FAULTS if f in flags), None)

    def judge(self, endpoint: str, flags: Iterable[str], item: Any) -> tuple[Trip | None, list[Any]]:
        """A response of `endpoint` with these facts: (the Trip it causes, or None; the items now blamed on
        the server: the window's faulty ones at a trip, this one when its endpoint tripped earlier)."""
        fault = self.fault_of(flags)
        if endpoint in self.trips:
            return None, [item] if fault else []
        window = self.seen.setdefault(endpoint, deque(maxlen=self.window))
        window.append(Seen(fault, item))
        faults = [s for s in window if s.fault]
        if len(faults) <= self.share * self.window:
            return None, []
        fact = Counter(s.fault for s in faults).most_common(1)[0][0]
        trip = self.trips[endpoint] = Trip(endpoint, fact, len(faults), len(window))
        self.seen.pop(endpoint)
        return trip, [s.item for s in faults]


@dataclass(eq=False)
class Response:
    """A journaled response as the job holds it for the breaker: its generation (plan.Generation), lane
    (plan.LaneRun), key in the journal (id, created), facts, endpoint, completion tokens and fate. Not its
    record: a run holds one of these per counted response, so it stays small whatever the text."""

    gen: Any
    lane: Any
    key: tuple
    flags: tuple
    endpoint: str | None
    tokens: int
    fate: Any

    @classmethod
    def of(cls, gen: Any, lane: Any, rec: dict, tokens: int, fate: Any) -> Response:
        return cls(gen, lane, (rec["id"], rec.get("created")), tuple(rec.get("flags") or ()), rec.get("endpoint"),
                   tokens, fate)


class Blame:
    """The job's side of the breaker: each response judged as it is journaled; a trip retires its endpoint
    (EndpointPool.retire); a blamed response gets its blame line (journal.blamed_path), leaves the run's
    counts (RunState.uncount) and is asked again (at the head of its lane) while an endpoint is left. A
    conversation's later turns, built on a blamed turn, are blamed with it (journaled), dropped (queued),
    or discarded when they land (in flight: follows_blamed(), never journaled), so a rerun asks them again
    after the turn they follow. A later turn's blame line is written before the one of the turn it follows:
    a kill between the two leaves the earlier turn counted and the later one blamed (the rerun asks the
    later one again), never a counted turn that follows a blamed one."""

    def __init__(self, breaker: Breaker, run_state: Any, pool: Any, journal_path: str):
        self.breaker, self.rs, self.pool = breaker, run_state, pool
        self.path = blamed_path(journal_path)
        self.keys = set()  # (id, created) blamed in this run
        self.counted = {}  # id -> Response counted in this run (a later turn to blame with its earlier one)
        self.trips = []

    def follows_blamed(self, gen: Any) -> bool:
        """Whether a generation was asked after a turn blamed since (its answer is built on garbage)."""
        prev = gen.previous
        return prev is not None and (prev.get("id"), prev.get("created")) in self.keys

    def judge(self, resp: Response, endpoint: str) -> bool:
        """Judge one journaled response (not yet counted); True when it is blamed (the caller neither
        counts it nor queues its conversation's next turn)."""
        trip, blamed = self.breaker.judge(endpoint, resp.flags, resp)
        if trip is not None:
            self.trips.append(trip)
            self.pool.retire(endpoint, trip.line())
        why = trip or self.breaker.trips.get(endpoint)
        for r in blamed:
            self._blame(r, why.line())
        return any(r is resp for r in blamed)

    def blame_faults(self, lane: Any, why: str) -> int:
        """Blame this run's counted server-fault responses of `lane` (a run that kept nothing of a server
        the breaker did not cut off: the rerun asks them again); how many."""
        faulty = [r for r in self.counted.values() if r.lane is lane and Breaker.fault_of(r.flags)]
        for r in faulty:
            self._blame(r, why)
        return len(faulty)

    def counts(self, resp: Response) -> None:
        self.counted[resp.key[0]] = resp

    @property
    def none_left(self) -> bool:
        return bool(self.trips) and not self.pool.serving

    def _blame(self, resp: Response, why: str) -> None:
        if resp.key in self.keys:
            return
        gid, created = resp.key
        gen, lr = resp.gen, resp.lane
        chain = gen.chain
        if gen.k < chain.n_turns:  # the turn built on this one: blamed first, or dropped from the queue
            child = self.counted.get(chain.turn_id(gen.k + 1))
            if child is not None and (child.gen.previous or {}).get("created") == created:
                self._blame(child, f"it follows turn {gid}, blamed on the server")
            lr.queue = type(lr.queue)(g for g in lr.queue if not (
                g.chain is chain and g.k == gen.k + 1 and (g.previous or {}).get("created") == created))
        append_error(self.path, {"id": gid, "created": created, "endpoint": resp.endpoint, "flags": list(resp.flags),
                                 "why": why, "blamed_at": round(time.time(), 3)})
        self.keys.add(resp.key)
        if self.counted.get(gid) is resp:  # counted in this run: out of its counts again
            self.rs.uncount(lr, gid, resp.tokens, resp.fate)
            del self.counted[gid]
        if self.pool.serving and not self.follows_blamed(gen):
            lr.queue.appendleft(type(gen)(chain, gen.k, gen.previous, lane=gen.lane))
