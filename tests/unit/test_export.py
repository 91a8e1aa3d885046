"""The pre-tokenized JSON Lines export ({id, input_ids, loss_mask} a line, the rows SpecForge's
`data.prompts_path` and `speculators prepare-data --data` read), written from tokenized.arrow streams.
`snakemake export` end to end: tests/workflow/test_export_target.py; the trainers themselves: tests/interop."""

import json
import os

import pyarrow as pa
import pytest
from datasets import Dataset

from budgetgen.errors import UserError
from budgetgen.export import to_pretokenized_jsonl
from budgetgen.tokenization import _schema

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
