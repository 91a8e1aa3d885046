"""`snakemake export`: SpecForge conversations JSONL, the pre-tokenized JSONL the trainers read
(SpecForge `data.prompts_path`, `speculators prepare-data --data`; tests/interop loads it with the
trainers themselves) and a pre-tokenized save_to_disk folder."""

import json
import os

import pyarrow as pa
import pytest
from datasets import Dataset, load_from_disk

from budgetgen.errors import UserError
from budgetgen.export import to_pretokenized_jsonl
from budgetgen.tokenization import _schema
from conftest import Workflow, base_config, write_prompts


def test_export_target_writes_specforge_jsonl_pretokenized_jsonl_and_hf_dataset(tmp_path, server, tiny_tokenizer):
    srv = server("--mean-tokens", "15", "--reasoning-share", "0.4")
    wf_dir = tmp_path / "work"
    write_prompts(wf_dir / "prompts" / "A.jsonl", 8, prefix="A", fmt="messages")
    wf = Workflow(wf_dir, base_config(srv.base_url, tiny_tokenizer, {"A": {"prompts": "prompts/A.jsonl"}},
                                      token_budget=10**6))
    wf.run("--cores", "2", "all")
    wf.run("--cores", "1", "export")
    raw = wf.records("A", "raw_responses.jsonl")
    lines = wf.path("results", "A", "export", "specforge.jsonl").read_text().splitlines()
    exported = [json.loads(line) for line in lines]
    assert [r["id"] for r in exported] == [r["id"] for r in raw]
    for rec, src in zip(exported, raw):
        assert set(rec) == {"id", "conversations"}
        assert rec["conversations"][-1]["role"] == "assistant"
        assert rec["conversations"][-1]["content"] == src["messages"][-1]["content"]
        assert rec["conversations"][-1]["reasoning_content"] == src["messages"][-1]["reasoning_content"]
    hf = load_from_disk(str(wf.path("results", "A", "export", "hf_dataset")))
    tokenized = Dataset.from_file(str(wf.path("results", "A", "tokenized.arrow")))
    assert hf["id"] == tokenized["id"] and hf["input_ids"] == tokenized["input_ids"]
    assert hf["loss_mask"] == tokenized["loss_mask"]
    assert all(m == [1] * len(ids) for m, ids in zip(hf["attention_mask"], hf["input_ids"]))
    pre = [json.loads(line) for line in wf.path("results", "A", "export", "pretokenized.jsonl").read_text().splitlines()]
    assert [set(r) for r in pre] == [{"id", "input_ids", "loss_mask"}] * tokenized.num_rows
    assert [r["id"] for r in pre] == tokenized["id"]
    assert [r["input_ids"] for r in pre] == tokenized["input_ids"]
    assert [r["loss_mask"] for r in pre] == tokenized["loss_mask"]
    assert "Nothing to be done" in wf.run("-n", "export").output


SCHEMA = pa.schema([_schema().field(f) for f in ("id", "input_ids", "loss_mask")])  # tokenized.arrow's types


def write_stream(path, batches, schema=SCHEMA):
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_stream(sink, schema) as writer:
        for rows in batches:
            writer.write_batch(pa.RecordBatch.from_pylist(rows, schema=schema))


ROWS = [
    {"id": "a", "input_ids": [2**31 - 1, 0, 151643, 7], "loss_mask": [0, 1, 1, 0]},
    {"id": "ü/2", "input_ids": [5], "loss_mask": [1]},
    {"id": "c", "input_ids": list(range(300)), "loss_mask": [0] * 100 + [1] * 200},
]


def test_pretokenized_jsonl_is_the_arrow_rows_one_json_object_a_line(tmp_path):
    src = tmp_path / "tokenized.arrow"
    write_stream(src, [ROWS[:2], [], ROWS[2:]])  # several batches, one empty
    out = tmp_path / "export" / "pretokenized.jsonl"
    assert to_pretokenized_jsonl(src, out) == 3
    text = out.read_text(encoding="utf-8")
    assert text.endswith("\n") and text.count("\n") == 3
    assert [json.loads(line) for line in text.splitlines()] == ROWS
    assert '"input_ids":[2147483647,0,151643,7]' in text  # plain JSON integers, compact
    umask = os.umask(0)
    os.umask(umask)
    assert os.stat(out).st_mode & 0o777 == 0o666 & ~umask  # not mkstemp's private 0600
    assert Dataset.from_file(str(src))["input_ids"] == [r["input_ids"] for r in ROWS]


def test_pretokenized_jsonl_of_an_empty_dataset_is_an_empty_file(tmp_path):
    src = tmp_path / "tokenized.arrow"
    write_stream(src, [])
    out = tmp_path / "pretokenized.jsonl"
    assert to_pretokenized_jsonl(src, out) == 0
    assert out.read_text() == ""


def test_pretokenized_jsonl_is_written_atomically(tmp_path):
    """A failure part-way (here a bad row in the second batch) leaves the previous export whole and
    no temporary file behind; so does a missing or non-Arrow input."""
    out = tmp_path / "pretokenized.jsonl"
    out.write_text("previous export\n")
    bad = tmp_path / "bad.arrow"
    write_stream(bad, [ROWS, [{"id": "x", "input_ids": [1, 2], "loss_mask": [1]}]])
    with pytest.raises(UserError, match=r"bad.arrow: row 3 \(id 'x'\): 2 input_ids but 1 loss_mask"):
        to_pretokenized_jsonl(bad, out)
    not_arrow = tmp_path / "not.arrow"
    not_arrow.write_text("{}\n")
    with pytest.raises(UserError, match="not an Arrow IPC stream"):
        to_pretokenized_jsonl(not_arrow, out)
    with pytest.raises(UserError, match="no such file"):
        to_pretokenized_jsonl(tmp_path / "missing.arrow", out)
    other = pa.schema([("id", pa.string()), ("text", pa.string())])
    write_stream(tmp_path / "other.arrow", [[{"id": "a", "text": "t"}]], schema=other)
    with pytest.raises(UserError, match="no column input_ids, loss_mask"):
        to_pretokenized_jsonl(tmp_path / "other.arrow", out)
    assert out.read_text() == "previous export\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.arrow", "not.arrow", "other.arrow",
                                                          "pretokenized.jsonl"]
