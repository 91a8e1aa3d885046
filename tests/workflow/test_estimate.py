"""What the remaining work costs (budgetgen.estimate), against what happened, on a timer-paced mock: `-n`
estimates the wall time of the rest from the journal's own rate at full concurrency, and the run that
follows takes that long within 15 %, in three cases: a finished run whose budget is raised (its journal
ends with a drain), a run killed with kill -9 and resumed, and a think/nothink mixture whose think cell
drops 30-50 % of its responses (each cell's keep share). An exhausted dataset shows no work. Before any
journal, server.expected_tokens_per_s and server.gpus give the wall time and GPU-hours."""

import json
import re

import pytest

from support.workflow import Workflow, base_config, wait_for, write_prompts

pytestmark = pytest.mark.slow


def estimate_line(output, name):
    line = next(x for x in output.splitlines() if x.startswith(f"budgetgen: {name} ")
                and re.search(r" (s|min|h) ", x))
    return line.split()


def seconds(cell_value, unit):
    return float(cell_value) * {"s": 1, "min": 60, "h": 3600}[unit]


def estimated_then_run(wf, dataset="D"):
    """(the wall `-n` estimates for the dataset's remaining work, the estimate's table line, the wall of
    the inference job that follows (its done marker), its state)."""
    dry = wf.run("-n", "all")
    cells = estimate_line(dry.output, dataset)
    estimated = seconds(cells[5], cells[6])
    assert "at full concurrency" in dry.output, dry.output[-3000:]
    wf.run("--cores", "2", "all")
    done = json.loads(wf.path("results", dataset, "inference.done").read_text())
    print(f"estimated {estimated:.1f} s, measured {done['wall_s']:.1f} s "
          f"({(estimated - done['wall_s']) / done['wall_s']:+.1%})")
    return estimated, cells, done


def timed_workflow(tmp_path, server, tokenizer, n_prompts, budget, **dataset):
    """A dataset D against a timer-paced mock: 20-token responses at 100 tokens/s per stream, 8 streams
    (~800 tokens/s), so the client's CPU (and a loaded machine) does not set the pace."""
    srv = server("--mean-tokens", "20", "--tokens-per-s", "100", "--reasoning-share", "0.3")
    wd = tmp_path / "work"
    write_prompts(wd / "p.jsonl", n_prompts)
    cfg = base_config(srv.base_url, tokenizer, {"D": {"prompts": "p.jsonl", **dataset}}, token_budget=budget,
                      max_tokens=64, concurrency=8)
    return Workflow(wd, cfg)


def raise_budget(wf, budget):
    wf.config["generation"]["token_budget"] = budget
    wf.write_config()


def test_a_finished_run_whose_budget_is_raised_is_estimated_at_full_concurrency(tmp_path, server, tiny_tokenizer):
    """The finished run's journal ends with its drain (few requests in flight): the rate at full
    concurrency, not the whole run's average, gives the run that follows within 15 %."""
    wf = timed_workflow(tmp_path, server, tiny_tokenizer, 2000, 4000)
    wf.run("--cores", "2", "all")
    raise_budget(wf, 16000)
    estimated, cells, done = estimated_then_run(wf)
    assert cells[2:4] == ["12,000", "12,000"], cells  # kept tokens left, to generate
    assert 500 <= int(cells[4].replace(",", "")) <= 700  # requests at the journal's mean length of 20
    assert done["state"] == "met"
    assert abs(estimated - done["wall_s"]) <= 0.15 * done["wall_s"], (estimated, done["wall_s"])


def test_a_killed_run_resumed_is_estimated_within_15_percent(tmp_path, server, tiny_tokenizer):
    wf = timed_workflow(tmp_path, server, tiny_tokenizer, 2000, 16000)
    proc = wf.start("--cores", "2", "all")
    wait_for(lambda: len(wf.journal_lines("D")) >= 200, timeout=120, what="200 records journaled")
    wf.killpg(proc)  # kill -9 of the run, mid-inference: its journal has no drain
    wf.run("--unlock")
    estimated, cells, done = estimated_then_run(wf)
    assert done["state"] == "met"
    assert abs(estimated - done["wall_s"]) <= 0.15 * done["wall_s"], (estimated, done["wall_s"])


