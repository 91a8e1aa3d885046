"""Prompt sets from Hugging Face `datasets` sources (datasets.D.source) with a column mapping: the
mapping, the import of every local format, and the one-line errors. Through the workflow:
tests/workflow/test_source_datasets.py."""


import pytest
from datasets import Dataset, DatasetDict

from budgetgen.errors import UserError
from budgetgen.prompts import load_prompts
from budgetgen.sources import import_prompts, map_row

ROWS = [
    {"uid": f"u{i}", "question": f"question {i}: explain topic {i}", "messages": "not a chat", "lang": "en"}
    for i in range(6)
]


def test_map_row_renames_and_drops_competing_prompt_fields():
    out = map_row(ROWS[0], {"prompt": "question", "id": "uid"})
    assert out == {"prompt": "question 0: explain topic 0", "id": "u0", "lang": "en"}


@pytest.mark.parametrize("kind", ["parquet", "arrow", "jsonl", "disk", "disk_dict"])
def test_import_every_local_format(tmp_path, kind):
    ds = Dataset.from_list(ROWS)
    path = tmp_path / f"src.{kind}"
    if kind == "parquet":
        ds.to_parquet(str(path))
    elif kind == "arrow":
        # the Arrow files datasets itself writes (save_to_disk's data files)
        ds.save_to_disk(str(tmp_path / "saved"))
        path = next((tmp_path / "saved").glob("*.arrow"))
    elif kind == "jsonl":
        ds.to_json(str(path), lines=True)
    elif kind == "disk":
        ds.save_to_disk(str(path))
    else:
        DatasetDict({"train": ds, "test": ds.select(range(2))}).save_to_disk(str(path))
    out = tmp_path / "prompts.jsonl"
    split = "test" if kind == "disk_dict" else "train"
    n = import_prompts(path, out, split=split, columns={"prompt": "question", "id": "uid"})
    pset = load_prompts(out)
    assert n == len(pset.prompts) == (2 if kind == "disk_dict" else 6)
    assert pset.prompts[1].id == "u1"
    assert pset.prompts[1].messages == ({"role": "user", "content": "question 1: explain topic 1"},)


def test_bad_row_names_the_source_row(tmp_path):
    rows = [dict(r) for r in ROWS]
    rows[3]["question"] = ""
    path = tmp_path / "src.parquet"
    Dataset.from_list(rows).to_parquet(str(path))
    with pytest.raises(UserError, match=r"src.parquet: row 4: .*empty"):
        import_prompts(path, tmp_path / "p.jsonl", columns={"prompt": "question"})
    assert not (tmp_path / "p.jsonl").exists()  # nothing half-written


@pytest.mark.parametrize("validate", [True, False], ids=["on_bad_line-error", "on_bad_line-skip"])
def test_row_with_bytes_that_are_not_utf8_names_row_and_column(tmp_path, validate):
    # Arrow cannot hold a lone surrogate (the prompts.jsonl bad line), but a Parquet file from
    # another writer can hold a string column with bytes that are not UTF-8 (here an encoded
    # surrogate, as WTF-8 writes a split emoji): one line naming the row, not a traceback
    import pyarrow as pa
    import pyarrow.parquet as pq

    raw = [f"question {i}".encode() for i in range(25)]
    raw[17] = b"split emoji \xed\xa0\xbd here"
    binary = pa.array(raw, pa.binary())
    strings = pa.Array.from_buffers(pa.string(), len(raw), binary.buffers())  # no UTF-8 check
    path = tmp_path / "src.parquet"
    pq.write_table(pa.table({"uid": [f"u{i}" for i in range(25)], "question": strings}), path)
    with pytest.raises(UserError) as excinfo:
        import_prompts(path, tmp_path / "p.jsonl", columns={"prompt": "question", "id": "uid"}, validate=validate)
    assert str(excinfo.value) == f"{path}: row 18: not valid UTF-8 (bad byte at offset 12) in column 'question'"
    assert not (tmp_path / "p.jsonl").exists()


def test_jsonl_source_with_a_lone_surrogate_names_the_parser_reason(tmp_path):
    path = tmp_path / "src.jsonl"
    path.write_text('{"question": "fine"}\n{"question": "bad \\ud800 text"}\n')
    with pytest.raises(UserError) as excinfo:
        import_prompts(path, tmp_path / "p.jsonl", columns={"prompt": "question"})
    assert str(excinfo.value).startswith(f"{path}: cannot load as json: ")
    assert "surrogate" in str(excinfo.value) and "\n" not in str(excinfo.value)


    path = tmp_path / "src.parquet"
    Dataset.from_list(ROWS).to_parquet(str(path))
    with pytest.raises(UserError, match=r"no column 'query' \(columns: uid, question, messages, lang\)"):
        import_prompts(path, tmp_path / "p.jsonl", columns={"prompt": "query"})
