#!/usr/bin/env python3
"""Benchmark: the parse-time prompts check (budgetgen.prompts_check, issue 29) on a large prompts file,
against the inference job's own load_prompts reading the same file.

A prompts file of 10,000,000 lines (~200 bytes each, ~2 GB: OpenAI messages with a system turn,
prompt records with an id, ShareGPT conversations with an id, Alpaca instructions; some non-ASCII
text) is generated under /tmp and deleted afterwards. It is read once before timing, so every method
reads it from the page cache. Each method runs in a fresh process (wall time of the call, peak RSS
from getrusage):

  check, first     prompts_check.check_cached with no cache yet: every line checked (the default
                   workers: one per core, at most 8)
  check, 1 process the same with workers=1
  check, cached    check_cached again, the verdict in the cache file (what a second `snakemake -n`
                   and every job's parse of the Snakefile pay)
  load_prompts     the job's prompts.load_prompts(path) (the baseline: what `-n` would cost if it
                   simply loaded the file), on the file's first --baseline-lines lines (default 1M:
                   it holds every prompt in memory, ~1.6 GB per million lines), its time scaled to
                   the whole file by lines in the table

    .venv/bin/python bench/bench_prompts_check.py [--quick] [--lines N] [--reps R]
"""

import argparse
import json
import os
import random
import resource
import shutil
import subprocess
import sys
import tempfile
import time

import common

METHODS = ("check-first", "check-1-process", "check-cached", "load_prompts")
LABELS = {"check-first": "check, first (default workers)", "check-1-process": "check, first, 1 process",
          "check-cached": "check, cached", "load_prompts": "load_prompts (the job's)"}
GOAL_S = 10.0  # "a 10M-line file validated once in seconds"


def generate(path, n, seed=0):
    """n prompts lines of ~200 bytes in the four accepted shapes; returns the file's size."""
    rng = random.Random(seed)
    words = ("the of and to in is that for it as was with be by on not this are or from at which but have an "
             "they you were there one all we can her has more will what when up out about so said who into "
             "café naïve Zürich 東京 привет").split()
    pool = " ".join(rng.choices(words, k=200_000))
    size = 0
    with open(path, "wb") as f:
        buf = []
        for i in range(n):
            start = rng.randrange(0, len(pool) - 400)
            text = pool[start:start + rng.randrange(70, 190)]
            kind = i % 10
            if kind < 4:
                rec = {"messages": [{"role": "system", "content": "You are a helpful assistant."},
                                    {"role": "user", "content": text}]}
            elif kind < 7:
                rec = {"id": f"q{i:08d}", "prompt": text}
            elif kind < 9:
                rec = {"id": f"sg-{i}", "conversations": [{"from": "human", "value": text}]}
            else:
                rec = {"instruction": text[:60], "input": text[60:]}
            buf.append(json.dumps(rec, ensure_ascii=False).encode())
            if len(buf) == 100_000:
                chunk = b"\n".join(buf) + b"\n"
                f.write(chunk)
                size += len(chunk)
                buf = []
        if buf:
            chunk = b"\n".join(buf) + b"\n"
            f.write(chunk)
            size += len(chunk)
    return size


