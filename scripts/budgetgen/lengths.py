"""The completion lengths the dispatch rule (budgetgen.budget) expects a request to end at.

LengthModel: the finished responses' lengths (each with its fate under the quality gate), E[K | L > k] and
Var[K | L > k] of what a request that has streamed k tokens will count, in O(log n), blended with a
pessimistic prior while samples are few. CensoredLengths: the same distribution knowing the requests in
flight too, each only known to be longer than what it has streamed (Kaplan-Meier), for every request in
flight at once.
"""

from __future__ import annotations

import bisect
import math
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence


class _Fenwick:
    """Prefix sums over integer lengths 0..n-1 (count, sum and sum of squares), growing on demand."""

    def __init__(self, n):
        self.n = max(2, n)
        self.count, self.total, self.squares = ([0] * (self.n + 1) for _ in range(3))

    def _grow(self, n):
        old = [(i, self.query_point(i)) for i in range(self.n)]
        self.__init__(max(n, 2 * self.n))
        for i, (c, s, q) in old:
            if c:
                self.add(i, c, s, q)

    def query_point(self, i):
        c1, s1, q1 = self.prefix(i + 1)
        c0, s0, q0 = self.prefix(i)
        return c1 - c0, s1 - s0, q1 - q0

    def add(self, i, c, s, q):
        if i >= self.n:
            self._grow(i + 1)
        i += 1
        while i <= self.n:
            self.count[i] += c
            self.total[i] += s
            self.squares[i] += q
            i += i & -i

    def prefix(self, i):
        """Count, sum and sum of squares of lengths < i."""
        i = min(i, self.n)
        c = s = q = 0
        while i > 0:
            c += self.count[i]
            s += self.total[i]
            q += self.squares[i]
            i -= i & -i
        return c, s, q


