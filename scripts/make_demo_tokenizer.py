"""Train the demo's tiny BPE tokenizer (with a chat template) on local text files.

    python scripts/make_demo_tokenizer.py OUT_DIR --corpus FILE [FILE ...]
                                          [--vocab-size N] [--template chatml|llama3|qwen3_strip] [--force]

Deterministic: the same files give the same tokenizer.json bytes. Skips the work if
OUT_DIR/tokenizer.json exists (unless --force).
"""

import argparse
import os
import shutil
import sys
import tempfile

from budgetgen.entry import run_main
from budgetgen.errors import UserError


def parse_args(argv):
    from budgetgen_testkit.tiny_tokenizer import TEMPLATES

    ap = argparse.ArgumentParser(
        description="Train a tiny byte-level BPE tokenizer with a chat template (offline, deterministic).")
    ap.add_argument("out_dir", metavar="OUT_DIR", help="folder to write (save_pretrained layout)")
    ap.add_argument("--corpus", nargs="+", required=True, metavar="FILE", help="text files to train on")
    ap.add_argument("--vocab-size", type=int, default=2048, help="BPE vocabulary size (default 2048)")
    ap.add_argument("--template", default="chatml", choices=sorted(TEMPLATES),
                    help="chat template (default chatml)")
    ap.add_argument("--force", action="store_true", help="rebuild even if OUT_DIR/tokenizer.json exists")
    return ap.parse_args(argv)


def read_corpus(paths):
    texts = []
    for path in paths:
        try:
            with open(path, encoding="utf-8", errors="replace") as f:
                texts.append(f.read())
        except FileNotFoundError:
            raise UserError(f"{path}: no such file (--corpus)") from None
        except OSError as exc:
            raise UserError(f"{path}: cannot read ({exc.strerror})") from None
    if not any(t.strip() for t in texts):
        raise UserError(f"--corpus {' '.join(paths)}: no text to train on")
    return texts


def main(argv=None):
    args = parse_args(argv)
    out_dir = args.out_dir
    if os.path.exists(os.path.join(out_dir, "tokenizer.json")) and not args.force:
        print(f"tokenizer exists: {out_dir} (use --force to rebuild)")
        return 0
    if args.vocab_size < 300:
        raise UserError(f"--vocab-size must be at least 300 (256 bytes + special tokens), "
                        f"got {args.vocab_size}")
    if os.path.exists(out_dir) and not os.path.isdir(out_dir):
        raise UserError(f"{out_dir}: exists and is not a folder")
    texts = read_corpus(args.corpus)
    from budgetgen_testkit.tiny_tokenizer import build_tokenizer

    parent = os.path.dirname(os.path.abspath(out_dir))
    os.makedirs(parent, exist_ok=True)
    staging = tempfile.mkdtemp(prefix="." + os.path.basename(os.path.abspath(out_dir)) + ".", dir=parent)
    try:
        tokenizer = build_tokenizer(staging, texts, vocab_size=args.vocab_size, template=args.template)
        os.makedirs(out_dir, exist_ok=True)
        # tokenizer.json last: its presence is what marks the folder complete.
        names = sorted(os.listdir(staging), key=lambda n: (n == "tokenizer.json", n))
        for name in names:
            os.replace(os.path.join(staging, name), os.path.join(out_dir, name))
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    print(f"tokenizer written: {out_dir} (vocab {len(tokenizer)}, template {args.template})")
    return 0


if __name__ == "__main__":
    run_main(main, sys.argv[1:])
