"""The test tokenizer folders (tests/support/tokenizer_folders.py) load offline with transformers'
AutoTokenizer and render/encode like the real targets they stand for: Kimi-K2 (slow, tiktoken, auto_map),
Gemma and Phi-3 (fast)."""

import os

os.environ["HF_HUB_OFFLINE"] = "1"  # nothing from the hub, ever

import filecmp

import pytest

from support.tokenizer_folders import (
    KIMI_DEFAULT_SYSTEM,
    build_gemma_like,
    build_kimi_like,
    build_phi3_like,
)

SYS = f"<|im_system|>system<|im_middle|>{KIMI_DEFAULT_SYSTEM}<|im_end|>"
U, A, M, E = "<|im_user|>user", "<|im_assistant|>assistant", "<|im_middle|>", "<|im_end|>"

CONV = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "What is 2+2? "},
    {"role": "assistant", "content": "4\n", "reasoning_content": "add them"},
    {"role": "user", "content": [{"type": "text", "text": "and 3+3?"}]},
]


def load(path, **kwargs):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(path), **kwargs)


@pytest.fixture(scope="module")
def kimi_dir(tmp_path_factory):
    return build_kimi_like(tmp_path_factory.mktemp("kimi") / "kimi_like")


@pytest.fixture(scope="module")
def kimi(kimi_dir):
    return load(kimi_dir, trust_remote_code=True)


@pytest.fixture(scope="module")
def gemma(tmp_path_factory):
    return load(build_gemma_like(tmp_path_factory.mktemp("gemma") / "gemma_like"))


@pytest.fixture(scope="module")
def phi3(tmp_path_factory):
    return load(build_phi3_like(tmp_path_factory.mktemp("phi3") / "phi3_like"))


def n_base(kimi_dir):
    return sum(1 for line in (kimi_dir / "tiktoken.model").read_text().splitlines() if line.strip())


# ------------------------------------------------------------------------------------------------ Kimi


def test_kimi_folder_is_laid_out_like_kimi_k2(kimi_dir):
    import json

    assert sorted(p.name for p in kimi_dir.iterdir()) == [
        "chat_template.jinja", "tiktoken.model", "tokenization_kimi_like.py", "tokenizer_config.json"]
    config = json.loads((kimi_dir / "tokenizer_config.json").read_text())
    assert config["auto_map"] == {"AutoTokenizer": ["tokenization_kimi_like.KimiLikeTokenizer", None]}
    assert config["eos_token"] == "[EOS]" and config["bos_token"] == "[BOS]"
    assert len(config["added_tokens_decoder"]) == 256
    assert 256 + 300 <= n_base(kimi_dir) <= 256 + 400  # all bytes + a few hundred merges


def test_kimi_loads_offline_as_slow_remote_code(kimi):
    from transformers import PreTrainedTokenizer

    assert os.environ["HF_HUB_OFFLINE"] == "1"
    assert isinstance(kimi, PreTrainedTokenizer) and not kimi.is_fast
    assert type(kimi).__name__ == "KimiLikeTokenizer"
    assert type(kimi).__module__.startswith("transformers_modules.")
    assert type(kimi).__module__.endswith(".tokenization_kimi_like")


def test_kimi_refuses_to_load_without_trust_remote_code(kimi_dir):
    with pytest.raises(ValueError, match="trust_remote_code"):
        load(kimi_dir, trust_remote_code=False)


def test_kimi_special_ids(kimi, kimi_dir):
    base = n_base(kimi_dir)
    ids = {t: kimi.convert_tokens_to_ids(t) for t in [
        "[BOS]", "[EOS]", "<|im_end|>", "<|im_user|>", "<|im_assistant|>", "<|im_system|>", "<|im_middle|>",
        "<think>", "</think>", "[UNK]", "[PAD]"]}
    assert ids == {"[BOS]": base, "[EOS]": base + 1, "<|im_end|>": base + 2, "<|im_user|>": base + 3,
                   "<|im_assistant|>": base + 4, "<|im_system|>": base + 10, "<|im_middle|>": base + 17,
                   "<think>": base + 22, "</think>": base + 23, "[UNK]": base + 254, "[PAD]": base + 255}
    assert len(kimi) == base + 256
    assert kimi.eos_token == "[EOS]" and kimi.eos_token_id == base + 1  # not the turn end <|im_end|>
    assert kimi.bos_token_id == base and kimi.pad_token_id == base + 255
    assert kimi.convert_ids_to_tokens(base + 5) == f"<|reserved_token_{base + 5}|>"
    special = set(kimi.all_special_ids)
    assert {base, base + 1, base + 2, base + 3, base + 4, base + 10, base + 17} <= special
    assert base + 22 not in special and base + 23 not in special  # as in Kimi's config: added, not "special"


