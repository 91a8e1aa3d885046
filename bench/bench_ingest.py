#!/usr/bin/env python3
"""Benchmark 7: the client's ingest ceiling, budgetgen's inference job against a minimal stream reader.

One token per SSE event (how real engines stream at low batch), a mock server with no token delay and
long fixed-length responses, at 150, 512 and 1,024 streams in flight. Per client, stream count and repetition,
on a fresh server:

  budgetgen   the real inference job (budgetgen.inference.run, as bench_client.py runs it: prompts file,
              journal, dispatch rule, ChatClient over httpx) with a budget it never reaches
  budgetgen-1w, -2w  the same job with 1 or 2 stream worker processes (server.client_processes)
  baseline    the least a client can do with the same stream: asyncio.open_connection, one HTTP/1.1
              request (the same body budgetgen sends: stream_options include_usage and
              continuous_usage_stats), StreamReader.readline per line, json.loads per `data:` event,
              the text pieces joined; nothing journaled

Each client runs in its own process (bench_client.py's children), which reports its wall time and its
own CPU seconds (getrusage), so the figure is tokens per client CPU-second: what one client core can
take in. Goal (issue 15): budgetgen >= 0.5x the baseline's tokens per CPU-second.

    .venv/bin/python bench/bench_ingest.py [--quick] [--streams 150,512] [--tokens 400] [--reps 3]
    .venv/bin/python bench/bench_ingest.py --tokens-per-event 1,8 --streams 512 --clients budgetgen,baseline \
        --output ingest-events     # the client's CPU per token when the server packs 8 tokens per event
                                   # (--stream-interval 8 of SGLang and vLLM), beside the raw parser
"""

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from urllib.parse import urlsplit

import bench_client
import common

MODEL = "mock-model"
CLIENTS = ("budgetgen", "budgetgen-1w", "budgetgen-2w", "baseline")
WORKERS = {"budgetgen": 0, "budgetgen-1w": 1, "budgetgen-2w": 2}  # server.client_processes of each
GOAL_RATIO = 0.5  # issue 15: the job in one process, per CPU-second
GOAL_WORKERS = 0.8  # issue 32: with stream workers, tokens/s at 512 and 1,024 streams


def child_baseline(args):
    """The minimal reader (see the module docstring); returns (wall, cpu, responses, tokens)."""
    with open(args.prompts) as f:
        prompts = [json.loads(line)["prompt"] for line in f]
    u = urlsplit(args.url)
    path = u.path.rstrip("/") + "/chat/completions"

    async def main():
        sem = asyncio.Semaphore(args.concurrency)
        done = tokens = 0

        async def one(text):
            nonlocal done, tokens
            body = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": text}], "stream": True,
                               "stream_options": {"include_usage": True, "continuous_usage_stats": True},
                               "max_tokens": args.max_tokens}).encode()
            async with sem:
                reader, writer = await asyncio.open_connection(u.hostname, u.port)
                writer.write(b"POST %s HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\n"
                             b"Content-Length: %d\r\nConnection: close\r\n\r\n"
                             % (path.encode(), u.netloc.encode(), len(body)) + body)
                pieces, usage = [], None
                loads = json.loads
                while True:
                    line = await reader.readline()
                    if not line:
                        break
                    if not line.startswith(b"data: "):
                        continue  # headers, chunk sizes, blank lines
                    data = line[6:].strip()
                    if data == b"[DONE]":
                        break
                    chunk = loads(data)
                    for choice in chunk.get("choices") or ():
                        piece = choice["delta"].get("content")
                        if piece:
                            pieces.append(piece)
                    usage = chunk.get("usage") or usage
                writer.close()
                "".join(pieces)
                done += 1
                tokens += usage["completion_tokens"]

        await asyncio.gather(*(one(t) for t in prompts))
        return done, tokens

    c0, t0 = bench_client.cpu_self(), time.perf_counter()
    done, tokens = asyncio.run(main())
    return time.perf_counter() - t0, bench_client.cpu_self() - c0, done, tokens


