"""The report figures: the plotted numbers (pure functions over records), the drawn SVGs (which
carry their numbers as text) and the plot_dataset.py entry point. Rule `plots` in a real workflow run:
tests/workflow/test_plots_rule.py."""

import subprocess
import sys
import xml.etree.ElementTree as ET

import pytest

from budgetgen import plots
from support import REPO

SVG = "{http://www.w3.org/2000/svg}"


def rec(tokens, finish="stop", created=None, latency=None, attempts=1, reasoning=None, content="answer",
        reasoning_tokens=None):
    usage = {"prompt_tokens": 5, "completion_tokens": tokens}
    if reasoning_tokens is not None:
        usage["completion_tokens_details"] = {"reasoning_tokens": reasoning_tokens}
    turn = {"role": "assistant", "content": content}
    if reasoning is not None:
        turn["reasoning_content"] = reasoning
    r = {"id": f"r{tokens}-{created}", "messages": [{"role": "user", "content": "q"}, turn],
         "finish_reason": finish, "attempts": attempts, "usage": usage}
    if created is not None:
        r["created"], r["latency_s"] = created, latency
    return r


def svg_text(path):
    return " ".join("".join(t.itertext()) for t in ET.parse(path).getroot().iter(f"{SVG}text"))


def test_length_histogram_counts_cut_responses_apart_and_max_tokens_in_the_last_bin():
    records = [rec(10), rec(10), rec(55), rec(100, "length"), rec(100, "length")]
    hist = plots.length_histogram(records, max_tokens=100, bins=10)
    assert hist["edges"][0] == 0 and hist["edges"][-1] == 100 and len(hist["edges"]) == 11
    assert hist["finished"][1] == 2 and hist["finished"][5] == 1 and sum(hist["finished"]) == 3
    assert hist["cut"][9] == 2 and sum(hist["cut"]) == 2
    assert plots.cut_share(records) == {"cut": 2, "total": 5, "share": 0.4}
    assert plots.cut_share([])["share"] == 0.0


def test_length_histogram_stretches_past_max_tokens_when_a_response_is_longer():
    hist = plots.length_histogram([rec(300)], max_tokens=100, bins=3)
    assert hist["edges"][-1] == 300 and hist["finished"] == [0, 0, 1]


def test_reasoning_uses_the_server_count_when_present_else_the_character_share():
    assert plots.reasoning_tokens(rec(100, reasoning="x" * 10, reasoning_tokens=30)) == (30, 70, "usage")
    # 30 reasoning characters vs 10 answer characters: 3/4 of the 100 tokens
    assert plots.reasoning_tokens(rec(100, reasoning="x" * 30, content="y" * 10)) == (75, 25, "estimated")
    assert plots.reasoning_tokens(rec(100)) == (0, 100, None)
    assert plots.reasoning_tokens(rec(100, reasoning_tokens=0)) == (0, 100, None)
    split = plots.reasoning_split([rec(100, reasoning_tokens=30), rec(40, reasoning="ab", content="ab"), rec(60)])
    assert split["reasoning"] == 50 and split["answer"] == 150
    assert split["counted"] == 1 and split["estimated"] == 1
    assert split["shares"] == [0.3, 0.5, 0.0]


def test_reasoning_split_is_none_without_reasoning():
    assert plots.reasoning_split([rec(10), rec(20)]) is None


def test_budget_bar_and_error_counts():
    assert plots.budget_bar(1500, 1000, "met") == {"tokens": 1500, "budget": 1000, "state": "met", "share": 1.5}
    errors = [{"id": "a", "status": 400}, {"id": "b", "status": 400}, {"id": "c", "status": 404}]
    counts = plots.error_counts([rec(5, attempts=1), rec(6, attempts=3), rec(7)], errors)
    assert counts == {"failed": {"HTTP 400": 2, "HTTP 404": 1}, "retried": 1, "answered": 3}