def test_kimi_encodes_special_tokens_in_text(kimi):
    think, end_think = kimi.convert_tokens_to_ids(["<think>", "</think>"])
    ids = kimi("<think>x</think>", add_special_tokens=False)["input_ids"]
    assert ids[0] == think and ids[-1] == end_think
    assert kimi.convert_ids_to_tokens(ids) == ["<think>", "x", "</think>"]
    assert kimi("hi", add_special_tokens=True)["input_ids"] == kimi("hi", add_special_tokens=False)["input_ids"]
    text = "Hello <|im_end|> world\n\n  二分查找 Über 123456!"
    slow = kimi(text, add_special_tokens=False)["input_ids"]
    assert kimi.encode(text) == slow  # bare encode(): straight to tiktoken, as Kimi's does
    assert kimi.convert_tokens_to_ids("<|im_end|>") in slow
    assert kimi.decode(slow) == text
    assert kimi.decode(slow, skip_special_tokens=False) == text
    batch = kimi(["a b", text], add_special_tokens=False)["input_ids"]
    assert batch[1] == slow


def test_kimi_template_renders_k2_turns(kimi):
    gen = kimi.apply_chat_template(CONV, tokenize=False, add_generation_prompt=True)
    assert gen == (
        f"<|im_system|>system{M}Be brief.{E}"
        f"{U}{M}What is 2+2? {E}"
        f"{A}{M}<think></think>4\n{E}"  # history: reasoning dropped
        f"{U}{M}and 3+3?{E}"
        f"{A}{M}"
    )
    # no system turn: Kimi's default one is rendered
    single = [{"role": "user", "content": "hi"}]
    assert kimi.apply_chat_template(single, tokenize=False, add_generation_prompt=True) == f"{SYS}{U}{M}hi{E}{A}{M}"


def test_kimi_template_drops_reasoning_of_the_last_answer_too(kimi):
    """K2's template: every assistant turn up to the last one without tool calls is history, the
    conversation's final answer included, so the full render is not prompt + generated text."""
    conv = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello", "reasoning_content": "greet"}]
    prompt = kimi.apply_chat_template(conv[:1], tokenize=False, add_generation_prompt=True)
    full = kimi.apply_chat_template(conv, tokenize=False)
    assert full == prompt + f"<think></think>hello{E}"
    assert full != prompt + f"<think>greet</think>hello{E}"