def test_a_mixture_whose_think_cell_drops_responses_is_estimated_at_each_cells_keep_share(
        tmp_path, server, tiny_tokenizer):
    """think: max_tokens 20 on lognormal lengths of mean 20 cuts ~40 % of its responses, which its gate
    drops; nothink keeps all. The tokens to generate count each cell's keep share, and the run follows."""
    srv = server("--length-dist", "lognormal", "--mean-tokens", "20", "--sigma", "0.5", "--tokens-per-s", "100",
                 "--reasoning-share", "0.3")
    wd = tmp_path / "work"
    write_prompts(wd / "p.jsonl", 3000)
    mixture = {"think": {"share": 0.5, "max_tokens": 20, "quality": {"truncated": "drop"},
                         "extra_body": {"chat_template_kwargs": {"enable_thinking": True}}},
               "nothink": {"share": 0.5, "extra_body": {"chat_template_kwargs": {"enable_thinking": False}}}}
    wf = Workflow(wd, base_config(srv.base_url, tiny_tokenizer, {"D": {"prompts": "p.jsonl", "mixture": mixture}},
                                  token_budget=4000, max_tokens=64, concurrency=8))
    wf.run("--cores", "2", "all")
    think = [r for r in wf.records("D") if r.get("cell") == "think"]
    cut = [r["finish_reason"] == "length" for r in think]
    assert 0.3 <= sum(cut) / len(think) <= 0.5, sum(cut) / len(think)  # the premise: 30-50 % of them dropped
    tokens = [r["usage"]["completion_tokens"] for r in think]
    keep = sum(n for n, c in zip(tokens, cut) if not c) / sum(tokens)  # of the tokens: the cut ones are longer
    raise_budget(wf, 16000)
    estimated, cells, done = estimated_then_run(wf)
    kept_left, generate = (int(c.replace(",", "")) for c in cells[2:4])
    # the think cell's half of what is left needs 1 / keep of it generated, the nothink half itself
    assert generate == pytest.approx(kept_left / 2 + kept_left / 2 / keep, rel=0.05), (kept_left, generate, keep)
    assert done["state"] == "met"
    assert abs(estimated - done["wall_s"]) <= 0.15 * done["wall_s"], (estimated, done["wall_s"])


def test_an_exhausted_dataset_shows_no_work(tmp_path, server, tiny_tokenizer):
    wf = timed_workflow(tmp_path, server, tiny_tokenizer, 20, 10**6)
    wf.run("--cores", "2", "all")
    dry = wf.run("-n", "all")
    assert not any(x.startswith("budgetgen: D ") and re.search(r" (s|min|h) ", x) for x in dry.output.splitlines())
    total = next(x for x in dry.output.splitlines() if x.startswith("budgetgen: total "))
    assert total.split()[2:7] == ["0", "0", "?", "0", "s"], total


def test_before_any_journal_the_config_gives_the_rate_and_the_gpus(tmp_path, server, tiny_tokenizer):
    srv = server()
    wd = tmp_path / "work"
    write_prompts(wd / "p.jsonl", 50)
    cfg = base_config(srv.base_url, tiny_tokenizer, {"D": {"prompts": "p.jsonl"}}, token_budget=360_000)
    cfg["server"].update(expected_tokens_per_s=1000, gpus=8)
    wf = Workflow(wd, cfg)
    dry = wf.run("-n", "all")
    cells = estimate_line(dry.output, "D")
    assert cells[5:8] == ["360", "s", "0.8"], dry.output[-3000:]  # 360k tokens at 1,000 tok/s; x 8 GPUs
    assert re.search(r"budgetgen: total .* 360 +s +0\.8 ", dry.output)
    assert "GPU-hours: 8 GPUs x the total wall" in dry.output