def test_nice_step():
    assert [plots.nice_step(x) for x in (0.03, 0.1, 0.11, 3, 7, 40)] == [0.05, 0.1, 0.2, 5, 10, 50]


def test_throughput_spreads_tokens_over_each_request_and_keeps_the_total():
    # 100 tokens over [0, 2] s and 60 tokens over [1, 4] s (plus a start offset of 1000 s)
    records = [rec(100, created=1000.0, latency=2.0), rec(60, created=1001.0, latency=3.0)]
    tp = plots.throughput(records, max_bins=4)
    assert tp["t0"] == 1000.0 and tp["bin_s"] == 1.0 and tp["starts"] == [0.0, 1.0, 2.0, 3.0]
    assert tp["tokens_per_s"] == pytest.approx([50.0, 70.0, 20.0, 20.0])
    assert sum(tp["tokens_per_s"]) * tp["bin_s"] == pytest.approx(160)
    assert tp["mean_tokens_per_s"] == pytest.approx(160 / 4)


def test_throughput_shows_a_pause_between_runs_as_empty_bins_and_handles_zero_latency():
    records = [rec(10, created=0.0, latency=1.0), rec(10, created=9.0, latency=0.0), rec(5)]  # last: no time
    tp = plots.throughput(records, max_bins=9)
    assert tp["bin_s"] == 1.0 and len(tp["starts"]) == 9
    assert tp["tokens_per_s"][0] == 10 and tp["tokens_per_s"][-1] == 10 and not any(tp["tokens_per_s"][1:-1])
    assert plots.throughput([rec(5)])["starts"] == []


def test_figures_without_reasoning_or_errors_say_so(tmp_path):
    records = [rec(10, created=0.0, latency=0.5)]
    row = {"completion_tokens": 10, "kept_tokens": 10, "token_budget": 100, "status": "exhausted", "responses": 1,
           "prompts": 1, "conversations": 1, "conversations_finished": 1, "conversations_ended_by_error": 0}
    for name in plots.FIGURES:
        plots.save(plots.draw(name, "D", records, [], row, 64), tmp_path / f"{name}.svg")
    assert "no reasoning in these responses" in svg_text(tmp_path / "reasoning.svg")
    assert "no prompt failed" in svg_text(tmp_path / "errors.svg")
    assert "10 of 100 completion tokens (10.0%)" in svg_text(tmp_path / "budget.svg")


def test_entry_point_help_and_one_line_errors(tmp_path):
    script = str(REPO / "scripts" / "plot_dataset.py")
    assert "--throughput-figure" in subprocess.run([sys.executable, script, "--help"], capture_output=True,
                                                   text=True, check=True).stdout
    p = subprocess.run([sys.executable, script, "--dataset", "D", "--raw", str(tmp_path / "none.jsonl"),
                        "--prompts", "p", "--errors", "e", "--budget", "1", "--max-tokens", "1",
                        "--budget-figure", str(tmp_path / "b.svg")], capture_output=True, text=True, check=False)
    assert p.returncode == 2 and p.stderr.strip() == f"error: {tmp_path / 'none.jsonl'}: raw responses not found"
    p = subprocess.run([sys.executable, script, "--dataset", "D", "--raw", "r", "--prompts", "p", "--errors", "e",
                        "--budget", "1", "--max-tokens", "1", "--budget-figure", str(tmp_path / "b.pdf")],
                       capture_output=True, text=True, check=False)
    assert p.returncode == 2 and "figure format must be .svg or .png" in p.stderr


def test_every_reason_a_response_is_dropped_for_has_its_colour_in_the_quality_figure():
    """quality.REASONS grew (issue 42: repetition, replacement_chars, template_leak): a reason without a
    colour would silently leave its dropped responses out of figure 7."""
    from budgetgen.plots import REASON_COLORS
    from budgetgen.quality import REASONS

    assert set(REASON_COLORS) == set(REASONS) and len(set(REASON_COLORS.values())) == len(REASONS)