def child(args):
    from budgetgen import prompts, prompts_check

    t0 = time.perf_counter()
    if args.child == "load_prompts":
        got = len(prompts.load_prompts(args.path).prompts)
    else:
        workers = 1 if args.child == "check-1-process" else None
        if args.child == "check-first" and os.path.exists(args.cache):
            os.unlink(args.cache)
        if workers == 1:
            got = prompts_check.check_file(args.path, "error", workers=1)
        else:
            got = prompts_check.check_cached(args.path, "error", args.cache)
    wall = time.perf_counter() - t0
    rss_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss + resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    print(json.dumps({"wall": wall, "rss_mb": rss_kb / 1024, "result": got}), flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="500,000 lines")
    ap.add_argument("--lines", type=int, default=None, help="default 10,000,000")
    ap.add_argument("--reps", type=int, default=1, help="runs of each method (default 1)")
    ap.add_argument("--baseline-lines", type=int, default=1_000_000, help="lines load_prompts reads (default 1M)")
    ap.add_argument("--child", choices=METHODS, help=argparse.SUPPRESS)
    ap.add_argument("--path", help=argparse.SUPPRESS)
    ap.add_argument("--cache", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return child(args)
    n = args.lines or (500_000 if args.quick else 10_000_000)

    tmp = tempfile.mkdtemp(prefix="bench_prompts_check.", dir="/tmp")
    path, cache = os.path.join(tmp, "prompts.jsonl"), os.path.join(tmp, "prompts_check.json")
    runs = {m: [] for m in METHODS}
    try:
        t0 = time.perf_counter()
        size = generate(path, n)
        print(f"  generated {n:,} lines, {size / 1e6:,.0f} MB in {time.perf_counter() - t0:.1f} s",
              file=sys.stderr, flush=True)
        base_n = min(n, args.baseline_lines)
        base_path = os.path.join(tmp, "baseline.jsonl")
        with open(path, "rb") as f, open(base_path, "wb") as out:  # the file into the page cache
            for i, line in enumerate(f):
                if i < base_n:
                    out.write(line)
        for rep in range(args.reps):
            for m in METHODS:  # check-first before check-cached: it writes the cache
                target = base_path if m == "load_prompts" else path
                out = subprocess.run([sys.executable, __file__, "--child", m, "--path", target, "--cache", cache],
                                     capture_output=True, text=True)
                if out.returncode != 0:
                    raise RuntimeError(f"{m} failed ({out.returncode}):\n{out.stderr[-3000:]}")
                res = json.loads(out.stdout.strip().splitlines()[-1])
                runs[m].append(res)
                print(f"  rep {rep}: {m}: {res['wall']:.2f} s, peak RSS {res['rss_mb']:.0f} MB, result {res['result']}",
                      file=sys.stderr, flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    verdicts = {json.dumps(r["result"]) for m in METHODS if m != "load_prompts" for r in runs[m]}
    if verdicts != {"null"}:
        raise RuntimeError(f"the check refused a good file: {verdicts}")
    scale = {m: n / base_n if m == "load_prompts" else 1 for m in METHODS}  # seconds for the whole file
    med = {m: {"wall": common.median([r["wall"] for r in runs[m]]) * scale[m],
               "rss": common.median([r["rss_mb"] for r in runs[m]])} for m in METHODS}
    base = med["load_prompts"]["wall"]
    rows = [[LABELS[m], f"{med[m]['wall']:.3f}" if med[m]["wall"] < 1 else f"{med[m]['wall']:.1f}",
             "-" if m == "check-cached" else f"{n / med[m]['wall']:,.0f}", f"{med[m]['wall'] / base:.3g}x",
             f"{med[m]['rss']:,.0f}"] for m in METHODS]
    first = med["check-first"]["wall"]
    cores = len(os.sched_getaffinity(0))
    notes = [
        f"{n:,} lines, {size / 1e6:,.0f} MB ({size / n:.0f} bytes per line), generated; medians of {args.reps} "
        f"run(s), a fresh process each, file in the page cache; {cores} cores here (the first check used "
        f"min(8, {cores}) processes).",
        "peak RSS: the process's getrusage maxrss plus its largest worker's.",
        f"goal: {n:,} lines checked once in seconds (<= {GOAL_S:g} s): {first:.1f} s "
        f"({'met' if first <= GOAL_S else 'missed'}); the cached check "
        f"{med['check-cached']['wall'] * 1000:.1f} ms.",
        f"load_prompts read the first {base_n:,} lines in {med['load_prompts']['wall'] / scale['load_prompts']:.1f} s "
        f"({runs['load_prompts'][0]['result']:,} prompts kept, the rest repeated content), peak RSS as measured "
        f"there; its time is scaled by {scale['load_prompts']:g} (lines) to the whole file.",
    ]
    common.report("prompts-check", "Parse-time prompts check (prompts_check) vs the job's load_prompts",
                  ["method", "time s", "lines/s", "vs load_prompts", "peak RSS MB"], rows, notes)


if __name__ == "__main__":
    main()
