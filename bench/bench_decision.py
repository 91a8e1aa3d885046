#!/usr/bin/env python3
"""Benchmark: the budget rule's cost per decision as a run grows (issue 22 goal 2).

A decision is DispatchPolicy.may_dispatch near the budget, where the far-from-budget shortcut does not
decide (the last concurrency x max_tokens tokens of a dataset: at 10M tokens, every completion of the
last several hundred thousand). Per size (finished responses: 10k, 100k, 1M, lognormal lengths of the
production shape, mean 3500, sigma 0.8, max_tokens 32768, so up to ~17,000 distinct lengths) and per
rule, a stretch of a run is replayed: each step one request in flight finishes (its length observed,
as the job does), a new one starts at 0, every other request streams on, then one decision.

  rebuilt      the rule before issue 22: the Kaplan-Meier view (lengths.CensoredLengths) of the finished
               lengths and the requests in flight built anew at every decision (O(distinct lengths)),
               then each request's moments one by one
  incremental  LengthModel.inflight_moments: the view rebuilt only when the finished lengths grew by
               1 % (amortised in the figure), every request's moments at once (numpy)

Both give the expected total and its variance; the table gives the time per decision (median of the
runs), and the largest difference of the two rules' expected totals, relative to its standard
deviation (what the margin Z = 2 is measured in).

    .venv/bin/python bench/bench_decision.py [--quick] [--sizes 10000,100000,1000000] [--steps N] [--runs N]
"""

import argparse
import math
import random
import time

import common  # noqa: F401 (puts scripts/ on sys.path)

from budgetgen.budget import DispatchPolicy
from budgetgen.lengths import CensoredLengths, LengthModel

MEAN, SIGMA, MAX_TOKENS, INFLIGHT = 3500, 0.8, 32768, 150
GOAL_US = 50


def length(rng):
    mu = math.log(MEAN) - SIGMA**2 / 2
    return min(MAX_TOKENS, max(1, round(rng.lognormvariate(mu, SIGMA))))


def rebuilt_total(model, journaled, inflight):
    """The rule's expected total as it was computed before: a fresh view, then a loop."""
    view = CensoredLengths(model, inflight)
    mean, var = float(journaled), 0.0
    for k in inflight:
        m, v = view.final_moments(k)
        mean += m
        var += v
    return mean, var


def replay(model, rule, steps, seed):
    """Seconds per decision over `steps` steps of a run (see the module docstring) and the totals."""
    rng = random.Random(seed)
    inflight = [rng.randrange(0, MEAN) for _ in range(INFLIGHT)]
    targets = [length(rng) for _ in range(INFLIGHT)]
    policy = DispatchPolicy(10**15, model)
    journaled, totals, spent = 0, [], 0.0
    if rule == "incremental":  # the view as a run has it: built at the last 1 % of growth, not in the replay
        policy.expected_total(journaled, inflight)
    for _ in range(steps):
        # every request streams at one rate: the one nearest its end finishes, a new one starts at 0
        d = min(t - k for k, t in zip(inflight, targets, strict=True))
        inflight = [k + d for k in inflight]
        i = min(range(INFLIGHT), key=lambda j: targets[j] - inflight[j])
        done = targets[i]
        inflight[i], targets[i] = 0, length(rng)
        t0 = time.perf_counter()
        model.observe(done)
        journaled += done
        if rule == "rebuilt":
            total = rebuilt_total(model, journaled, inflight)
        else:
            total = policy.expected_total(journaled, inflight)
        spent += time.perf_counter() - t0
        totals.append(total)
    return spent / steps, totals


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="10000,100000,1000000", help="finished responses before the replay")
    ap.add_argument("--steps", type=int, default=300, help="decisions replayed per run")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="10k and 100k, 100 steps, 1 run")
    ap.add_argument("--output", default="decision")
    a = ap.parse_args(argv)
    sizes = [10_000, 100_000] if a.quick else [int(x) for x in a.sizes.split(",")]
    steps, runs = (100, 1) if a.quick else (a.steps, a.runs)
    rows = []
    for n in sizes:
        rng = random.Random(n)
        finished = [length(rng) for _ in range(n)]
        per = {"rebuilt": [], "incremental": []}
        worst_sd = 0.0
        for run in range(runs):
            totals = {}
            for rule in per:
                model = LengthModel(MAX_TOKENS, finished)
                seconds, totals[rule] = replay(model, rule, steps, seed=run)
                per[rule].append(seconds)
            for (m0, v0), (m1, _) in zip(totals["rebuilt"], totals["incremental"], strict=True):
                worst_sd = max(worst_sd, abs(m1 - m0) / math.sqrt(v0) if v0 else 0.0)
        distinct = len(LengthModel(MAX_TOKENS, finished).distinct)
        r, i = common.median(per["rebuilt"]) * 1e6, common.median(per["incremental"]) * 1e6
        rows.append([f"{n:,}", f"{distinct:,}", INFLIGHT, f"{r:,.0f}", f"{i:,.1f}", f"{r / i:,.0f}x",
                     f"{worst_sd:.4f}", "yes" if n < 1_000_000 or i <= GOAL_US else "no"])
    notes = [
        f"Production shape: lognormal lengths, mean {MEAN}, sigma {SIGMA}, max_tokens {MAX_TOKENS}, {INFLIGHT} in "
        f"flight; {steps} decisions per run, median of {runs} run(s); each decision includes observing the "
        "response that finished before it (as the inference job does).",
        "rebuilt: the rule before issue 22 (a Kaplan-Meier view built at every decision, then a per-request loop). "
        "incremental: LengthModel.inflight_moments (the view rebuilt when the finished lengths grew by 1 %: "
        "at 10k every 100 responses, so the replay includes rebuilds, at 1M every 10,000, the cost of one spread over "
        "them; the in-flight moments vectorized).",
        "difference: the largest |expected total (incremental) - expected total (rebuilt)| over the decisions, "
        "in standard deviations of the rebuilt total (the rule stops Z = 2 of them below the budget).",
        f"Goal: <= {GOAL_US} us per decision at 1M finished responses.",
    ]
    common.report(a.output, "Budget rule: time per decision near the budget, rebuilt vs incremental",
                  ["finished responses", "distinct lengths", "in flight", "rebuilt us/decision",
                   "incremental us/decision", "speed-up", "difference (sd)", "goal met"], rows, notes)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
