"""The token budget and the dispatch rule.

Budget = sum of usage.completion_tokens (reasoning included) of the journaled responses the quality
gate keeps (budgetgen.quality; every response without a gate that drops).

Dispatch rule: send another request only while

    journaled_tokens + sum(expected final length of each request in flight)
                     + Z * (standard deviation of that sum) < budget

where a request that has streamed k tokens is expected to end at E[L | L > k] (variance
Var[L | L > k]), estimated from the lengths of the responses seen so far (journal included) and
the requests still in flight, each known to be longer than what it has streamed (Kaplan-Meier:
the responses that finish first are the short ones, so the finished alone make the in-flight look
short, most of all early in a run and when the budget is a few times the requests in flight); k
includes the tokens generated since the stream's last chunk (budgetgen.progress.StreamProgress). Once the rule says
stop, the requests in flight finish and are kept: nothing generated is thrown away. The rule is
re-evaluated each time a request finishes (that is when the expected total can fall below the
budget again), and the run ends only when nothing is in flight and the journal meets the budget,
so the kept count is >= budget (unless the prompts run out) and exceeds it by the spread of the
last few requests dispatched; DispatchPolicy explains the margin.
"""


from __future__ import annotations

import math
from typing import TYPE_CHECKING

from .lengths import LengthModel

if TYPE_CHECKING:
    from collections.abc import Sequence


class DispatchPolicy:
    """Decides whether one more request may be sent toward `budget`.

    Send while  journaled + sum(E[final length]) + Z * sqrt(sum(Var[final length])) < budget.

    Without the margin the rule stops when the expected total reaches the budget, but every time
    the total then dips below it (a request ends shorter than expected) it dispatches again, and it
    can never take back one that runs long: the final count behaves like a random walk reflected at
    the budget and lands about 0.8 standard deviations of the in-flight total above it. The margin
    stops early by Z of those deviations; as the last requests finish the deviation shrinks and the
    rule tops up with a few requests, so the final count still reaches the budget (the run
    dispatches until it does) and overshoots by the spread of those few only.

    The estimate's own error. Every request in flight is expected from the same finished lengths, so an
    estimate that is off (early in a run: a score of short responses, a drop rate under-counted by
    chance) is off for all of them at once: the rule adds that common error, (sum of the requests'
    standard errors)^2, to the variance (expected_total). It matters only while the finished are few
    against those in flight (a small budget's first burst: under load, +7.5 % over 100 mean lengths with
    30 % drops without it, the oracle's +0.18 % with it); by the end of a long run it is noise.

    Careful at small budgets. Where one response's spread is a material share of the budget (its
    standard deviation above CAREFUL_SHARE of it: budgets of a few hundred mean lengths, pilot runs,
    validation splits, mixture cells), the spread of those few is itself a percent or more. There the
    rule also counts the request it is about to send, stops CAREFUL_Z deviations short, and asks what
    is left one request at a time (with nothing in flight it always sends one): each is asked knowing
    how the one before ended, which is what an oracle that knows every length does, so the kept count
    lands where the oracle's does. It costs that dataset a few response times at its end with few
    requests in flight; the workflow runs every dataset's job at once, so the server's queue fills
    the slots with other datasets' requests meanwhile. At larger budgets (production: 10M tokens of
    3,500-token responses) the rule is as above.
    """

    Z = 2.0
    CAREFUL_SHARE = 0.001
    CAREFUL_Z = 4.0

    def __init__(self, budget, model, careful=True):
        """careful=False: the rule without its careful mode at small budgets (as before issue 22)."""
        self.budget = int(budget)
        self.model = model
        self.careful_allowed = careful

    def expected_total(self, journaled_tokens: int, inflight_streamed: Sequence[float]) -> tuple[float, float]:
        """Expected final kept tokens and the variance of that total (LengthModel.inflight_moments): the
        requests' own spread plus the error of the estimate they share, taken as one error common to all
        of them (the square of the summed standard errors: every request in flight is expected from the
        same finished lengths, so an estimate that is off is off for each)."""
        mean, var, se = self.model.inflight_moments(inflight_streamed)
        return float(journaled_tokens) + mean, var + se * se

    def careful(self) -> bool:
        """Whether one response's spread (the finished lengths' standard deviation; before MIN_SAMPLES
        of them, half of max_tokens) exceeds CAREFUL_SHARE of the budget."""
        m = self.model
        if not self.careful_allowed:
            return False
        if m.n >= LengthModel.MIN_SAMPLES:
            mean = m.sum / m.n
            spread = math.sqrt(max(0.0, m.squares / m.n - mean * mean))
        else:
            spread = m.max_tokens / 2
        return spread > self.CAREFUL_SHARE * self.budget

    def total_bound(self, journaled_tokens: int, inflight_streamed: Sequence[float], z: float | None = None) -> float:
        """An upper bound of the rule's  journaled + sum(E) + Z * sqrt(sum(Var))  without the
        per-request moments: LengthModel.moment_bounds bounds each request's mean by its value at
        the largest `streamed` in flight (it does not decrease in streamed) and each variance by
        its value at the smallest (it does not increase), so
            sum(E) <= n * mean_hi  and  sqrt(sum(Var)) <= sqrt(n * var_hi)."""
        n = len(inflight_streamed)
        if not n:
            return float(journaled_tokens)
        m = self.model
        mean_hi = m.moment_bounds(max(inflight_streamed))[0]
        var_hi = m.moment_bounds(min(inflight_streamed))[1]
        se_hi = math.sqrt(var_hi) * m.estimate_error_weight(m.beyond_counted(max(0, int(max(inflight_streamed)))))
        return journaled_tokens + n * mean_hi + (self.Z if z is None else z) * math.sqrt(n * var_hi + (n * se_hi) ** 2)

    def may_dispatch(self, journaled_tokens: int, inflight_streamed: Sequence[float]) -> bool:
        if journaled_tokens >= self.budget:
            return False
        z = self.Z
        if self.careful():
            if not len(inflight_streamed):
                return True  # the rest one request at a time
            inflight_streamed, z = list(inflight_streamed) + [0], self.CAREFUL_Z  # the one about to be sent
        # Far from the budget (most of a run) the bound decides without the per-request sums; it
        # is never below the full rule's total, so both decide alike.
        if inflight_streamed and self.total_bound(journaled_tokens, inflight_streamed, z) < self.budget:
            return True
        mean, var = self.expected_total(journaled_tokens, inflight_streamed)
        return mean + z * math.sqrt(var) < self.budget


def overshoot_pct(kept: int, budget: int) -> float:
    return 100.0 * (kept - budget) / budget if budget else math.nan
