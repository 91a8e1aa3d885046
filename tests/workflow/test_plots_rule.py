"""Rule `plots` in a real workflow run against the mock server: each dataset's figures are drawn from
its own responses, read back from the SVGs, which carry their numbers as text."""

import json
import xml.etree.ElementTree as ET

import pytest

from budgetgen import plots
from support.workflow import Workflow, base_config, write_prompts

SVG = "{http://www.w3.org/2000/svg}"


def svg_text(path):
    return " ".join("".join(t.itertext()) for t in ET.parse(path).getroot().iter(f"{SVG}text"))


@pytest.mark.slow
def test_rule_plots_draws_each_dataset_from_its_responses(tmp_path, server, tiny_tokenizer):
    srv = server("--length-dist", "lognormal", "--mean-tokens", "40", "--reasoning-share", "0.3",
                 "--context-limit", "200")
    wf_dir = tmp_path / "work"
    write_prompts(wf_dir / "prompts" / "A.jsonl", 100, prefix="A")
    write_prompts(wf_dir / "prompts" / "B.jsonl", 6, prefix="B")
    with open(wf_dir / "prompts" / "B.jsonl", "a") as f:  # two prompts the context limit refuses (HTTP 400)
        for i in range(2):
            f.write(json.dumps({"prompt": "long " * 150 + str(i)}) + "\n")
    datasets = {"A": {"prompts": "prompts/A.jsonl", "token_budget": 800},
                "B": {"prompts": "prompts/B.jsonl", "token_budget": 10**6}}
    wf = Workflow(wf_dir, base_config(srv.base_url, tiny_tokenizer, datasets, max_tokens=96))
    targets = [f"results/{ds}/plots/{name}.svg" for ds in datasets for name in plots.FIGURES]
    wf.run("--cores", "2", *targets)
    text = {(ds, name): svg_text(wf.path("results", ds, "plots", f"{name}.svg"))
            for ds in datasets for name in plots.FIGURES}
    a_raw, b_raw = wf.records("A", "raw_responses.jsonl"), wf.records("B", "raw_responses.jsonl")
    a_tokens = sum(r["usage"]["completion_tokens"] for r in a_raw)
    assert f"A: {a_tokens:,} of 800 completion tokens" in text["A", "budget"] and "— met" in text["A", "budget"]
    assert "— exhausted" in text["B", "budget"] and f"{len(b_raw)} responses from 8 prompts" in text["B", "budget"]
    cut = sum(r["finish_reason"] == "length" for r in a_raw)
    assert f"{cut} of {len(a_raw)} " in text["A", "lengths"] and "max_tokens=96" in text["A", "lengths"]
    assert "(counted by the server)" in text["A", "reasoning"]
    assert (len(wf.records("B", "errors.jsonl")) == 2 and "failed: HTTP 400" in text["B", "errors"]
            and "no prompt failed" in text["A", "errors"])
    assert "throughput over the run" in text["A", "throughput"]
    assert wf.path("logs", "plots", "A.log").read_text().count("figure ->") == len(plots.FIGURES)
    assert "Nothing to be done" in wf.run("-n", *targets).output
