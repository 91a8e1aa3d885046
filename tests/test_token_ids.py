"""Server token ids (server.return_token_ids / tokenizer.use_server_token_ids): journaled from the
server's stream, and used verbatim for the generated turn by tokenize."""

import json

import pyarrow as pa
import pytest
from datasets import Dataset
from transformers import AutoTokenizer

from budgetgen.tokenization import SERVER_IDS_OUT_OF_VOCAB, encode_batch, tokenize_file
from conftest import Workflow, base_config, write_prompts

PROMPT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Explain binary search."}]
ANSWER = {"role": "assistant", "content": "Compare two approaches.", "reasoning_content": "Explain it."}


@pytest.fixture(scope="module")
def tok(tiny_tokenizer):
    return AutoTokenizer.from_pretrained(tiny_tokenizer)


def record(**extra):
    return {"id": "a", "messages": PROMPT + [ANSWER], "finish_reason": "stop", "params": {"model": "m"}, **extra}


def generated_ids(tok, rec):
    ids, mask = encode_batch(tok, [rec], 4096)[0]
    return [t for t, m in zip(ids, mask) if m]


def test_canonical_server_ids_give_the_text_path_exactly(tok):
    server = generated_ids(tok, record())
    assert encode_batch(tok, [record(completion_token_ids=server)], 4096) == encode_batch(tok, [record()], 4096)


def test_non_canonical_server_ids_are_used_verbatim(tok):
    text_ids, text_mask = encode_batch(tok, [record()], 4096)[0]
    canonical = generated_ids(tok, record())
    # What a model may emit: the same text spelled with other (shorter) tokens. Re-tokenizing the text
    # would silently train on ids the model never produced.
    eot = canonical[-1]
    spelled = [t for piece in tok.convert_ids_to_tokens(canonical[:-1])
               for t in tok.convert_tokens_to_ids(list(piece))] + [eot]
    assert tok.decode(spelled) == tok.decode(canonical) and spelled != canonical
    ids, mask = encode_batch(tok, [record(completion_token_ids=spelled)], 4096)[0]
    start = text_mask.index(1)
    assert ids[:start] == text_ids[:start]  # the prompt as rendered
    assert ids[start:] == spelled and set(mask[start:]) == {1}


def test_server_ids_cut_at_max_tokens_are_kept_as_generated(tok):
    """Item 5: no end-of-turn token the model never produced is appended."""
    cut = generated_ids(tok, record())[:3]  # finish_reason "length": no end-of-turn token generated
    ids, mask = encode_batch(tok, [record(completion_token_ids=cut, finish_reason="length")], 4096)[0]
    assert [t for t, m in zip(ids, mask) if m] == cut and ids[-3:] == cut


def test_server_ids_out_of_vocab_are_skipped_and_counted(tok):
    assert encode_batch(tok, [record(completion_token_ids=[len(tok) + 5])], 4096) == [SERVER_IDS_OUT_OF_VOCAB]


def test_bad_completion_token_ids_is_a_one_line_error(tmp_path, tiny_tokenizer):
    from budgetgen.errors import UserError

    src = tmp_path / "raw.jsonl"
    rec = {"id": "a", "messages": PROMPT + [ANSWER], "completion_token_ids": ["x"], "usage": {}}
    src.write_text(json.dumps(rec) + "\n")
    with pytest.raises(UserError, match=r"raw.jsonl:1: \"completion_token_ids\" must be a list of integers"):
        tokenize_file(src, tmp_path / "out.arrow", tiny_tokenizer, 1024, log=lambda m: None)


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
