"""The token budget and the dispatch rule.

Budget = sum of usage.completion_tokens (reasoning included) of journaled responses.

Dispatch rule: send another request only while

    journaled_tokens + sum(expected final length of each request in flight) < budget

where a request that has streamed k tokens is expected to end at E[L | L > k], estimated from the
lengths of the responses seen so far (journal included). Once the rule says stop, the requests in
flight finish and are kept: nothing generated is thrown away. E[L | L > k] never decreases as k
grows, so the expected total only falls when a request finishes shorter than expected — the
rule is re-evaluated exactly then. The final kept count is therefore >= budget (unless the prompts
run out) and exceeds it by the error of the last estimates only.
"""

import math


class _Fenwick:
    """Prefix sums over integer lengths 0..n-1 (count and sum), growing on demand."""

    def __init__(self, n):
        self.n = max(2, n)
        self.count = [0] * (self.n + 1)
        self.total = [0] * (self.n + 1)

    def _grow(self, n):
        old = [(i, self.query_point(i)) for i in range(self.n)]
        self.__init__(max(n, 2 * self.n))
        for i, (c, s) in old:
            if c:
                self.add(i, c, s)

    def query_point(self, i):
        c1, s1 = self.prefix(i + 1)
        c0, s0 = self.prefix(i)
        return c1 - c0, s1 - s0

    def add(self, i, c, s):
        if i >= self.n:
            self._grow(i + 1)
        i += 1
        while i <= self.n:
            self.count[i] += c
            self.total[i] += s
            i += i & -i

    def prefix(self, i):
        """Count and sum of lengths < i."""
        i = min(i, self.n)
        c = s = 0
        while i > 0:
            c += self.count[i]
            s += self.total[i]
            i -= i & -i
        return c, s


class LengthModel:
    """Empirical distribution of completion lengths; E[L | L > k] in O(log n)."""

    # Below this many observed lengths beyond k, blend with the prior: early in a run (or far in
    # the tail) a handful of samples would make the estimate jumpy.
    MIN_SAMPLES = 20

    def __init__(self, max_tokens, lengths=()):
        self.max_tokens = int(max_tokens)
        self.tree = _Fenwick(self.max_tokens + 2)
        self.n = 0
        self.sum = 0
        for length in lengths:
            self.observe(length)

    def observe(self, length):
        length = max(0, int(length))
        self.tree.add(length, 1, length)
        self.n += 1
        self.sum += length

    def expected_final(self, streamed):
        """Expected final length of a request that has produced `streamed` tokens so far."""
        k = max(0, int(streamed))
        c_le, s_le = self.tree.prefix(k + 1)  # lengths <= k
        c, s = self.n - c_le, self.sum - s_le  # lengths > k
        # Prior for the unseen: the cap (max_tokens), pessimistic, so an empty model dispatches
        # conservatively; it fades as samples accumulate.
        prior = float(max(self.max_tokens, k + 1))
        if c >= self.MIN_SAMPLES:
            est = s / c
        else:
            w = c / self.MIN_SAMPLES
            est = (s / c if c else prior) * w + prior * (1 - w)
        return min(max(est, k + 1.0), max(float(self.max_tokens), k + 1.0))


class DispatchPolicy:
    """Decides whether one more request may be sent toward `budget`."""

    def __init__(self, budget, model):
        self.budget = int(budget)
        self.model = model

    def expected_total(self, journaled_tokens, inflight_streamed):
        return journaled_tokens + sum(self.model.expected_final(k) for k in inflight_streamed)

    def may_dispatch(self, journaled_tokens, inflight_streamed):
        if journaled_tokens >= self.budget:
            return False
        return self.expected_total(journaled_tokens, inflight_streamed) < self.budget


def overshoot_pct(kept, budget):
    return 100.0 * (kept - budget) / budget if budget else math.nan
