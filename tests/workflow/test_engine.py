"""End to end against a real inference engine: `transformers serve` running a tiny scripted Qwen3
built locally (tests/engine/make_tiny_model.py), through real snakemake.

The scripted model answers every prompt with reasoning "The answer is 42." and content "Hello world!"
(14 completion tokens with thinking, 4 without), so the test can assert exact journal contents,
usage and budgets while every token still comes out of real `generate()` behind the engine's own
OpenAI layer (no [DONE] sentinel, usage on the finish chunk, strict 422 on unknown fields).
"""

import sys
from pathlib import Path

import pytest
from datasets import Dataset
from transformers import AutoTokenizer

from support.engine_server import free_port, scripted_model, serving
from support.workflow import Workflow, base_config, write_prompts

pytestmark = pytest.mark.slow

REASONING, CONTENT = "The answer is 42.", "Hello world!"
THINKING_TOKENS, PLAIN_TOKENS = 14, 4  # the scripted chains, EOS included (engine's usage count)


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    """(base_url, model_dir): transformers serve on 127.0.0.1 with the scripted model."""
    root = tmp_path_factory.mktemp("engine")
    model_dir, env = scripted_model(root)
    port = free_port()
    cli = Path(sys.executable).parent / "transformers"
    with serving([cli, "serve", model_dir, "--host", "127.0.0.1", "--port", port, "--device", "cpu"], port,
                 root / "serve.log", env, "transformers serve"):
        yield f"http://127.0.0.1:{port}/v1", model_dir


def test_workflow_against_transformers_serve(tmp_path, engine):
    base_url, model_dir = engine
    wf_dir = tmp_path / "work"
    write_prompts(wf_dir / "prompts" / "think.jsonl", 12, prefix="think")
    write_prompts(wf_dir / "prompts" / "plain.jsonl", 3, prefix="plain", fmt="messages")
    # think: budget 50 at 14 tokens a response -> met after 4 (the dispatch rule must not send all 12);
    # plain: enable_thinking off through extra_body (the engine rejects unknown fields, so this also
    # proves pass-through reaches the chat template), budget out of reach -> exhausted.
    datasets = {
        "think": {"prompts": "prompts/think.jsonl", "token_budget": 50},
        "plain": {"prompts": "prompts/plain.jsonl", "token_budget": 10**6,
                  "extra_body": {"chat_template_kwargs": {"enable_thinking": False}}},
    }
    config = base_config(base_url, model_dir, datasets, max_tokens=64, concurrency=2, temperature=0.7)
    config["server"]["model"] = str(model_dir)  # transformers serve pins the model id to the path
    wf = Workflow(wf_dir, config)
    wf.run("--cores", "2", "all", timeout=600)

    think = wf.records("think", "raw_responses.jsonl")
    plain = wf.records("plain", "raw_responses.jsonl")
    assert 4 <= len(think) < 12 and len(plain) == 3
    for rec in think:
        turn = rec["messages"][-1]
        assert turn["role"] == "assistant" and turn["reasoning_content"] == REASONING
        assert turn["content"].strip() == CONTENT  # streamed deltas keep the leading "\n\n"
        assert rec["usage"]["completion_tokens"] == THINKING_TOKENS and rec["finish_reason"] == "stop"
        assert rec["served_model"] == str(model_dir)
    kept = sum(r["usage"]["completion_tokens"] for r in think)
    assert 50 <= kept < 50 + 2 * THINKING_TOKENS  # met, with no more than the in-flight overshoot
    for rec in plain:
        turn = rec["messages"][-1]
        # thinking off: transformers serve streams the template's "\n\n" as reasoning; it is journaled as
        # streamed (whitespace only), and the rows below show tokenize adds no think block for it
        assert turn["content"].strip() == CONTENT and not turn.get("reasoning_content", "").strip()
        assert rec["usage"]["completion_tokens"] == PLAIN_TOKENS

    # Tokenized with the target model's own tokenizer: supervised tokens are the assistant turn.
    tok = AutoTokenizer.from_pretrained(model_dir)
    ds = Dataset.from_file(str(wf.path("results", "think", "tokenized.arrow")))
    assert sorted(ds["id"]) == sorted(r["id"] for r in think)
    for row in ds:
        supervised = [t for t, m in zip(row["input_ids"], row["loss_mask"]) if m]
        text = tok.decode(supervised)
        assert REASONING in text and CONTENT in text and text.endswith("<|im_end|>")
        assert "<|im_start|>user" not in text

    summary = wf.path("results", "summary.tsv").read_text()
    assert "think\t" in summary and "met" in summary and "exhausted" in summary
    assert "Nothing to be done" in wf.run("-n", "all").output
