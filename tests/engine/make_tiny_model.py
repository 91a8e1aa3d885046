"""Build a tiny *scripted* Qwen3 model + ChatML tokenizer locally, for the real-engine test.

    python tests/engine/make_tiny_model.py OUT_DIR [--reasoning TEXT] [--content TEXT]

The model runs real `generate()` in `transformers serve`, but its weights are arranged so that the
answer is fixed: attention and MLP outputs are zeroed (the logits depend on the current token only)
and the embeddings encode a chain "\\n" -> <think> -> REASONING -> </think> -> "\\n\\n" -> CONTENT ->
<|im_end|>. The ChatML generation prompt ends in "\\n", so every request produces
"<think>REASONING</think>\\n\\nCONTENT<|im_end|>" whatever the prompt, greedy or sampled (the margin
is a logit of 10 vs 0). With enable_thinking=False the prompt ends in "\\n\\n" and only CONTENT follows.
Qwen3 (not Llama) because transformers serve parses <think> into reasoning_content for Qwen models.
"""

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))

from budgetgen_testkit.tiny_tokenizer import build_tokenizer  # noqa: E402

REASONING = "The answer is 42."
CONTENT = "Hello world!"


def build_model(tokenizer, hidden=128, heads=2, kv_heads=1, head_dim=64, seed=0):
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(seed)
    config = Qwen3Config(
        vocab_size=len(tokenizer), hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=2,
        num_attention_heads=heads, num_key_value_heads=kv_heads, head_dim=head_dim,
        max_position_embeddings=4096, tie_word_embeddings=False, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id, bos_token_id=None,
    )
    model = Qwen3ForCausalLM(config)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.do_sample = False
    return model


def script_model(model, tokenizer, reasoning, content):
    """Make `model` answer every ChatML prompt with the fixed chain; return the chain's token ids."""
    import torch

    def ids(text):
        return tokenizer.encode(text, add_special_tokens=False)

    chain = (ids("\n") + [tokenizer.convert_tokens_to_ids("<think>")] + ids(reasoning)
             + [tokenizer.convert_tokens_to_ids("</think>")] + ids("\n\n") + ids(content)
             + [tokenizer.eos_token_id])
    # Each token's embedding is a one-hot position in the chain, so a token may appear only once.
    if len(set(chain)) != len(chain):
        raise SystemExit("make_tiny_model: script tokens repeat; pick other words")
    if len(chain) - 1 > model.config.hidden_size:
        raise SystemExit("make_tiny_model: script longer than hidden_size")
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        emb, head = model.get_input_embeddings().weight, model.get_output_embeddings().weight
        head.zero_()
        for i, (cur, nxt) in enumerate(zip(chain, chain[1:])):
            emb[cur] = 0.0
            emb[cur, i] = 1.0
            head[nxt, i] = 10.0
    return chain


def build(out_dir, reasoning=REASONING, content=CONTENT, corpus=()):
    """Write tokenizer + scripted model to out_dir; return the tokenizer."""
    # "\n\n" must appear on its own so BPE learns it as one token (the chain needs it distinct from "\n").
    texts = [*corpus, f"Q: What is six times seven?\n\n{reasoning}\n\n{content}\n\nExplain binary search.\n"]
    tokenizer = build_tokenizer(out_dir, texts * 20, vocab_size=512, template="chatml")
    model = build_model(tokenizer)
    script_model(model, tokenizer, reasoning, content)
    model.save_pretrained(out_dir)
    return tokenizer


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out_dir")
    ap.add_argument("--reasoning", default=REASONING, help="fixed reasoning text (default %(default)r)")
    ap.add_argument("--content", default=CONTENT, help="fixed answer text (default %(default)r)")
    args = ap.parse_args(argv)
    build(args.out_dir, args.reasoning, args.content)


if __name__ == "__main__":
    main()
