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
    ap.add_argument("--stale-output", action="append", default=[], metavar="PATH",
                    help="a file made from the journal (e.g. raw_responses.jsonl); removed when the job starts, "
                         "like --done, so an interrupted run leaves nothing that looks finished; repeatable")
    ap.add_argument("--budget", type=int, required=True, help="completion-token budget")
    ap.add_argument("--base-url", action="append", default=[],
                    help="OpenAI-compatible base URL, e.g. http://127.0.0.1:8000/v1; repeat for several servers "
                         "(requests go to the least-loaded healthy one)")
    ap.add_argument("--model", required=True)
    ap.add_argument("--api-key-env", default=None, help="name of the environment variable holding the API key")
    ap.add_argument("--max-tokens", type=int, default=1024)
    ap.add_argument("--concurrency", type=int, default=64, help="requests in flight (generation.concurrency)")
    ap.add_argument("--server-slots", type=int, default=None,
                    help="the server_slots Snakemake granted this job (--resources server_slots=N caps it); "
                         "in flight = the lower of the two, said at start")
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
    ap.add_argument("--return-token-ids", nargs="?", const="vllm", default=False, choices=["vllm", "sglang"],
                    help="ask the server for the prompt's and the generated token ids and journal them: vllm "
                         "(return_token_ids, the default) or sglang (return_input_ids/return_output_ids)")
    ap.add_argument("--no-continuous-usage-stats", dest="continuous_usage_stats", action="store_false",
                    help="do not ask for usage on every chunk; estimate the tokens in flight from the text")
    ap.add_argument("--endpoint-concurrency", type=int, default=0,
                    help="requests in flight per endpoint (0: no cap but --concurrency)")
    ap.add_argument("--endpoint-recheck-s", type=float, default=10.0,
                    help="seconds between probes of an endpoint taken out after a connection failure")
    g = ap.add_argument_group("a server started by this job (instead of --base-url)")
    g.add_argument("--launch", help="command template, e.g. 'python -m sglang.launch_server --model-path "
                                    "{model_path} --port {port}'; placeholders {port} {host} {model} {model_path} "
                                    "{dataset}; run without a shell, stopped on every exit")
    g.add_argument("--launch-log", help="the launched server's output (default: JOURNAL.server.log)")
    g.add_argument("--model-path", help="{model_path} of --launch (default: --model)")
    g.add_argument("--launch-port", type=int, default=0, help="{port} of --launch (0: a free port)")
    g.add_argument("--launch-ready-timeout-s", type=float, default=1800.0,
                   help="how long the launched server may take to serve the model")
    a = ap.parse_args(argv)
    if not a.base_url and not a.launch:
        ap.error("one of --base-url or --launch is required")
    return a


def log(msg):
    print(f"{time.strftime('%Y-%m-%d %H:%M:%S')} {msg}", flush=True)


def main(argv=None):
    a = parse_args(argv)
    concurrency = a.concurrency
    if a.server_slots is not None and a.server_slots < a.concurrency:
        log(f"concurrency {a.concurrency} (generation.concurrency) capped to {a.server_slots} by Snakemake's "
            f"server_slots resource (--resources server_slots=N, e.g. from a profile): raise or drop it to "
            f"honour the configured concurrency")
        concurrency = a.server_slots
    settings = Settings(
        dataset=a.dataset, prompts=a.prompts, journal=a.journal, errors=a.errors, done=a.done, stale_outputs=tuple(a.stale_output),
        budget=a.budget, base_url=a.base_url, model=a.model, api_key_env=a.api_key_env,
        max_tokens=a.max_tokens, concurrency=concurrency, temperature=a.temperature, top_p=a.top_p,
        seed=a.seed, extra_body=json.loads(a.extra_body), request_timeout_s=a.request_timeout_s,
        max_retries=a.max_retries, unreachable_deadline_s=a.unreachable_deadline_s,
        startup_wait_s=a.startup_wait_s, progress_interval_s=a.progress_interval_s, on_bad_line=a.on_bad_line,
        return_token_ids=a.return_token_ids, continuous_usage_stats=a.continuous_usage_stats,
        endpoint_concurrency=a.endpoint_concurrency,
        endpoint_recheck_s=a.endpoint_recheck_s, launch=a.launch, launch_log=a.launch_log, model_path=a.model_path,
        launch_port=a.launch_port, launch_ready_timeout_s=a.launch_ready_timeout_s,
    )
    return run(settings, log=log)


def argv_from_snakemake(smk):
    """Rule `inference`: content settings from params, operational ones from the server config."""
    server, p = smk.config["server"], smk.params
    own = smk.config["datasets"][smk.wildcards.dataset]  # the configured concurrency (operational, not a param)
    argv = ["--dataset", smk.wildcards.dataset, "--prompts", smk.input.prompts, "--journal", p.journal,
            "--errors", p.errors, "--done", smk.output.done, "--stale-output", p.raw_responses, "--budget", p.budget, "--model", p.model, "--max-tokens", p.max_tokens,
            "--concurrency", own.get("concurrency", smk.config["generation"]["concurrency"]),
            "--server-slots", smk.resources.server_slots, "--seed", p.seed, "--extra-body", p.extra_body,
            "--on-bad-line", p.on_bad_line]
    for flag, value in (("--temperature", p.temperature), ("--top-p", p.top_p),
                        ("--api-key-env", server.get("api_key_env"))):
        if value is not None:
            argv += [flag, value]
    for key in ("request_timeout_s", "max_retries", "unreachable_deadline_s", "startup_wait_s",
                "progress_interval_s"):
        argv += ["--" + key.replace("_", "-"), server[key]]
    if server.get("return_token_ids"):
        api = server["return_token_ids"]
        argv += ["--return-token-ids", api if isinstance(api, str) else "vllm"]
    if not server["continuous_usage_stats"]:
        argv.append("--no-continuous-usage-stats")
    if server.get("launch"):
        argv += ["--launch", server["launch"], "--launch-log", p.server_log, "--launch-port", server["launch_port"],
                 "--launch-ready-timeout-s", server["launch_ready_timeout_s"]]
        if server.get("model_path"):
            argv += ["--model-path", server["model_path"]]
    else:
        urls = server["base_url"]
        for url in [urls] if isinstance(urls, str) else urls:
            argv += ["--base-url", url]
    for key in ("endpoint_concurrency", "endpoint_recheck_s"):
        argv += ["--" + key.replace("_", "-"), server[key]]
    return argv


if __name__ == "__main__":
    entry_point(main, argv_from_snakemake, globals())
