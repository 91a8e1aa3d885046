"""What the remaining work costs (budgetgen.estimate), against what happened: a run on the mock at a
known rate journals a first part of the budget; the budget is raised; `-n` estimates the wall time of
the rest from the journal's own rate, and the run that follows takes that long within 20 %. Before any
journal, server.expected_tokens_per_s and server.gpus give the wall time and GPU-hours."""

import json
import re

import pytest

from support.workflow import Workflow, base_config, write_prompts

pytestmark = pytest.mark.slow


def estimate_line(output, name):
    line = next(x for x in output.splitlines() if x.startswith(f"budgetgen: {name} ")
                and re.search(r" (s|min|h) ", x))
    return line.split()


def seconds(cell_value, unit):
    return float(cell_value) * {"s": 1, "min": 60, "h": 3600}[unit]


def test_the_wall_time_estimate_matches_the_run_that_follows(tmp_path, server, tiny_tokenizer):
    # 20 tokens per response at 100 tokens/s per stream, 8 streams: ~800 tokens/s, timer-paced
    srv = server("--mean-tokens", "20", "--tokens-per-s", "100")
    wd = tmp_path / "work"
    write_prompts(wd / "p.jsonl", 2000)
    cfg = base_config(srv.base_url, tiny_tokenizer, {"D": {"prompts": "p.jsonl"}}, token_budget=4000,
                      max_tokens=64, concurrency=8)
    wf = Workflow(wd, cfg)
    wf.run("--cores", "2", "all")
    cfg["generation"]["token_budget"] = 16000
    wf.config = cfg
    wf.write_config()
    dry = wf.run("-n", "all")
    cells = estimate_line(dry.output, "D")
    assert cells[2:4] == ["12,000", "12,000"], dry.output[-3000:]  # kept tokens left, to generate
    requests = int(cells[4].replace(",", ""))
    assert 500 <= requests <= 700  # at the journal's mean length of 20
    estimated = seconds(cells[5], cells[6])
    assert "from its journal" in dry.output
    wf.run("--cores", "2", "all")
    done = json.loads(wf.path("results", "D", "inference.done").read_text())
    print(f"estimated {estimated:.1f} s, measured {done['wall_s']:.1f} s")
    assert abs(estimated - done["wall_s"]) <= 0.2 * done["wall_s"], (estimated, done["wall_s"])


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
    assert "GPU-hours at 8 GPUs" in dry.output
