"""A dataset from a `datasets` source (datasets.D.source) through real snakemake runs against the
mock server: imported once by rule import_prompts, then generated like a prompts file; prompts and
source together are a config error."""

import json

from datasets import Dataset

from support.workflow import Workflow, base_config, planned_jobs

ROWS = [
    {"uid": f"u{i}", "question": f"question {i}: explain topic {i}", "messages": "not a chat", "lang": "en"}
    for i in range(6)
]


def test_workflow_with_a_parquet_source(tmp_path, server, tiny_tokenizer):
    srv = server("--mean-tokens", "20")
    wf_dir = tmp_path / "work"
    (wf_dir / "data").mkdir(parents=True)
    Dataset.from_list(ROWS).to_parquet(str(wf_dir / "data" / "b4.parquet"))
    source = {"path": "data/b4.parquet", "columns": {"prompt": "question", "id": "uid"}}
    wf = Workflow(wf_dir, base_config(srv.base_url, tiny_tokenizer, {"B4": {"source": source}},
                                      token_budget=10**6))
    dry = wf.run("-n", "all")
    assert planned_jobs(dry.output).get("import_prompts") == 1
    wf.run("--cores", "2", "all")
    raw = wf.records("B4", "raw_responses.jsonl")
    assert sorted(r["id"] for r in raw) == [f"u{i}" for i in range(6)]
    assert raw[0]["messages"][0] == {"role": "user", "content": f"question {raw[0]['id'][1:]}: explain topic "
                                                                f"{raw[0]['id'][1:]}"}
    status = json.loads(wf.path("results", "B4", "budget_status.json").read_text())
    assert status["prompts"] == 6
    assert "Nothing to be done" in wf.run("-n", "all").output


def test_prompts_and_source_together_is_a_config_error(tmp_path, tiny_tokenizer):
    wf_dir = tmp_path / "work"
    (wf_dir / "p.jsonl").parent.mkdir(parents=True)
    (wf_dir / "p.jsonl").write_text('{"prompt": "x"}\n')
    wf = Workflow(wf_dir, base_config("http://127.0.0.1:9/v1", tiny_tokenizer,
                                      {"X": {"prompts": "p.jsonl", "source": {"path": "p.jsonl"}}}))
    proc = wf.run("-n", "all", check=False)
    assert proc.returncode != 0 and "datasets.X: give exactly one of prompts or source" in proc.output
