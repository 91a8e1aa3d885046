"""Each engine's dialect against the mock server imitating its release (budgetgen.engines,
budgetgen_testkit.mock_server.RELEASED), in real workflow runs: llama.cpp's llama-server (no per-chunk
usage, reasoning in reasoning_content, a first delta with content null, no token ids in chat streams)
runs to its budget with every response's reasoning journaled; asking it for token ids is refused at
config time, before a request; an engine named against the ids setting of another is refused too."""

from support.workflow import Workflow, base_config, write_prompts


def make(tmp_path, srv, tokenizer, **server):
    write_prompts(tmp_path / "work" / "prompts" / "A.jsonl", 40, prefix="A", fmt="messages")
    config = base_config(srv.base_url, tokenizer, {"A": {"prompts": "prompts/A.jsonl"}}, token_budget=600,
                         max_tokens=60)
    config["server"].update(server)
    return Workflow(tmp_path / "work", config)


def test_llamacpp_runs_to_its_budget_with_reasoning_and_usage_from_the_last_chunk(tmp_path, server, tiny_tokenizer):
    srv = server("--engine", "llamacpp", "--mean-tokens", "20", "--reasoning-share", "0.4")
    wf = make(tmp_path, srv, tiny_tokenizer, engine="llamacpp")
    wf.run("--cores", "1", "all")
    raw = wf.records("A", "raw_responses.jsonl")
    assert raw and sum(r["usage"]["completion_tokens"] for r in raw) >= 600
    # asked with reasoning_format none: the raw text, reasoning in its tags, is the content (its parser
    # would drop the whitespace after </think>: rows a token short of what the model generated)
    assert all(r["params"] is not None and r["messages"][-1]["content"].startswith("<think> ") and
               " </think> " in r["messages"][-1]["content"] and "reasoning_content" not in r["messages"][-1]
               for r in raw)
    assert all(not r["flags"] for r in raw)  # a closed reasoning in the answer: nothing unclosed
    assert all("completion_token_ids" not in r for r in raw)
    summary = wf.path("results", "summary.tsv").read_text().splitlines()
    assert summary[1].split("\t")[0] == "A" and "\tmet\t" in summary[1]


def test_token_ids_from_an_engine_that_sends_none_are_refused_at_config_time(tmp_path, server, tiny_tokenizer):
    srv = server("--engine", "llamacpp")
    wf = make(tmp_path, srv, tiny_tokenizer, engine="llamacpp", return_token_ids=True)
    p = wf.run("-n", "all", check=False)
    assert p.returncode != 0
    assert ("config key server.return_token_ids: True asks llama.cpp llama-server 0c1e570 (llama-cpp-python "
            "0.3.36) (server.engine: llamacpp) for token ids, which it does not send in chat streams") in p.output
    wf.config["server"].update(engine="vllm", return_token_ids="sglang")
    wf.write_config()
    p = wf.run("-n", "all", check=False)
    assert p.returncode != 0 and "names another engine than server.engine: vllm" in p.output
    assert not wf.path("results").exists()
