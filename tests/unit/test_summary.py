"""results/summary.tsv rows (budgetgen.summary): the tokenize skips per reason come from tokenized.arrow."""

import json

from budgetgen.summary import COLUMNS, dataset_row, format_tsv, read_raw
from budgetgen.tokenization import TokenizeOptions, tokenize_file
from budgetgen_testkit.records import stamped


def test_summary_row_shows_tokenize_skips_per_reason(tmp_path, tiny_tokenizer):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"id": f"p{i}", "prompt": f"q {i}"}) + "\n" for i in range(3)))
    raw = tmp_path / "raw.jsonl"
    long_user = {"role": "user", "content": "spider legs " * 400}
    recs = [{"id": f"p{i}", "messages": [long_user if i == 2 else {"role": "user", "content": f"q {i}"},
                                         {"role": "assistant", "content": "eight"}],
             "finish_reason": "stop", "params": {"model": "m"}, "usage": {"completion_tokens": 2}} for i in range(3)]
    raw.write_text("".join(json.dumps(stamped(r)) + "\n" for r in recs))
    out = tmp_path / "tokenized.arrow"
    tokenize_file(str(raw), str(out), TokenizeOptions(tokenizer=tiny_tokenizer, max_length=256, max_skipped_pct=50),
                  log=lambda m: None)
    row = dataset_row("D", read_raw(str(raw)), 100, str(prompts), str(tmp_path / "errors.jsonl"), str(out))
    assert row["tokenized_rows"] == 2 and row["tokenize_skipped"] == "no_supervised_tokens=1"
    assert row["status"] == "exhausted" and row["responses"] == 3
    assert format_tsv([row]).splitlines()[0].split("\t") == COLUMNS
