"""Server token ids (server.return_token_ids / tokenizer.use_server_token_ids) in real workflow runs
against the mock server: journaled from the server's stream, and the rows are the server's prompt and
completion ids; without the switch nothing is requested."""

import json

import pyarrow as pa
import pytest
from datasets import Dataset

from budgetgen.tokenization import tokenize_file
from support.workflow import Workflow, base_config, write_prompts


@pytest.mark.parametrize("api", [True, "sglang"])
def test_workflow_rows_are_the_servers_prompt_and_completion_ids(tmp_path, server, tiny_tokenizer, api):
    """vLLM's return_token_ids (prompt_token_ids on the first chunk, token_ids per chunk) and SGLang's
    return_input_ids/return_output_ids (one final sglext chunk): journaled, and every row is exactly
    prompt_token_ids + completion_token_ids."""
    srv = server("--length-dist", "lognormal", "--mean-tokens", "30", "--reasoning-share", "0.3",
                 "--token-ids-tokenizer", tiny_tokenizer)
    wf_dir = tmp_path / "work"
    write_prompts(wf_dir / "prompts" / "A.jsonl", 20, prefix="A", fmt="messages")
    config = base_config(srv.base_url, tiny_tokenizer, {"A": {"prompts": "prompts/A.jsonl"}},
                         token_budget=10**6, max_tokens=40)
    config["server"]["return_token_ids"] = api
    wf = Workflow(wf_dir, config)
    wf.run("--cores", "2", "all")
    raw = wf.records("A", "raw_responses.jsonl")
    assert len(raw) == 20 and all(r.get("completion_token_ids") and r.get("prompt_token_ids") for r in raw)
    assert any(r["finish_reason"] == "length" for r in raw)  # the cut-at-max_tokens path is exercised

    served = Dataset.from_file(str(wf.path("results", "A", "tokenized.arrow")))
    by_id = {r["id"]: r for r in raw}
    for rid, ids, mask in zip(served["id"], served["input_ids"], served["loss_mask"]):
        p, c = by_id[rid]["prompt_token_ids"], by_id[rid]["completion_token_ids"]
        assert ids == p + c and mask == [0] * len(p) + [1] * len(c)
    # the text path rebuilds the same rows from the same (canonical) responses
    rendered_path = tmp_path / "rendered.arrow"
    tokenize_file(wf.path("results", "A", "raw_responses.jsonl"), rendered_path, tiny_tokenizer, 1024,
                  use_server_token_ids=False, log=lambda m: None)
    rendered = Dataset.from_file(str(rendered_path))
    assert served["id"] == rendered["id"]
    assert served["input_ids"] == rendered["input_ids"] and served["loss_mask"] == rendered["loss_mask"]
    with pa.OSFile(str(wf.path("results", "A", "tokenized.arrow"))) as f:
        meta = json.loads(pa.ipc.open_stream(f).schema.metadata[b"budgetgen"])
    assert meta["use_server_token_ids"] is True and meta["server_id_rows"] == 20
    assert len(meta["config_sha256"]) == 64  # the workflow records its content config's hash


def test_without_the_switch_nothing_is_requested(tmp_path, server, tiny_tokenizer):
    srv = server("--mean-tokens", "10", "--token-ids-tokenizer", tiny_tokenizer)
    wf_dir = tmp_path / "work"
    write_prompts(wf_dir / "prompts" / "A.jsonl", 5, prefix="A")
    wf = Workflow(wf_dir, base_config(srv.base_url, tiny_tokenizer, {"A": {"prompts": "prompts/A.jsonl"}},
                                      token_budget=10**6))
    wf.run("--cores", "1", "all")
    raw = wf.records("A", "raw_responses.jsonl")
    assert len(raw) == 5 and not any("completion_token_ids" in r or "prompt_token_ids" in r for r in raw)
