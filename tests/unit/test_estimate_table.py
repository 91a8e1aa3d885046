"""budgetgen.estimate: the rate at full concurrency (not a run's ramp or drain), each cell's keep share,
and a table whose lines add up to its total."""

import re

import pytest

from budgetgen import estimate
from budgetgen.quality import Gate


def test_the_rate_is_the_one_at_full_concurrency_not_the_drain():
    # 4 streams of 100 tokens at 100 tok/s for 10 s (400 tok/s), then a drain: one stream alone for 10 s
    spans = [(t, t + 1.0, 100) for s in range(4) for t in range(10)] + [(10.0 + t, 11.0 + t, 100) for t in range(10)]
    assert estimate.full_concurrency_rate(spans) == pytest.approx(400.0)
    # the whole span's average, which the estimate used before, reads 250 tok/s (5,000 tokens / 20 s)
    assert sum(n for _, _, n in spans) / 20.0 == pytest.approx(250.0)
    # an earlier job 30 s before (a first run, then the budget raised): the latest job's rate, not the gap's
    earlier = [(t - 40.0, t - 39.0, 100) for s in range(8) for t in range(10)]
    assert estimate.full_concurrency_rate(earlier + spans) == pytest.approx(400.0)


def record(start, latency, tokens, cell="default", flags=(), prompt=10):
    return {"id": f"{cell}{start}", "identity": cell, "cell": cell, "created": 1.7e9 + start, "latency_s": latency,
            "flags": list(flags), "usage": {"completion_tokens": tokens, "prompt_tokens": prompt}}


def test_each_cell_has_its_own_keep_share():
    recs = [record(t, 1.0, 100, "think", flags=["truncated"] if t % 2 else []) for t in range(10)]
    recs += [record(t, 1.0, 100, "nothink") for t in range(10)]
    gate = {"think": Gate(truncated="drop"), "nothink": Gate()}
    rate = estimate.journal_rate(recs, lambda r: (r["cell"], gate[r["cell"]]))
    assert rate.keep == {"think": 0.5, "nothink": 1.0}
    assert rate.keep_of("think") == 0.5 and rate.keep_of("other") == 1.0
    assert rate.tokens_per_s == pytest.approx(200.0) and rate.latency_s == 1.0 and rate.prompt_ratio == 0.1


def remaining(name, gen, tps, kept_left=None, drain=0.0, prompts_counted=True):
    return estimate.Remaining(name, kept_left or int(gen), gen, gen / 100, tps, "its journal", 10**9,
                              drain_s=drain, prompts_counted=prompts_counted)


def cells(table, name):
    return next(line for line in table.splitlines() if line.startswith(f"budgetgen: {name} ")).split()


def test_the_lines_add_up_measured_datasets_run_at_once_and_gpu_hours_split_by_tokens():
    table = estimate.format_table([remaining("A", 360_000, 100.0), remaining("B", 180_000, 100.0)], None, 8)
    # A: 3,600 s at its own rate, B: 1,800 s; at once, the total is the longer; GPU-hours 8 x 1 h, split 2:1
    assert cells(table, "A")[5:8] == ["60", "min", "5.3"] and cells(table, "B")[5:8] == ["30", "min", "2.7"]
    assert cells(table, "total")[5:8] == ["60", "min", "8.0"]
    assert "the longest of these, as the jobs run at once" in table and "split by tokens to generate" in table


def test_without_journals_the_datasets_share_the_expected_rate_and_their_walls_add_up():
    table = estimate.format_table([remaining("A", 360_000, None, prompts_counted=False),
                                   remaining("B", 180_000, None, prompts_counted=False)], 100.0, None)
    assert cells(table, "A")[5:7] == ["60", "min"] and cells(table, "B")[5:7] == ["30", "min"]
    assert cells(table, "total")[5:7] == ["90", "min"]
    assert "A, B sharing the server's 100 tok/s (their walls add up)" in table
    assert re.search(r"hidden states of A, B: completion tokens only", table)


def test_nothing_left_is_a_zero_total():
    table = estimate.format_table([remaining("A", 0, 100.0, kept_left=0)], None, 8)
    assert not any(line.startswith("budgetgen: A ") for line in table.splitlines())
    assert cells(table, "total")[2:7] == ["0", "0", "?", "0", "s"]
