"""`snakemake export` after a real run against the mock server: SpecForge conversations JSONL, the
pre-tokenized JSONL the trainers read (SpecForge `data.prompts_path`, `speculators prepare-data --data`;
tests/interop loads it with the trainers themselves) and a pre-tokenized save_to_disk folder."""

import json

from datasets import Dataset, load_from_disk

from support.workflow import Workflow, base_config, write_prompts


def test_export_target_writes_specforge_jsonl_pretokenized_jsonl_and_hf_dataset(tmp_path, server, tiny_tokenizer):
    srv = server("--mean-tokens", "15", "--reasoning-share", "0.4")
    wf_dir = tmp_path / "work"
    write_prompts(wf_dir / "prompts" / "A.jsonl", 8, prefix="A", fmt="messages")
    wf = Workflow(wf_dir, base_config(srv.base_url, tiny_tokenizer, {"A": {"prompts": "prompts/A.jsonl"}},
                                      token_budget=10**6))
    wf.run("--cores", "2", "all")
    wf.run("--cores", "1", "export")
    assert not list(wf.path("results").rglob("cache-*.arrow"))  # no datasets cache files left beside the rows
    raw = wf.records("A", "raw_responses.jsonl")
    lines = wf.path("results", "A", "export", "specforge.jsonl").read_text().splitlines()
    exported = [json.loads(line) for line in lines]
    assert [r["id"] for r in exported] == [r["id"] for r in raw]
    for rec, src in zip(exported, raw):
        assert set(rec) == {"id", "conversations", "cell"} and rec["cell"] == "default"
        assert rec["conversations"][-1]["role"] == "assistant"
        assert rec["conversations"][-1]["content"] == src["messages"][-1]["content"]
        assert rec["conversations"][-1]["reasoning_content"] == src["messages"][-1]["reasoning_content"]
    hf = load_from_disk(str(wf.path("results", "A", "export", "hf_dataset")))
    tokenized = Dataset.from_file(str(wf.path("results", "A", "tokenized.arrow")))
    assert hf["id"] == tokenized["id"] and hf["input_ids"] == tokenized["input_ids"]
    assert hf["loss_mask"] == tokenized["loss_mask"]
    assert all(m == [1] * len(ids) for m, ids in zip(hf["attention_mask"], hf["input_ids"]))
    pre = [json.loads(line)
           for line in wf.path("results", "A", "export", "pretokenized.jsonl").read_text().splitlines()]
    assert [set(r) for r in pre] == [{"id", "input_ids", "loss_mask", "cell"}] * tokenized.num_rows
    assert [r["id"] for r in pre] == tokenized["id"]
    assert [r["input_ids"] for r in pre] == tokenized["input_ids"]
    assert [r["loss_mask"] for r in pre] == tokenized["loss_mask"]
    assert "Nothing to be done" in wf.run("-n", "export").output