def child_main(args):
    if args.child == "baseline":
        wall, cpu, done, tokens = child_baseline(args)
    else:
        args.client_processes = WORKERS[args.child]
        wall, cpu, done = bench_client.child_budgetgen(args)
        tokens = done * args.tokens
    print(json.dumps({"wall": wall, "cpu": cpu, "done": done, "tokens": tokens}), flush=True)


def one_run(client, streams, rep, work, prompts, args, per_event=1):
    d = work / f"{client}-{streams}-{per_event}-{rep}"
    d.mkdir()
    proc, url = common.start_server(["--length-dist", "fixed", "--mean-tokens", args.tokens,
                                     "--tokens-per-s", args.rate,
                                     "--chunk-interval-s", 0.01, "--tokens-per-event", per_event, "--seed", rep],
                                    work / "servers")
    try:
        return bench_client.run_child(__file__, client, proc, url, prompts, d, args.requests,
                                      ["--concurrency", str(streams), "--max-tokens", str(args.tokens),
                                       "--tokens", str(args.tokens)])
    finally:
        common.stop_server(proc)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="a third of the tokens per run, one repetition")
    ap.add_argument("--streams", default="150,512,1024",
                    help="streams in flight, comma-separated (default %(default)s)")
    ap.add_argument("--tokens", type=int, default=400, help="tokens per response (default %(default)s)")
    ap.add_argument("--total", type=int, default=600_000, help="tokens per run (default %(default)s)")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--rate", type=float, default=100.0,
                    help="tokens/s per stream (default %(default)s: one event per network read, as from an engine "
                         "at low batch; 0 = as fast as the server can, 64 events per write)")
    ap.add_argument("--tokens-per-event", default="1",
                    help="tokens per SSE event, comma-separated (default %(default)s; an engine's --stream-interval)")
    ap.add_argument("--clients", default=",".join(CLIENTS), help="comma-separated subset (default all)")
    ap.add_argument("--output", default="ingest", help="bench/results/NAME.md (default %(default)s)")
    ap.add_argument("--child", choices=CLIENTS, help=argparse.SUPPRESS)
    ap.add_argument("--url", help=argparse.SUPPRESS)
    ap.add_argument("--prompts", help=argparse.SUPPRESS)
    ap.add_argument("--work", help=argparse.SUPPRESS)
    ap.add_argument("--concurrency", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--max-tokens", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return child_main(args)
    common.exit_on_sigterm()
    if args.quick:
        args.total //= 3
        args.reps = 1
    streams = [int(x) for x in args.streams.split(",") if x]
    per_events = [int(x) for x in args.tokens_per_event.split(",") if x]
    clients = [c for c in args.clients.split(",") if c]
    if "baseline" not in clients or set(clients) - set(CLIENTS):
        ap.error(f"--clients: a subset of {','.join(CLIENTS)} with the baseline")
    args.requests = max(max(streams), args.total // args.tokens)
    runs = {(c, n, e): [] for c in clients for n in streams for e in per_events}
    with tempfile.TemporaryDirectory(prefix="bench_ingest.") as tmp:
        work = Path(tmp)
        prompts = work / "prompts.jsonl"
        bench_client.write_prompts(prompts, args.requests)
        for rep in range(args.reps):
            for n, e in [(n, e) for n in streams for e in per_events]:
                for client in (clients if rep % 2 == 0 else clients[::-1]):  # alternate the order: drift
                    res = one_run(client, n, rep, work, prompts, args, e)
                    runs[(client, n, e)].append(res)
                    print(f"  {client} {n} streams {e}/event rep {rep}: {res['tokens'] / res['cpu']:,.0f} tokens per "
                          "client "
                          f"CPU-s, {res['tokens'] / res['wall']:,.0f} tokens/s, client CPU {res['cpu']:.2f} s, "
                          f"server CPU {res['server_cpu']:.2f} s", file=sys.stderr, flush=True)

    def med(key, fn):
        return common.median([fn(r) for r in runs[key]])

    rows, ratios, wall_ratios = [], {}, {}
    for n, e in [(n, e) for n in streams for e in per_events]:
        base = med(("baseline", n, e), lambda r: r["tokens"] / r["cpu"])
        base_wall = med(("baseline", n, e), lambda r: r["tokens"] / r["wall"])
        for client in clients:
            key = (client, n, e)
            per_cpu = med(key, lambda r: r["tokens"] / r["cpu"])
            per_s = med(key, lambda r: r["tokens"] / r["wall"])
            ratios[key], wall_ratios[key] = per_cpu / base, per_s / base_wall
            rows.append([n, e, client, f"{per_cpu:,.0f}", f"{1e6 / per_cpu:.1f}", f"{per_cpu / base:.2f}x",
                         f"{per_s:,.0f}", f"{per_s / base_wall:.2f}x",
                         f"{100 * med(key, lambda r: r['cpu'] / r['wall']):.0f}% / "
                         f"{100 * med(key, lambda r: r['server_cpu'] / r['wall']):.0f}%"])
    e1 = per_events[0]
    best = {c: max(med((c, n, e1), lambda r: r["tokens"] / r["wall"]) for n in streams) for c in WORKERS
            if c in clients}
    cores = len(os.sched_getaffinity(0))
    notes = [
        f"{args.requests} requests per run of {args.tokens} tokens each, {args.tokens_per_event} tokens per SSE "
        "event, usage on every "
        f"event (continuous_usage_stats, as budgetgen asks), mock server --tokens-per-s {args.rate:g} per stream "
        f"(chunks every 10 ms: {'one event per network read' if 0 < args.rate <= 100 else 'several events per read'}); "
        f"medians of {args.reps} "
        f"runs, each on a fresh server, each client in its own process; {cores} CPU cores.",
        "tokens per client CPU-s = completion tokens received / the client's user + system CPU seconds "
        "(getrusage of the client process and of its reaped children, the stream workers): the rate one client "
        "core takes in. busy = CPU seconds / wall seconds (client, workers included / server).",
        "budgetgen-Nw: the same job with server.client_processes N (budgetgen.stream_workers: N processes read "
        "the streams, the job's process decides and journals).",
        "us CPU per token = 1e6 / tokens per client CPU-s: what a token costs the client at that packing.",
        f"goal (issue 15, at {e1} per event): budgetgen >= 0.5x the baseline's tokens per CPU-s: " + ", ".join(
            f"{n} streams {ratios['budgetgen', n, e1]:.2f}x "
            f"({'met' if ratios['budgetgen', n, e1] >= GOAL_RATIO else 'missed'})" for n in streams) + ".",
        "goal (issue 32): one job with stream workers >= 0.8x the baseline at 512 and 1,024 streams: " + ("; ".join(
            f"{c} at {n}: {ratios[c, n, e1]:.2f}x per CPU-s, {wall_ratios[c, n, e1]:.2f}x tokens/s "
            f"({'met' if max(ratios[c, n, e1], wall_ratios[c, n, e1]) >= GOAL_WORKERS else 'missed'})"
            for c in ("budgetgen-1w", "budgetgen-2w") if c in clients for n in streams if n >= 512) or "not run") + ".",
        "highest tokens/s one job reached here: " + ", ".join(f"{c} {v:,.0f}" for c, v in best.items())
        + f" (wall clock; on this machine the mock server shares the {cores} cores with the client and its "
        "workers, so wall rates are bounded by all of them together: see the server's busy share).",
    ]
    common.report(args.output, f"Client ingest ceiling: tokens per client CPU-second at {args.tokens_per_event} "
                  "tokens per event",
                  ["streams", "tokens/event", "client", "tokens per client CPU-s", "us CPU per token", "vs baseline",
                   "tokens/s (wall)", "vs baseline", "busy client / server"], rows, notes)


if __name__ == "__main__":
    main()
