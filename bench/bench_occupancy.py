#!/usr/bin/env python3
"""Benchmark 2: server occupancy across datasets, as the workflow runs them.

Datasets with different length profiles (--datasets 3: production means 800 / 1500 / 3600 tokens;
--datasets 8, the default: eight profiles from 400 to 5000; lognormal, max_tokens 10240; each dataset's
mean reaches the one mock server through `generation.extra_body: {mock_mean_tokens: ...}`) and
different budgets share ONE mock server with a fixed number of --slots. Each setting is a real
`snakemake` run in a fresh working directory against a fresh server:

  default         the README's command, `snakemake --cores 8 all`: every dataset's concurrency = the
                  server's slots, no server_slots cap (inference jobs take no --cores: all run at once)
  cores 1         the same with `snakemake --cores 1 all`
  sequential      concurrency = slots and --resources server_slots=slots: one dataset at a time (what
                  --cores 1 did while an inference job took a core)
  exact           concurrencies sum to the server's slots, all datasets at once (server_slots=slots)
  oversub Xx      concurrencies sum to X times the slots (server_slots=that sum): the server queues

Measured from the server's /stats occupancy timeline: time-weighted busy slots / slots, from the first
request to the last response. Goal (issue 15): >= 98 % at a shape where the run is >= 50x the longest
response, with the README's command.

    .venv/bin/python bench/bench_occupancy.py [--quick] [--seeds N] [--datasets 8|3]
                                              [--settings default,cores1,sequential] [--oversub 2,3]
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import common
import yaml

MODEL = "mock-model"
GOAL = 98.0
# name: (production mean length, share of the total budget)
PROFILES = {
    3: {"short": (800, 0.2), "mid": (1500, 0.3), "long": (3600, 0.5)},
    8: {"chat": (400, 0.06), "qa": (800, 0.1), "summ": (1200, 0.1), "code": (1500, 0.14), "math": (2000, 0.14),
        "agent": (2500, 0.12), "reason": (3600, 0.18), "proof": (5000, 0.16)},
}
PROD_MAX_TOKENS = 10240
README_CORES = 8  # `snakemake --cores 8 all`, the README's command


def split(total, weights):
    """Integers >= 1 proportional to weights, summing to total."""
    raw = [total * w / sum(weights) for w in weights]
    out = [max(1, int(x)) for x in raw]
    for i in sorted(range(len(raw)), key=lambda i: raw[i] - int(raw[i]), reverse=True)[:total - sum(out)]:
        out[i] += 1
    return out


def settings(args):
    """[(label, {dataset: concurrency}, server_slots resource or None, --cores)] in run order."""
    names = list(args.profiles)
    every = {n: args.slots for n in names}
    out = []
    for name in args.settings:
        if name == "default":
            out.append((f"default (--cores {README_CORES})", every, None, README_CORES))
        elif name == "cores1":
            out.append(("--cores 1", every, None, 1))
        elif name == "sequential":
            out.append(("sequential", every, args.slots, args.cores))
        elif name == "exact":
            out.append(("exact", dict(zip(names, split(args.slots, [1] * len(names)))), args.slots, args.cores))
        elif name == "oversub":
            for factor in args.oversub:
                total = round(factor * args.slots)
                out.append((f"oversub {factor:g}x", dict(zip(names, split(total, [1] * len(names)))), total,
                            args.cores))
        else:
            raise SystemExit(f"unknown setting {name!r} (default, cores1, sequential, exact, oversub)")
    return out


def write_prompts(path, name, n):
    with open(path, "w") as f:
        for i in range(n):
            f.write(json.dumps({"id": f"{name}-{i}", "prompt": f"{name} prompt {i}: explain topic {i * 7919 % 1009}"})
                    + "\n")


def build_tokenizer(out):
    from budgetgen_testkit.tiny_tokenizer import build_tokenizer as build

    build(out, ["benchmark prompt explain topic short mid long " * 50], vocab_size=256)
    return out


def one_run(label, conc, resource, cores, seed, work, tok, args):
    d = work / f"{label.replace(' ', '_')}-{seed}"
    d.mkdir()
    server_args = ["--length-dist", "lognormal", "--mean-tokens", 100, "--sigma", args.sigma, "--seed", seed,
                   "--slots", args.slots, "--tokens-per-s", args.rate, "--chunk-interval-s", args.chunk_interval_s,
                   "--sample-interval", 0.05]
    proc, url = common.start_server(server_args, d / "server")
    datasets = {}
    for name, (mean, _) in args.profiles.items():
        prompts = d / f"{name}.jsonl"
        budget = args.budgets[name]
        write_prompts(prompts, name, 3 * budget // max(1, round(mean / args.scale)) + 100)
        datasets[name] = {"prompts": str(prompts), "token_budget": budget, "concurrency": conc[name],
                          "extra_body": {"mock_mean_tokens": mean / args.scale}}
    config = {
        "server": {"base_url": url, "model": MODEL, "request_timeout_s": 120, "startup_wait_s": 10,
                   "unreachable_deadline_s": 120, "progress_interval_s": 5},
        "generation": {"token_budget": 1000, "max_tokens": args.max_tokens, "concurrency": 1, "seed": seed},
        "tokenizer": {"path": str(tok), "max_length": 1024, "processes": 1},
        "datasets": datasets,
    }
    (d / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    targets = ([f"results/{n}/inference.done" for n in args.profiles] if args.target == "inference" else [args.target])
    cmd = [sys.executable, "-m", "snakemake", *targets, "-s", str(common.REPO / "Snakefile"), "-d", str(d),
           "--configfile", str(d / "config.yaml"), "--cores", str(cores)]
    if resource is not None:
        cmd += ["--resources", f"server_slots={resource}"]
    try:
        t0 = time.perf_counter()
        with open(d / "snakemake.log", "w") as log:
            rc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "HF_HUB_OFFLINE": "1"},
                                timeout=1800).returncode
        wall = time.perf_counter() - t0
        st = common.settled_stats(url)
    finally:
        common.stop_server(proc)
    if rc != 0:
        raise RuntimeError(f"snakemake failed ({rc}) for {label}:\n{(d / 'snakemake.log').read_text()[-4000:]}")
    busy, low, span = common.occupancy(st["timeline"], args.slots)
    done = {n: json.loads((d / "results" / n / "inference.done").read_text()) for n in args.profiles}
    over = max(v["overshoot_pct"] for v in done.values())
    return {"busy_pct": 100 * busy, "span_s": span, "wall_s": wall, "max_over_pct": over,
            "states": {v["state"] for v in done.values()}}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="one seed, half the budgets (a smoke run)")
    ap.add_argument("--seeds", type=int, help="runs per setting (default 3; --quick 1)")
    ap.add_argument("--slots", type=int, default=12, help="the server's slots (default %(default)s)")
    ap.add_argument("--datasets", type=int, choices=sorted(PROFILES), default=8,
                    help="how many datasets (length profiles) share the server (default %(default)s)")
    ap.add_argument("--settings", default="default,cores1,sequential",
                    help="comma-separated: default, cores1, sequential, exact, oversub (default %(default)s)")
    ap.add_argument("--oversub", default="2,3",
                    help="comma-separated oversubscription factors of the oversub setting (default %(default)s)")
    ap.add_argument("--scale", type=float, default=50.0,
                    help="production lengths divided by this (default %(default)s)")
    ap.add_argument("--rate", type=float, default=200.0,
                    help="per-stream tokens/s of the server (default %(default)s)")
    ap.add_argument("--chunk-interval-s", type=float, default=0.1)
    ap.add_argument("--sigma", type=float, default=0.8)
    ap.add_argument("--run-s", type=float, default=60.0,
                    help="server-seconds of work in all budgets together at full occupancy (default %(default)s)")
    ap.add_argument("--cores", type=int, default=4,
                    help="snakemake --cores of the sequential/exact/oversub settings (default %(default)s)")
    ap.add_argument("--target", default="all",
                    help="snakemake target: all (default: the README's command) or inference (results/D/inference.done "
                         "only, the jobs that use the server)")
    args = ap.parse_args(argv)
    common.exit_on_sigterm()
    args.profiles = PROFILES[args.datasets]
    args.oversub = [float(x) for x in args.oversub.split(",") if x]
    args.settings = [x for x in args.settings.split(",") if x]
    seeds = args.seeds or (1 if args.quick else 3)
    if args.quick:
        args.run_s /= 2
    args.max_tokens = round(PROD_MAX_TOKENS / args.scale)
    total = round(args.run_s * args.slots * args.rate)  # tokens the server makes in run_s at full occupancy
    args.budgets = dict(zip(args.profiles, split(total, [w for _, w in args.profiles.values()])))

    runs = settings(args)
    per = {label: [] for label, *_ in runs}
    with tempfile.TemporaryDirectory(prefix="bench_occupancy.") as tmp:
        work = Path(tmp)
        tok = build_tokenizer(work / "tokenizer")
        for seed in range(1, seeds + 1):
            for label, conc, resource, cores in runs:
                r = one_run(label, conc, resource, cores, seed, work, tok, args)
                per[label].append(r)
                print(f"seed {seed} {label:12s} busy {r['busy_pct']:.1f}% over {r['span_s']:.1f}s, "
                      f"snakemake {r['wall_s']:.1f}s, budgets {'/'.join(sorted(r['states']))} "
                      f"(max over {r['max_over_pct']:+.2f}%)", flush=True)

    first = runs[0][0]
    seq_span = common.median([r["span_s"] for r in per[first]])
    headers = ["setting", f"concurrency {'/'.join(args.profiles)}", "server_slots", "busy slots, median", "min",
               "first request to last response s", f"vs {first}", "snakemake wall s", f">= {GOAL:g} %"]
    rows = []
    for label, conc, resource, _ in runs:
        rs = per[label]
        busy = common.median([r["busy_pct"] for r in rs])
        span = common.median([r["span_s"] for r in rs])
        rows.append([label, "/".join(str(conc[n]) for n in args.profiles), resource or "no cap", f"{busy:.1f}%",
                     f"{min(r['busy_pct'] for r in rs):.1f}%", f"{span:.1f}", f"{span / seq_span:.2f}x",
                     f"{common.median([r['wall_s'] for r in rs]):.1f}",
                     "yes" if min(r["busy_pct"] for r in rs) >= GOAL else "no"])
    means = "/".join(f"{m / args.scale:g}" for m, _ in args.profiles.values())
    budgets = "/".join(f"{args.budgets[n]:,}" for n in args.profiles)
    max_resp = args.max_tokens / args.rate
    notes = [
        f"{seeds} seed(s); medians and minimum of the busy-slot share (time-weighted busy slots / {args.slots} "
        "slots, first request to last response, from the server's occupancy timeline).",
        f"One mock server: {args.slots} slots, {args.rate:g} tokens/s per stream. Datasets {'/'.join(args.profiles)}: "
        f"lognormal (sigma {args.sigma:g}) means {means} tokens (production "
        f"{'/'.join(str(m) for m, _ in args.profiles.values())} divided by {args.scale:g}, via extra_body "
        f"mock_mean_tokens), max_tokens {args.max_tokens}, budgets {budgets} tokens.",
        f"The whole run is ~{args.run_s:g} s of full-server work, {args.run_s / max_resp:.0f}x the longest "
        f"response ({max_resp:.2f} s); production (8 x 10M tokens, responses up to 10,240 tokens at ~5 tokens/s "
        "per stream) is ~50x, so the final drain weighs as much as there.",
        f"snakemake --cores C [--resources server_slots=R] {args.target}; a fresh working directory and server per "
        "run; default and --cores 1 set no server_slots (the README's command; inference jobs take no cores).",
        "oversub: each dataset's concurrency is raised so their sum exceeds the server's slots; the server "
        "queues the surplus, so a dataset that finishes (or a job that is starting) leaves no slot idle.",
    ]
    common.report("occupancy", "Server occupancy across datasets: sequential vs concurrent, exact vs oversubscribed",
                  headers, rows, notes)
    return 0


if __name__ == "__main__":
    sys.exit(main())
