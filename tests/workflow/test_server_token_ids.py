"""Server token ids (server.return_token_ids / tokenizer.use_server_token_ids) in real workflow runs
against the mock server in each engine's released wire format (--engine vllm: vLLM 0.33.0, --engine
sglang: SGLang 0.5.23): journaled from the server's stream, and the rows are the server's prompt and
completion ids; ids asked for and not sent fail the job in one line (never a silent text fallback);
without the switch nothing is requested."""

import json
import subprocess

import httpx
import pyarrow as pa
import pytest
from datasets import Dataset

from budgetgen.tokenization import TokenizeOptions, tokenize_file
from support.jobs import JobFiles, job_cmd
from support.workflow import Workflow, base_config, write_prompts


@pytest.mark.parametrize("api", [True, "sglang"])
def sglext_ids(base_url, messages, max_tokens):
    """The ids SGLang's wire sends for `messages` (the mock is deterministic), asked for by hand with the
    released field names: (input_ids, output_ids[0]) from the `sglext` chunk, which comes before usage."""
    body = {"model": "mock-model", "messages": messages, "stream": True, "max_tokens": max_tokens,
            "stream_options": {"include_usage": True},
            "return_input_ids_in_sglext": True, "return_output_ids_in_sglext": True}
    chunks = [json.loads(line[5:]) for line in httpx.post(f"{base_url}/chat/completions", json=body).text.splitlines()
              if line.startswith("data: {")]
    kinds = ["sglext" if "sglext" in c else "usage" if c.get("usage") else "choice" for c in chunks]
    assert kinds[-2:] == ["sglext", "usage"], kinds  # SGLang 0.5.23: the ids chunk, then the usage chunk
    ext = chunks[-2]["sglext"]
    return ext["input_ids"], ext["output_ids"][0]


@pytest.mark.parametrize("engine, api", [("vllm", True), ("vllm", "vllm"), ("sglang", "sglang")])
def test_workflow_rows_are_the_servers_prompt_and_completion_ids(tmp_path, server, tiny_tokenizer, engine, api):
    """vLLM's return_token_ids (prompt_token_ids on the first chunk, token_ids per chunk) and SGLang's
    return_input_ids_in_sglext/return_output_ids_in_sglext (one sglext chunk before the usage chunk):
    journaled, and every row is exactly prompt_token_ids + completion_token_ids; with SGLang, exactly the
    ids of the sglext chunk."""
    srv = server("--engine", engine, "--length-dist", "lognormal", "--mean-tokens", "30", "--reasoning-share", "0.3",
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
        assert len(c) == by_id[rid]["usage"]["completion_tokens"]
        if engine == "sglang":  # the row is what SGLang's own wire sends for this request
            assert (p, c) == sglext_ids(srv.base_url, by_id[rid]["messages"][:-1], 40)
    # the text path rebuilds the same rows from the same (canonical) responses
    rendered_path = tmp_path / "rendered.arrow"
    tokenize_file(wf.path("results", "A", "raw_responses.jsonl"), rendered_path,
                  TokenizeOptions(tokenizer=tiny_tokenizer, max_length=1024, use_server_token_ids=False),
                  log=lambda m: None)
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


@pytest.mark.parametrize("engine, api, extra_body, expected", [
    ("sglang", "vllm", {}, "refused return_token_ids (server.return_token_ids: vllm) with HTTP 400: return_token_ids "
                           "is not supported with streaming"),
    ("vllm", "sglang", {}, "sent no prompt and generated token ids for a response of"),
    ("vllm", "vllm", {"include_reasoning": False}, "sent no prompt and generated token ids for a response of"),
], ids=["sglang-given-vllm-field", "vllm-given-sglext-fields", "vllm-include-reasoning-false"])
def test_ids_asked_for_and_not_sent_fail_the_job_in_one_line(tmp_path, server, tiny_tokenizer, engine, api,
                                                              extra_body, expected):
    """Ids asked for and withheld (a 400 for the other engine's field, fields the engine drops, vLLM's
    include_reasoning: false): the job fails at the first response in one line naming the server and the
    setting, records nothing, and never falls back to text."""
    srv = server("--engine", engine, "--mean-tokens", "10", "--reasoning-share", "0.3",
                 "--token-ids-tokenizer", tiny_tokenizer)
    write_prompts(tmp_path / "prompts.jsonl", 6)
    p = subprocess.run(job_cmd(tmp_path, srv.base_url, return_token_ids=api, extra_body=extra_body, concurrency=2),
                       capture_output=True, text=True, timeout=120)
    errors = [line for line in (p.stdout + p.stderr).splitlines() if line.startswith("error: ")]
    assert p.returncode == 2 and len(errors) == 1, p.stdout + p.stderr
    assert expected in errors[0] and srv.base_url in errors[0] and "server.return_token_ids" in errors[0], errors
    assert "Traceback" not in p.stdout + p.stderr
    files = JobFiles(tmp_path)
    assert files.records("journal") == [] and files.records("errors") == []
