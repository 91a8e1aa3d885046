"""Server token ids (tokenizer.use_server_token_ids) used verbatim for the generated turn by tokenize:
canonical, non-canonical, cut at max_tokens, out of the vocabulary, malformed. Journaled from the
server's stream in real workflow runs: tests/workflow/test_server_token_ids.py."""

import json

import pytest
from transformers import AutoTokenizer

from budgetgen.rows import SERVER_IDS_OUT_OF_VOCAB, encode_batch
from budgetgen.tokenization import TokenizeOptions, tokenize_file

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
        tokenize_file(src, tmp_path / "out.arrow", TokenizeOptions(tokenizer=tiny_tokenizer, max_length=1024),
                      log=lambda m: None)


def test_the_encoder_counts_server_prompts_the_template_renders_otherwise(tok):
    """summary.tsv's rerender_differs: of the rows made of the server's prompt ids, those whose prompt the
    chat template of tokenizer.path renders to other ids (what a trainer that re-renders would get wrong)."""
    from budgetgen.rows import RowEncoder

    ids, mask = encode_batch(tok, [record()], 4096)[0]
    start = mask.index(1)
    same = record(prompt_token_ids=ids[:start], completion_token_ids=ids[start:])
    other = record(id="b", prompt_token_ids=ids[:start] + [ids[0]], completion_token_ids=ids[start:])
    encoder = RowEncoder(tok, 4096)
    results, _ = encoder.encode([same, other, record(id="c")])  # c: text, rendered for its row, not compared
    assert all(not isinstance(r, str) for r in results)
    assert (encoder.rerender_checked, encoder.rerender_differs) == (2, 1)
