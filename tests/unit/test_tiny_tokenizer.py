"""The tiny local tokenizer: templates render as specified, training is deterministic, CLI works."""

import os

os.environ["HF_HUB_OFFLINE"] = "1"  # nothing from the hub, ever

import subprocess
import sys

import pytest

from budgetgen_testkit.tiny_tokenizer import END_OF_TURN, TEMPLATES, build_tokenizer
from support import REPO

SCRIPT = str(REPO / "scripts" / "make_demo_tokenizer.py")

CORPUS = """\
A draft model proposes tokens; the target model verifies them. Training data comes from the target.
def add(a, b):
    return a + b

The quick brown fox jumps over the lazy dog. Hello world! How are you today?
Think about it step by step, then answer: the answer is 42.
"""

CONV = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "def add(a, b): return a + b"},
    {"role": "assistant", "content": "ok", "reasoning_content": "think about it"},
    {"role": "user", "content": "again"},
]


@pytest.fixture(scope="module")
def toks(tmp_path_factory):
    out = {}
    for name in TEMPLATES:
        path = tmp_path_factory.mktemp(name)
        build_tokenizer(str(path), [CORPUS], vocab_size=512, template=name)
        from transformers import AutoTokenizer

        out[name] = AutoTokenizer.from_pretrained(str(path))
    return out


def test_chatml_renders_like_the_notes(toks):
    text = toks["chatml"].apply_chat_template(CONV, tokenize=False, add_generation_prompt=True)
    assert text == (
        "<|im_start|>system\nYou are terse.<|im_end|>\n"
        "<|im_start|>user\ndef add(a, b): return a + b<|im_end|>\n"
        "<|im_start|>assistant\n<think>\nthink about it\n</think>\n\nok<|im_end|>\n"
        "<|im_start|>user\nagain<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    no_think = toks["chatml"].apply_chat_template(CONV, tokenize=False, add_generation_prompt=True,
                                                  enable_thinking=False)
    assert no_think == text + "<think>\n\n</think>\n\n"


def test_llama3_renders_headers(toks):
    conv = CONV + [{"role": "assistant", "content": "fine", "reasoning_content": "r"}]
    text = toks["llama3"].apply_chat_template(conv, tokenize=False)
    assert text == (
        "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nYou are terse.<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\ndef add(a, b): return a + b<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n<think>\nthink about it\n</think>\n\nok<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nagain<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n<think>\nr\n</think>\n\nfine<|eot_id|>"
    )
    gen = toks["llama3"].apply_chat_template(CONV, tokenize=False, add_generation_prompt=True)
    assert gen.endswith("again<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n")
    assert gen.count("<|begin_of_text|>") == 1


def test_qwen3_strip_drops_reasoning_before_the_last_user_turn(toks):
    conv = CONV + [{"role": "assistant", "content": "fine", "reasoning_content": "latest"}]
    text = toks["qwen3_strip"].apply_chat_template(conv, tokenize=False)
    assert "think about it" not in text
    assert "<|im_start|>assistant\nok<|im_end|>\n" in text
    assert text.endswith("<|im_start|>assistant\n<think>\nlatest\n</think>\n\nfine<|im_end|>\n")


def test_special_tokens(toks):
    for name, tok in toks.items():
        assert tok.eos_token == END_OF_TURN[name]
        assert tok.pad_token == "<|endoftext|>"
        specials = ["<|im_start|>", "<|im_end|>", "<think>", "</think>"]
        if name == "llama3":
            specials += ["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]
        else:
            assert "<|eot_id|>" not in tok.get_vocab()
        for s in specials:
            ids = tok(s, add_special_tokens=False)["input_ids"]
            assert len(ids) == 1 and tok.convert_ids_to_tokens(ids[0]) == s, (name, s)
        # Byte-level: any text round-trips.
        text = "naïve café 東京 🙂\n\n  tabs\tand spaces"
        assert tok.decode(tok(text, add_special_tokens=False)["input_ids"]) == text
        # No special tokens are added by plain encoding.
        assert tok("hello")["input_ids"] == tok("hello", add_special_tokens=False)["input_ids"]


def test_apply_chat_template_tokenize_returns_batch_encoding(toks):
    tok = toks["chatml"]
    out = tok.apply_chat_template(CONV, add_generation_prompt=True)
    text = tok.apply_chat_template(CONV, tokenize=False, add_generation_prompt=True)
    assert out["input_ids"] == tok(text, add_special_tokens=False)["input_ids"]


def test_build_is_deterministic(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    build_tokenizer(str(a), [CORPUS], vocab_size=512)
    build_tokenizer(str(b), [CORPUS], vocab_size=512)
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        assert (a / name).read_bytes() == (b / name).read_bytes(), name


def test_unknown_template(tmp_path):
    with pytest.raises(ValueError, match="unknown template"):
        build_tokenizer(str(tmp_path / "x"), [CORPUS], template="nope")


def run_cli(*args):
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    return subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True, env=env,
                          timeout=120)


def test_make_demo_tokenizer_cli(tmp_path):
    assert "--corpus" in run_cli("--help").stdout
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(CORPUS * 3)
    extra = tmp_path / "more.txt"
    extra.write_text("More words for the corpus: speculative decoding, acceptance rate.\n")
    one, two = tmp_path / "one", tmp_path / "two"
    for out in (one, two):
        proc = run_cli(str(out), "--corpus", str(corpus), str(extra), "--vocab-size", "600",
                       "--template", "llama3")
        assert proc.returncode == 0, proc.stderr
        assert "tokenizer written" in proc.stdout
    assert (one / "tokenizer.json").read_bytes() == (two / "tokenizer.json").read_bytes()
    assert "<|eot_id|>" in (one / "chat_template.jinja").read_text()
    assert sorted(os.listdir(tmp_path)) == ["corpus.txt", "more.txt", "one", "two"]  # no staging left

    before = (one / "tokenizer.json").stat().st_mtime_ns
    proc = run_cli(str(one), "--corpus", str(corpus))
    assert proc.returncode == 0 and "tokenizer exists" in proc.stdout
    assert (one / "tokenizer.json").stat().st_mtime_ns == before

    proc = run_cli(str(one), "--corpus", str(corpus), "--force")
    assert proc.returncode == 0 and "tokenizer written" in proc.stdout
    assert "<|im_end|>" in (one / "chat_template.jinja").read_text()

    proc = run_cli(str(tmp_path / "three"), "--corpus", str(tmp_path / "missing.txt"))
    assert proc.returncode == 2
    assert proc.stderr.strip() == f"error: {tmp_path / 'missing.txt'}: no such file (--corpus)"