def test_kimi_template_keeps_reasoning_of_tool_call_continuations(kimi):
    conv = [
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": "", "reasoning_content": "call it",
         "tool_calls": [{"id": "functions.get:0", "type": "function",
                         "function": {"name": "get", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "functions.get:0", "name": "get", "content": "sunny"},
    ]
    text = kimi.apply_chat_template(conv, tokenize=False, add_generation_prompt=True)
    assert text == (
        f"{SYS}{U}{M}weather?{E}"
        f"{A}{M}<think>call it</think><|tool_calls_section_begin|><|tool_call_begin|>functions.get:0"
        '<|tool_call_argument_begin|>{"city": "Paris"}<|tool_call_end|><|tool_calls_section_end|>'
        f"{E}<|im_system|>get{M}## Return of functions.get:0\nsunny{E}{A}{M}"
    )


def test_kimi_chat_template_tokenizes_like_its_text(kimi):
    text = kimi.apply_chat_template(CONV, tokenize=False, add_generation_prompt=True)
    ids = kimi.apply_chat_template(CONV, tokenize=True, add_generation_prompt=True)
    ids = ids["input_ids"] if not isinstance(ids, list) else ids  # transformers 5: a BatchEncoding
    assert ids == kimi(text, add_special_tokens=False)["input_ids"]
    tail = [kimi.convert_tokens_to_ids("<|im_assistant|>"), *kimi.encode("assistant"),
            kimi.convert_tokens_to_ids("<|im_middle|>")]
    assert ids[-len(tail):] == tail


def test_kimi_think_prefill_variant(tmp_path):
    tok = load(build_kimi_like(tmp_path / "k25", think_prefill=True), trust_remote_code=True)
    single = [{"role": "user", "content": "hi"}]
    assert tok.apply_chat_template(single, tokenize=False, add_generation_prompt=True).endswith(f"{A}{M}<think>")
    off = tok.apply_chat_template(single, tokenize=False, add_generation_prompt=True, thinking=False)
    assert off.endswith(f"{A}{M}<think></think>")


def test_kimi_save_pretrained_round_trip(kimi, tmp_path):
    kimi.save_pretrained(tmp_path / "saved")
    again = load(tmp_path / "saved", trust_remote_code=True)
    text = "<think>x</think> Hello"
    assert again(text)["input_ids"] == kimi(text)["input_ids"]
    assert len(again) == len(kimi) and again.eos_token_id == kimi.eos_token_id
    assert again.apply_chat_template(CONV, tokenize=False) == kimi.apply_chat_template(CONV, tokenize=False)


# ----------------------------------------------------------------------------------------------- Gemma


def test_gemma_loads_fast_with_its_special_tokens(gemma):
    assert gemma.is_fast
    assert gemma.convert_tokens_to_ids(["<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>"]) \
        == [0, 1, 2, 3, 4, 5]
    assert gemma.eos_token == "<eos>" and gemma.eos_token_id == 1 and gemma.bos_token_id == 2
    assert {0, 1, 2, 3, 4, 5} <= set(gemma.all_special_ids)
    assert gemma("hi there")["input_ids"][0] == 2  # add_special_tokens=True prepends <bos>
    assert gemma("hi there", add_special_tokens=False)["input_ids"][0] != 2
    ids = gemma("<start_of_turn>x<end_of_turn>", add_special_tokens=False)["input_ids"]
    assert ids[0] == 4 and ids[-1] == 5


def test_gemma_template(gemma):
    gen = gemma.apply_chat_template(CONV, tokenize=False, add_generation_prompt=True)
    assert gen == (
        "<bos><start_of_turn>user\nBe brief.\n\nWhat is 2+2?<end_of_turn>\n"  # system folded in, trimmed
        "<start_of_turn>model\n4<end_of_turn>\n"  # no reasoning, trimmed
        "<start_of_turn>user\nand 3+3?<end_of_turn>\n"
        "<start_of_turn>model\n"
    )
    full = gemma.apply_chat_template(CONV[:3], tokenize=False)
    assert full.endswith("<start_of_turn>model\n4<end_of_turn>\n")
    ids = gemma.apply_chat_template(CONV, tokenize=True, add_generation_prompt=True)
    ids = ids["input_ids"] if not isinstance(ids, list) else ids
    assert ids == gemma(gen, add_special_tokens=False)["input_ids"]
    assert ids.count(gemma.bos_token_id) == 1
    with pytest.raises(Exception, match="alternate"):
        gemma.apply_chat_template([{"role": "user", "content": "a"}, {"role": "user", "content": "b"}], tokenize=False)


# ----------------------------------------------------------------------------------------------- Phi-3


def test_phi3_loads_fast_with_its_special_tokens(phi3):
    assert phi3.is_fast
    assert phi3.convert_tokens_to_ids(["<unk>", "<s>", "</s>"]) == [0, 1, 2]
    base = phi3.convert_tokens_to_ids("<|endoftext|>")
    assert base > 256 and len(phi3) == base + 11
    assert phi3.convert_tokens_to_ids(["<|assistant|>", "<|system|>", "<|end|>", "<|user|>"]) \
        == [base + 1, base + 6, base + 7, base + 10]
    assert phi3.eos_token == "<|endoftext|>" and phi3.eos_token_id == base
    assert {base, base + 1, base + 6, base + 7, base + 10} <= set(phi3.all_special_ids)
    assert phi3("hi")["input_ids"] == phi3("hi", add_special_tokens=False)["input_ids"]  # no BOS added


def test_phi3_template(phi3):
    gen = phi3.apply_chat_template(CONV, tokenize=False, add_generation_prompt=True)
    assert gen == (
        "<|system|>\nBe brief.<|end|>\n<|user|>\nWhat is 2+2? <|end|>\n<|assistant|>\n4\n<|end|>\n"
        "<|user|>\nand 3+3?<|end|>\n<|assistant|>\n"
    )
    full = phi3.apply_chat_template(CONV[:3], tokenize=False)
    assert full.endswith("<|assistant|>\n4\n<|end|>\n<|endoftext|>")  # eos after the last turn, as Phi-3's
    ids = phi3.apply_chat_template(CONV, tokenize=True, add_generation_prompt=True)
    ids = ids["input_ids"] if not isinstance(ids, list) else ids
    assert ids == phi3(gen, add_special_tokens=False)["input_ids"]
    assert phi3.decode(ids) == gen


# -------------------------------------------------------------------------------------------- all three


@pytest.mark.parametrize("build", [build_kimi_like, build_gemma_like, build_phi3_like])
def test_builds_are_deterministic(build, tmp_path):
    a, b = build(tmp_path / "a"), build(tmp_path / "b")
    names = sorted(p.name for p in a.iterdir())
    assert names == sorted(p.name for p in b.iterdir())
    match, mismatch, errors = filecmp.cmpfiles(a, b, names, shallow=False)
    assert not mismatch and not errors
