"""Tokenize generated conversations into an Arrow file with loss masks (rule `tokenize`).

    python scripts/tokenize_responses.py --input results/D/raw_responses.jsonl
        --output results/D/tokenized.arrow --tokenizer PATH --max-length N
        [--processes K] [--chat-template-kwargs JSON] [--batch-size B]

The output is an Arrow IPC stream (datasets.Dataset.from_file reads it). Named so as not to shadow
the stdlib `tokenize` module.
"""

import argparse
import json

from budgetgen.errors import UserError, entry_point


def parse_args(argv):
    ap = argparse.ArgumentParser(
        description="Make training rows (prompt ids + completion ids, loss_mask 1 on the completion) from "
                    "generated responses and write them as an Arrow IPC stream; see budgetgen/tokenization.py.")
    ap.add_argument("--input", required=True, help="raw_responses.jsonl (last message = generated turn)")
    ap.add_argument("--output", required=True, help="Arrow IPC stream file to write (atomically)")
    ap.add_argument("--tokenizer", required=True, help="tokenizer folder (or hub name, if cached)")
    ap.add_argument("--max-length", type=int, required=True, help="truncate rows to this many tokens")
    ap.add_argument("--processes", type=int, default=1, help="worker processes (default 1)")
    ap.add_argument("--chat-template-kwargs", default=None, metavar="JSON",
                    help='template variables for records that carry no request params of their own (each '
                         'journal record is rendered with the chat_template_kwargs its request used), '
                         'e.g. \'{"enable_thinking": false}\'')
    ap.add_argument("--batch-size", type=int, default=512, help="conversations per batch (default 512)")
    ap.add_argument("--allow-mixed-settings", action="store_true",
                    help="tokenize responses generated with different content settings together")
    ap.add_argument("--config-sha256", default=None, help="hash of the content config, for provenance")
    ap.add_argument("--no-server-token-ids", action="store_true",
                    help="re-tokenize the generated text even where the server's token ids were journaled")
    ap.add_argument("--trust-remote-code", action="store_true",
                    help="load a tokenizer whose code is in its folder (auto_map), e.g. Kimi-K2's")
    ap.add_argument("--reasoning-tags", nargs=2, metavar=("OPEN", "CLOSE"), default=None,
                    help="the model's reasoning delimiters when neither its template nor its tokens name them "
                         "(e.g. MiniMax-M1: '<think>' '</think>'); derived by default")
    ap.add_argument("--max-skipped-pct", type=float, default=1.0,
                    help="fail when more than this percentage of records is skipped (default 1)")
    return ap.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    kwargs = None
    if args.chat_template_kwargs:
        try:
            kwargs = json.loads(args.chat_template_kwargs)
        except ValueError as exc:
            raise UserError(f"--chat-template-kwargs: not valid JSON ({exc})") from None
        if not isinstance(kwargs, dict):
            raise UserError("--chat-template-kwargs: must be a JSON object")
    if args.max_length < 1:
        raise UserError(f"--max-length must be at least 1, got {args.max_length}")
    if args.processes < 1:
        raise UserError(f"--processes must be at least 1, got {args.processes}")
    if args.batch_size < 1:
        raise UserError(f"--batch-size must be at least 1, got {args.batch_size}")
    from budgetgen.tokenization import tokenize_file

    tokenize_file(args.input, args.output, args.tokenizer, args.max_length, processes=args.processes,
                  chat_template_kwargs=kwargs, batch_size=args.batch_size,
                  allow_mixed_settings=args.allow_mixed_settings,
                  use_server_token_ids=not args.no_server_token_ids, config_sha256=args.config_sha256,
                  trust_remote_code=args.trust_remote_code, max_skipped_pct=args.max_skipped_pct,
                  reasoning_tags=args.reasoning_tags,
                  log=lambda msg: print(msg, flush=True))
    return 0


def argv_from_snakemake(smk):
    p = smk.params
    argv = ["--input", smk.input[0], "--output", smk.output[0], "--tokenizer", p.tokenizer,
            "--max-length", p.max_length, "--processes", smk.threads, "--chat-template-kwargs", p.chat_template_kwargs]
    argv += ["--config-sha256", p.config_sha256, "--max-skipped-pct", p.max_skipped_pct]
    argv += ["--trust-remote-code"] if p.trust_remote_code else []
    argv += ["--reasoning-tags", *p.reasoning_tags] if p.reasoning_tags else []
    argv += ["--allow-mixed-settings"] if p.allow_mixed_settings else []
    return argv + ([] if p.use_server_token_ids else ["--no-server-token-ids"])


if __name__ == "__main__":
    entry_point(main, argv_from_snakemake, globals())