class LengthModel:
    """Empirical distribution of completion lengths; E[L | L > k] in O(log n).

    With a quality gate (budgetgen.quality) each length is observed with its fate: the moments are those
    of the kept contribution K = L if kept else 0 given L > k (the tree sums K; a request in flight shows
    L). A gate dropping the truncated (L = max_tokens) makes a request that streamed far expected to
    count little: the keep rate by length, learned from the journal. Without a drop K is L."""

    # Below this many observed lengths beyond k, blend with the prior: early in a run (or far in
    # the tail) a handful of samples would make the estimate jumpy.
    MIN_SAMPLES = 20

    def __init__(self, max_tokens, lengths=(), kept=None):
        self.max_tokens = int(max_tokens)
        self.tree = _Fenwick(self.max_tokens + 2)
        self.n = self.sum = self.squares = 0
        self.largest = self.max_tokens  # no final length's mean or spread can exceed this (+ streamed)
        self.counts = {}  # length -> responses of that length
        self.kept_counts = {}  # length -> responses of that length kept by the quality gate
        self.dropped = 0  # responses the gate dropped (their K is 0)
        self.distinct = []  # the lengths seen, sorted
        self._view = None  # the CensoredLengths view inflight_moments reads (rebuilt as the lengths grow)
        kept = kept if kept is not None else ()
        for i, length in enumerate(lengths):
            self.observe(length, kept[i] if i < len(kept) else True)

    def observe(self, length: int, kept: bool = True) -> None:
        """One finished response of `length` completion tokens, `kept` by the quality gate or dropped."""
        length = max(0, int(length))
        value = length if kept else 0
        self.tree.add(length, 1, value, value * value)
        self.n += 1
        self.sum += value
        self.squares += value * value
        self.largest = max(self.largest, length)
        if length not in self.counts:
            bisect.insort(self.distinct, length)
            self.counts[length] = 0
            self.kept_counts[length] = 0
        self.counts[length] += 1
        self.kept_counts[length] += bool(kept)
        self.dropped += not kept

    def floor(self, k: int) -> float:  # the least a request that streamed k can count (0 once one was dropped)
        return 0.0 if self.dropped else k + 1.0

    def beyond(self, k: int) -> int:
        """How many observed lengths exceed k."""
        return self.n - self.tree.prefix(k + 1)[0]

    def final_moments(self, streamed: float) -> tuple[float, float]:
        """Mean and variance of the final length of a request that has produced `streamed` tokens,
        from the finished lengths alone."""
        k = max(0, int(streamed))
        c_le, s_le, q_le = self.tree.prefix(k + 1)  # lengths <= k
        c, s, q = self.n - c_le, self.sum - s_le, self.squares - q_le  # lengths > k
        if c:
            mean = s / c
            return self.blend(k, c, mean, max(0.0, q / c - mean * mean))
        return self.blend(k, 0, None, None)

    def given_inflight(self, inflight_streamed: Iterable[float]) -> CensoredLengths:
        """The model knowing the requests in flight too (CensoredLengths), built now: O(distinct lengths)."""
        return CensoredLengths(self, inflight_streamed)

    # The censored view is rebuilt once the finished lengths grew by this share since it was built (at
    # least one response): early in a run at every response, as before; at 1M finished every 10,000.
    REBUILD_SHARE = 0.01

    def inflight_moments(self, inflight_streamed: Sequence[float]) -> tuple[float, float, float]:
        """(sum of E[final length], sum of Var[final length], sum of the estimates' standard errors) of the
        requests in flight, as
        given_inflight(inflight_streamed) gives them one by one, from a CensoredLengths view that is
        rebuilt only when the finished lengths grew by REBUILD_SHARE (its censoring: the requests in flight
        then; mid-run they are a sample of the same distribution), evaluated for every request at once
        (numpy): the budget rule's cost per decision stays flat as the run grows."""
        view = self._view
        if view is None or self.n - view.built_n >= max(1, self.REBUILD_SHARE * view.built_n):
            view = self._view = CensoredLengths(self, inflight_streamed)
            view.freeze()
        return view.sum_moments(inflight_streamed)

    def blend(self, k: int, c: int, mean: float | None, var: float | None) -> tuple[float, float]:
        """The moments (mean, var) of lengths beyond k estimated from c samples, blended with the prior
        while c < MIN_SAMPLES, clipped to (k, cap]."""
        # Prior for the unseen: the cap (max_tokens), pessimistic, so an empty model dispatches
        # conservatively, with the largest variance a length in (k, cap] can have; it fades as
        # samples accumulate.
        cap = float(max(self.max_tokens, k + 1))
        prior_mean, prior_var = cap, (cap - k - 1) ** 2 / 4
        if not c or mean is None:
            c, mean, var = 0, prior_mean, prior_var
        if c < self.MIN_SAMPLES:
            w = c / self.MIN_SAMPLES
            # the variance of the mixture: the blended spread plus the gap between the two means
            mixed = mean * w + prior_mean * (1 - w)
            var = w * var + (1 - w) * prior_var + w * (1 - w) * (mean - prior_mean) ** 2
            mean = mixed
        return min(max(mean, self.floor(k)), cap), var

    # What final_moments(streamed) can return, proved here; DispatchPolicy's shortcut rests on it.
    # Let k = max(0, int(streamed)), a = k + 1, cap = max(max_tokens, a), and D = max(largest, a) - a
    # (largest >= max_tokens and >= every observed length, so the lengths beyond k and the prior
    # mean cap all lie in [a, a + D]).
    #   Mean: a <= mean <= cap, as it is clipped to [a, cap] on return.
    #   Variance: 0 <= var <= 25/64 * D^2. The c lengths beyond k have mean m and (population)
    #   variance v <= (m - a)(a + D - m) (Bhatia-Davis). If c >= MIN_SAMPLES, var = v <= D^2/4
    #   (Popoviciu). If c = 0, var = (cap - a)^2/4 <= D^2/4. Otherwise w = c / MIN_SAMPLES is in
    #   (0, 1) and, with x = m - a and C = cap - a both in [0, D],
    #       var <= f = w x (D - x) + (1 - w) C^2/4 + w (1 - w) (x - C)^2.
    #   f is convex in C, so it peaks at C = 0 or C = D. At C = 0, f = w D x - w^2 x^2 <= D^2/4.
    #   At C = D, with y = D - x in [0, D], f = w D y - w^2 y^2 + (1 - w) D^2/4, which rises in y
    #   up to y = D / (2w): for w >= 1/2 that gives f <= (2 - w) D^2/4 <= 3/8 D^2; for w < 1/2 the
    #   peak lies past D, so f <= (1/4 + 3w/4 - w^2) D^2 <= 25/64 D^2 (the maximum, at w = 3/8).
    #   The prior (mean cap, variance (cap - a)^2/4) is no distribution on [a, cap], so the mixture
    #   can exceed Popoviciu's D^2/4: with MIN_SAMPLES = 20, c = 7 or 8 lengths all equal to a and
    #   cap = largest give 0.39 D^2 exactly (e.g. k = 0, max_tokens 100, seven lengths of 1: 3822 >
    #   99^2/4); 25/64 = 0.390625 holds for any MIN_SAMPLES and keeps a margin over float rounding.
    VAR_BOUND = 25 / 64

    def moment_bounds(self, streamed: float) -> tuple[float, float]:
        """Upper bounds of final_moments(streamed): (mean, variance); see the proof above. The
        first does not decrease, the second does not increase, as `streamed` grows. Once the gate
        dropped a response the values lie in [0, largest] (a dropped one counts 0): the proof holds
        with a = 0, D = largest."""
        a = max(0, int(streamed)) + 1
        spread = self.largest if self.dropped else max(self.largest - a, 0)
        return float(max(self.max_tokens, a)), self.VAR_BOUND * float(spread) ** 2

    def beyond_counted(self, k: int) -> int:
        """The finished lengths beyond k as inflight_moments counts them: its view's (built earlier, so
        never more than beyond(k)) while it stands, else beyond(k)."""
        view = self._view
        if view is None:
            return self.beyond(k)
        return int(view.a_beyond[min(k, len(view.a_beyond) - 1)])

    @classmethod
    def estimate_error_weight(cls, c: int) -> float:
        """The largest weight w / sqrt(c') a request's standard error carries over its (unblended)
        spread when c' >= c finished lengths lie beyond what it streamed (w = min(1, c' / MIN_SAMPLES),
        the blend's weight): it rises as sqrt(c') / MIN_SAMPLES up to MIN_SAMPLES, then falls as
        1 / sqrt(c'). That spread lies within the distribution's range, so its variance is at most
        moment_bounds' (Popoviciu's quarter of the range squared is below VAR_BOUND's 25/64)."""
        return 1.0 / math.sqrt(max(c, cls.MIN_SAMPLES))

    def expected_final(self, streamed: float) -> float:
        """Expected final length of a request that has produced `streamed` tokens so far."""
        return self.final_moments(streamed)[0]


