#!/usr/bin/env python3
"""Benchmark 5: recovering the state of a large journal, budgetgen's scan() against parsing every line.

A journal of ~250,000 records of ~4 KB each (~1 GB) is generated under /tmp with budgetgen.journal's
own encoder (encode_record: `id` first, `usage` last, ensure_ascii=False) and deleted afterwards. Each
repetition, in a fresh process per method (wall time and peak RSS from getrusage):

  budgetgen   journal.scan(path): done ids, token total, per-record lengths, duplicates (what a resume
              and the budget_status checkpoint do)
  json.loads  the usual script: json.loads of every line, the same ids / tokens / lengths collected

The file is read once before timing, so both read it from the page cache (the usual case right after a
run; a cold read adds the same disk time to both).

    .venv/bin/python bench/bench_resume.py [--quick] [--records N] [--reps R]
"""

import argparse
import hashlib
import json
import os
import random
import resource
import subprocess
import sys
import tempfile
import time

import common

from budgetgen import journal
from budgetgen_testkit.records import stamped

GOAL_RATIO, GOAL_MB = 1.0, 200
METHODS = ("budgetgen", "json.loads")


def generate(path, n, record_bytes=4000, seed=0):
    """n journal records of about record_bytes each, through journal.encode_record."""
    from budgetgen_testkit.mock_server import VOCAB

    rng = random.Random(seed)
    words = list(VOCAB) + ["café", "naïve", "Zürich", "東京", "привет", "λ", "→", "\\", '"quoted"', "\t"]
    pool = " ".join(rng.choices(words, k=200_000))  # sliced per record: cheap, varied text
    params = {"model": "bench-model", "max_tokens": 4096, "temperature": 0.7,
              "extra_body": {"chat_template_kwargs": {"enable_thinking": True}}}
    size = 0
    with open(path, "w", encoding="utf-8") as f:
        for i in range(n):
            rid = hashlib.sha256(f"prompt {i}".encode()).hexdigest()[:24]
            body = int(rng.uniform(0.5, 1.5) * (record_bytes - 330))  # text; the rest is structure
            start = rng.randrange(0, len(pool) - body)
            reasoning_len = rng.randrange(0, body // 2)
            prompt = pool[start:start + rng.randrange(100, 400)]
            reasoning = pool[start + 400:start + 400 + reasoning_len]
            content = pool[start + 400 + reasoning_len:start + body]
            tokens = len(reasoning + content) // 4
            line = journal.encode_record(stamped({
                "id": rid,
                "messages": [{"role": "user", "content": prompt},
                             {"role": "assistant", "content": content, "reasoning_content": reasoning}],
                "finish_reason": "stop" if rng.random() < 0.9 else "length",
                "params": params,
                "served_model": "bench-model",
                "created": round(1.7e9 + i * 0.01, 3),
                "latency_s": round(rng.uniform(5, 60), 3),
                "attempts": 1,
                "usage": {"prompt_tokens": len(prompt) // 4, "completion_tokens": tokens,
                          "total_tokens": len(prompt) // 4 + tokens},
            }))
            f.write(line)
            size += len(line.encode("utf-8"))
    return size


# -- child ---------------------------------------------------------------------------------------

def scan_json(path):
    """The plain way: json.loads of every line; first occurrence of an id counts."""
    ids, tokens, records, duplicates, lengths = set(), 0, 0, 0, []
    with open(path, encoding="utf-8") as f:
        for line in f:
            if not line.strip():
                continue
            rec = json.loads(line)
            rid = str(rec["id"])
            if rid in ids:
                duplicates += 1
                continue
            n = int((rec.get("usage") or {}).get("completion_tokens") or 0)
            ids.add(rid)
            tokens += n
            records += 1
            lengths.append(n)
    return records, tokens, duplicates


def child(args):
    t0 = time.perf_counter()
    if args.child == "budgetgen":
        st = journal.scan(args.path)
        got = (st.records, st.tokens, st.duplicates)
    else:
        got = scan_json(args.path)
    wall = time.perf_counter() - t0
    rss_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(json.dumps({"wall": wall, "rss_mb": rss_kb / 1024, "records": got[0], "tokens": got[1],
                      "duplicates": got[2]}), flush=True)


def baseline_rss():
    """Peak RSS of a child that only starts up (interpreter + imports), to report next to the others."""
    out = subprocess.run([sys.executable, "-c", "import sys, json, resource; sys.path.insert(0, sys.argv[1]); "
                          "from budgetgen import journal; "
                          "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)",
                          str(common.REPO / "scripts")], capture_output=True, text=True, check=True)
    return int(out.stdout.strip()) / 1024


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="50,000 records (~200 MB)")
    ap.add_argument("--records", type=int, default=None, help="default 250,000 (~1 GB)")
    ap.add_argument("--record-bytes", type=int, default=4000)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--child", choices=METHODS, help=argparse.SUPPRESS)
    ap.add_argument("--path", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return child(args)
    n = args.records or (50_000 if args.quick else 250_000)

    runs = {m: [] for m in METHODS}
    fd, path = tempfile.mkstemp(prefix="bench_resume.", suffix=".journal.jsonl", dir="/tmp")
    os.close(fd)
    try:
        t0 = time.perf_counter()
        size = generate(path, n, args.record_bytes)
        print(f"  generated {n:,} records, {size / 1e6:,.0f} MB in {time.perf_counter() - t0:.1f} s",
              file=sys.stderr, flush=True)
        with open(path, "rb") as f:  # into the page cache
            while f.read(1 << 24):
                pass
        for rep in range(args.reps):
            for m in (METHODS if rep % 2 == 0 else METHODS[::-1]):
                out = subprocess.run([sys.executable, __file__, "--child", m, "--path", path],
                                     capture_output=True, text=True)
                if out.returncode != 0:
                    raise RuntimeError(f"{m} failed ({out.returncode}):\n{out.stderr[-3000:]}")
                res = json.loads(out.stdout.strip().splitlines()[-1])
                runs[m].append(res)
                print(f"  rep {rep}: {m}: {res['wall']:.2f} s, peak RSS {res['rss_mb']:.0f} MB",
                      file=sys.stderr, flush=True)
    finally:
        os.unlink(path)

    got = {(r["records"], r["tokens"], r["duplicates"]) for rs in runs.values() for r in rs}
    if len(got) != 1:
        raise RuntimeError(f"the methods disagree on the state: {sorted(got)}")
    records, tokens, _ = got.pop()
    if records != n:
        raise RuntimeError(f"{records} records recovered, {n} written")
    start_mb = baseline_rss()
    med = {m: {"wall": common.median([r["wall"] for r in runs[m]]),
               "rss": common.median([r["rss_mb"] for r in runs[m]])} for m in METHODS}
    base = med["json.loads"]
    rows = [[m, f"{med[m]['wall']:.2f}", f"{size / 1e6 / med[m]['wall']:,.0f}", f"{n / med[m]['wall']:,.0f}",
             f"{med[m]['wall'] / base['wall']:.2f}x", f"{med[m]['rss']:.0f}"] for m in METHODS]
    ratio, rss = med["budgetgen"]["wall"] / base["wall"], med["budgetgen"]["rss"]
    notes = [
        f"{n:,} records, {size / 1e6:,.0f} MB ({size / n:,.0f} bytes per record), written with "
        f"budgetgen.journal.encode_record; {tokens:,} completion tokens recovered by both, identically; "
        f"medians of {args.reps} runs, a fresh process each, file in the page cache.",
        f"peak RSS = getrusage maxrss of the child (a child that only starts and imports: {start_mb:.0f} MB).",
        f"goals: time <= {GOAL_RATIO:g}x parsing: {ratio:.2f}x ({'met' if ratio <= GOAL_RATIO else 'missed'}); "
        f"peak memory <= {GOAL_MB} MB: {rss:.0f} MB ({'met' if rss <= GOAL_MB else 'missed'}).",
    ]
    common.report("resume", "Resume: recovering state from a large journal (journal.scan vs json.loads of every line)",
                  ["method", "time s", "MB/s", "records/s", "vs json.loads", "peak RSS MB"], rows, notes)


if __name__ == "__main__":
    main()
