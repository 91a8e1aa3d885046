#!/usr/bin/env python3
"""Generate responses for one dataset up to its token budget (rule `inference`).

Appends each response to the journal as it arrives; resumable at any point; writes --done
(atomically) only when the budget is met or the prompts are exhausted.
"""

import argparse
import json
import time

from budgetgen.errors import entry_point
from budgetgen.inference import Settings, run


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dataset", required=True)
    ap.add_argument("--prompts", required=True, help="prompts.jsonl")
    ap.add_argument("--journal", required=True, help="append-only journal (never a Snakemake output)")
    ap.add_argument("--errors", required=True, help="errors.jsonl for non-transient failures")
    ap.add_argument("--done", required=True, help="marker written atomically when met or exhausted")
    ap.add_argument("--budget", type=int, required=True, help="completion-token budget")
    ap.add_argument("--base-url", required=True, help="OpenAI-compatible base URL, e.g. http://127.0.0.1:8000/v1")
    ap.add_argument("--model", required=True)
    ap.add_argument("--api-key-env", default=None, help="name of the environment variable holding the API key")
    ap.add_argument("--max-tokens", type=int, default=1024)
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--temperature", type=float, default=None)
    ap.add_argument("--top-p", type=float, default=None)
    ap.add_argument("--seed", type=int, default=0, help="seed of the dispatch order")
    ap.add_argument("--extra-body", default="{}", help="JSON object merged into every request body")
    ap.add_argument("--request-timeout-s", type=float, default=600.0)
    ap.add_argument("--max-retries", type=int, default=8)
    ap.add_argument("--unreachable-deadline-s", type=float, default=600.0)
    ap.add_argument("--startup-wait-s", type=float, default=10.0)
    ap.add_argument("--progress-interval-s", type=float, default=10.0)
    ap.add_argument("--on-bad-line", choices=["error", "skip"], default="error")
    ap.add_argument("--return-token-ids", action="store_true",
                    help="ask the server for the generated token ids (vLLM) and journal them")
    return ap.parse_args(argv)


def log(msg):
    print(f"{time.strftime('%Y-%m-%d %H:%M:%S')} {msg}", flush=True)


def main(argv=None):
    a = parse_args(argv)
    settings = Settings(
        dataset=a.dataset, prompts=a.prompts, journal=a.journal, errors=a.errors, done=a.done,
        budget=a.budget, base_url=a.base_url, model=a.model, api_key_env=a.api_key_env,
        max_tokens=a.max_tokens, concurrency=a.concurrency, temperature=a.temperature, top_p=a.top_p,
        seed=a.seed, extra_body=json.loads(a.extra_body), request_timeout_s=a.request_timeout_s,
        max_retries=a.max_retries, unreachable_deadline_s=a.unreachable_deadline_s,
        startup_wait_s=a.startup_wait_s, progress_interval_s=a.progress_interval_s, on_bad_line=a.on_bad_line,
        return_token_ids=a.return_token_ids,
    )
    return run(settings, log=log)


def argv_from_snakemake(smk):
    """Rule `inference`: content settings from params, operational ones from the server config."""
    server, p = smk.config["server"], smk.params
    argv = ["--dataset", smk.wildcards.dataset, "--prompts", smk.input.prompts, "--journal", p.journal,
            "--errors", p.errors, "--done", smk.output.done, "--budget", p.budget,
            "--base-url", server["base_url"], "--model", p.model, "--max-tokens", p.max_tokens,
            "--concurrency", smk.resources.server_slots, "--seed", p.seed, "--extra-body", p.extra_body,
            "--on-bad-line", p.on_bad_line]
    for flag, value in (("--temperature", p.temperature), ("--top-p", p.top_p),
                        ("--api-key-env", server.get("api_key_env"))):
        if value is not None:
            argv += [flag, value]
    for key in ("request_timeout_s", "max_retries", "unreachable_deadline_s", "startup_wait_s",
                "progress_interval_s"):
        argv += ["--" + key.replace("_", "-"), server[key]]
    if server.get("return_token_ids"):
        argv.append("--return-token-ids")
    return argv


if __name__ == "__main__":
    entry_point(main, argv_from_snakemake, globals())