class CensoredLengths:
    """The length distribution from the finished responses and the requests in flight, each of which
    is known only to be longer than what it has streamed (right-censored): the Kaplan-Meier estimate.

    Responses finish in order of length, so the finished ones over-represent the short (at the start
    of a run only short ones have finished); counting only them makes the requests in flight look
    short and the rule dispatch too many: +5 .. +27 % over a budget of 100 mean lengths at
    concurrency 150 in the simulation of tests/unit/test_budget.py. Lengths are integers; a request
    that has streamed k tokens is at risk at every length <= k + 1. The probability the estimate
    leaves beyond the longest finished response (requests in flight that have outrun every finished
    one) is put at `largest` (max_tokens or more), the pessimistic end. With nothing in flight this is
    the finished lengths' own distribution (final_moments). The conditional moments beyond k are
    blended with the prior exactly like LengthModel.final_moments (by the finished lengths beyond k),
    and the distribution lies within [k + 1, largest], so LengthModel.moment_bounds holds for them too.
    """

    def __init__(self, model, inflight_streamed):
        self.model = model
        cens = sorted(max(0, int(k)) for k in inflight_streamed)
        points, masses, keep = [], [], []  # keep: the share of each point's responses the gate kept
        alive, finished_below, ci, n_cens = 1.0, 0, 0, len(cens)
        for t in model.distinct:
            while ci < n_cens and cens[ci] < t - 1:  # no longer at risk at t (known only to exceed k < t - 1)
                ci += 1
            at_risk = model.n - finished_below + n_cens - ci
            d = model.counts[t]
            p = alive * d / at_risk
            points.append(t)
            masses.append(p)
            keep.append(model.kept_counts[t] / d)
            alive -= p
            finished_below += d
        if alive > 1e-12 and n_cens:
            if points and points[-1] == model.largest:
                masses[-1] += alive
            else:
                points.append(model.largest)
                masses.append(alive)
                keep.append(1.0)  # beyond every finished response: counted as kept (the pessimistic end)
        # suffix sums: mass, mass * K, mass * K^2 of the support points from index j on (K = t where kept)
        w, m, q = [0.0] * (len(points) + 1), [0.0] * (len(points) + 1), [0.0] * (len(points) + 1)
        for j in range(len(points) - 1, -1, -1):
            t, p, f = points[j], masses[j], keep[j]
            w[j], m[j], q[j] = w[j + 1] + p, m[j + 1] + p * f * t, q[j + 1] + p * f * t * t
        self.points, self.w, self.m, self.q = points, w, m, q
        self.built_n = model.n

    def freeze(self) -> None:
        """Arrays for sum_moments: the support, its suffix sums, and the finished lengths' counts beyond
        each length as they are now (what model.beyond gives)."""
        model = self.model
        self.a_points = np.asarray(self.points, dtype=np.int64)
        self.a_w, self.a_m, self.a_q = (np.asarray(x, dtype=np.float64) for x in (self.w, self.m, self.q))
        counts = np.zeros(model.largest + 2, dtype=np.int64)
        for t, c in model.counts.items():
            counts[t] += c
        self.a_beyond = model.n - np.cumsum(counts)  # [k]: finished lengths > k
        self.max_tokens = model.max_tokens
        self.any_dropped = bool(model.dropped)
        # the moments beyond each support index, for requests with MIN_SAMPLES finished lengths beyond
        # them (no blend with the prior: most of a long run)
        with np.errstate(divide="ignore", invalid="ignore"):
            self.a_mean = np.where(self.a_w > 1e-12, self.a_m / self.a_w, 0.0)
            self.a_var = np.maximum(0.0, np.where(self.a_w > 1e-12, self.a_q / self.a_w, 0.0) - self.a_mean**2)

    def sum_moments(self, inflight_streamed: Sequence[float]) -> tuple[float, float, float]:
        """(sum of means, sum of variances, sum of standard errors) of final_moments over the requests in
        flight, vectorized: the same estimate and the same blend with the prior (LengthModel.blend). A
        request's standard error is that of its estimated mean, sqrt(variance / c) from the c finished
        lengths beyond what it streamed, times the blend's weight of them (LengthModel.estimate_error)."""
        if not len(inflight_streamed):
            return 0.0, 0.0, 0.0
        k = np.maximum(0, np.asarray(inflight_streamed, dtype=np.float64).astype(np.int64))
        j = np.searchsorted(self.a_points, k, side="right")
        mass = self.a_w[j]
        c = self.a_beyond[np.minimum(k, len(self.a_beyond) - 1)]
        if c.min() >= LengthModel.MIN_SAMPLES and mass.min() > 1e-12:  # no blend: the moments as they are
            cap = np.maximum(self.max_tokens, k + 1)
            low = 0 if self.any_dropped else k + 1
            var = self.a_var[j]
            return (float(np.minimum(np.maximum(self.a_mean[j], low), cap).sum()), float(var.sum()),
                    float(np.sqrt(var / c).sum()))
        c = c.astype(np.float64)
        empty = (mass <= 1e-12) | (c <= 0)
        safe = np.where(empty, 1.0, mass)
        mean = self.a_m[j] / safe
        var = np.maximum(0.0, self.a_q[j] / safe - mean * mean)
        cap = np.maximum(float(self.max_tokens), k + 1.0)
        prior_mean, prior_var = cap, (cap - k - 1.0) ** 2 / 4
        c = np.where(empty, 0.0, c)
        mean = np.where(empty, prior_mean, mean)
        var = np.where(empty, prior_var, var)
        w = np.minimum(1.0, c / LengthModel.MIN_SAMPLES)
        se = w * np.sqrt(var / np.maximum(c, 1.0))  # the estimate's own error, weighted as it is blended
        var = w * var + (1 - w) * prior_var + w * (1 - w) * (mean - prior_mean) ** 2
        mean = mean * w + prior_mean * (1 - w)
        mean = np.minimum(np.maximum(mean, 0.0 if self.any_dropped else k + 1.0), cap)
        return float(mean.sum()), float(var.sum()), float(se.sum())

    def final_moments(self, streamed: float) -> tuple[float, float]:
        """Mean and variance of the final length of a request that has produced `streamed` tokens."""
        k = max(0, int(streamed))
        j = bisect.bisect_right(self.points, k)
        mass = self.w[j]
        c = self.model.beyond(k)
        if mass <= 1e-12 or not c:
            return self.model.blend(k, 0, None, None)
        mean = self.m[j] / mass
        return self.model.blend(k, c, mean, max(0.0, self.q[j] / mass - mean * mean))
