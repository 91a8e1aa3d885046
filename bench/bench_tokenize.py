#!/usr/bin/env python3
"""Benchmark 4: tokens/s and rows/s of budgetgen's tokenize step against a naive loop and the tokenizer alone.

Generated conversations (optional system turn, a user turn, a generated assistant turn with reasoning
in half of them; a few hundred tokens each) in a raw_responses.jsonl, and a local byte-level BPE
tokenizer with a ChatML template (budgetgen_testkit.tiny_tokenizer, 4096 tokens, trained on the same kind of
text). Every method makes the same rows as budgetgen (issue 11): prompt ids + completion ids, where
the prompt is the generation-prompt render (apply_chat_template(messages[:-1], add_generation_prompt=True)
with the record's own chat_template_kwargs) and the completion the model's raw output rebuilt from
reasoning_content/content with the template's reasoning delimiters (budgetgen.turn_format.TurnFormat,
so the texts are budgetgen's), plus the end-of-turn token. On 1 core and on 2 cores (each in its own
process, pinned with sched_setaffinity):

  budgetgen      tokenization.tokenize_file on the JSONL (1 core: processes=1; 2 cores: processes=2,
                 and processes=1, whose Rust tokenizer then uses both cores): parse, render the prompt,
                 rebuild the completion, tokenize both, loss mask, Arrow file written
  naive          per record: json.loads, apply_chat_template(messages[:-1], add_generation_prompt=True,
                 tokenize=False), the completion text (TurnFormat.completion_text), tokenizer(...) of
                 each, + the end-of-turn id, mask = 0 * len(prompt) + 1 * len(completion) (2 cores: the
                 same in a 2-process multiprocessing.Pool, fork, over chunks of 512 lines); the rows are
                 kept in memory, nothing is written
  ceiling        tokenizer(texts) batched on the already rendered prompt texts plus the completion texts:
                 tokenization alone, no parsing, no rendering, no mask, no output (the practical ceiling)
  backend        tokenizer.backend_tokenizer.encode_batch_fast(texts) on the same texts: the Rust
                 tokenizer with no Python wrapper (shown for reference; budgetgen calls this one)
  before REV     with --against REV: tokenize_file of budgetgen at git revision REV (e.g. 5620e83^, before
                 the prompt + completion rows: it rendered and tokenized the full conversation and the
                 prompt), processes=1, in a helper process on the same cores, in the same runs

tokens/s counts prompt + completion tokens (the same number for every method, checked against
budgetgen's stats["tokens"]; the end-of-turn ids are counted for ceiling/backend too, appended, not
tokenized); `before` counts its own rows' tokens (full conversations), so compare it by rows/s.

    .venv/bin/python bench/bench_tokenize.py [--quick | --full] [--conversations N] [--reps R] [--against REV]
                                             [--output NAME]

Default 4,000 conversations, 4 runs (~2 min on 2 idle cores, ~3 with --against); --full is the 50,000 of the \
issue (~12 min).
"""

import argparse
import gc
import json
import os
import random
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import common

GOAL_NAIVE, GOAL_CEILING = 5.0, 0.9  # issue 15 goal 4: >= 0.9x the ceiling (issue 4's was 0.7x)
WORDS = None  # filled from the mock server's vocabulary plus some code-ish words


def words():
    global WORDS
    if WORDS is None:
        from budgetgen_testkit.mock_server import VOCAB

        WORDS = list(VOCAB) + ["function", "return", "value", "list", "python", "model", "token", "error",
                               "result", "data", "x", "y", "i", "n", "42", "0", "1", "2025", "()", "=", "+",
                               "{", "}", "[", "]", "def", "class", "import"]
    return WORDS


def text(rng, n):
    vocab = words()
    out = []
    for w in rng.choices(vocab, k=n):
        out.append(w)
        r = rng.random()
        if r < 0.06:
            out.append(".")
        elif r < 0.09:
            out.append(",")
        elif r < 0.10:
            out.append("\n")
    return " ".join(out)


def generate(path, n, seed=0):
    from budgetgen_testkit.records import stamped

    rng = random.Random(seed)
    with open(path, "w") as f:
        for i in range(n):
            messages = []
            if rng.random() < 0.3:
                messages.append({"role": "system", "content": text(rng, rng.randint(10, 40))})
            messages.append({"role": "user", "content": text(rng, rng.randint(20, 120))})
            answer = {"role": "assistant", "content": text(rng, rng.randint(60, 240))}
            if rng.random() < 0.5:
                answer["reasoning_content"] = text(rng, rng.randint(40, 200))
            messages.append(answer)
            f.write(json.dumps(stamped({"id": f"r{i}", "messages": messages, "finish_reason": "stop",
                                "params": {"model": "bench-model", "max_tokens": 4096},
                                "served_model": "bench-model", "created": 0.0, "latency_s": 1.0,
                                "attempts": 1, "usage": {"completion_tokens": 0}})) + "\n")


def cpu_seconds():
    """CPU seconds (user + system) of this process, all its threads, and its children that have exited."""
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


# -- child: one process per core count, all methods and repetitions ---------------------------------

def _render(tokenizer):
    """The one-conversation render TurnFormat probes the template with (as budgetgen's encoder does)."""
    def render(conv):
        try:
            return tokenizer.apply_chat_template(conv, tokenize=False)
        except Exception:
            return None
    return render


def _record_kwargs(record):
    """The chat_template_kwargs the record's request used (params.extra_body), as budgetgen takes them."""
    params = record.get("params") or {}
    kwargs = (params.get("extra_body") or {}).get("chat_template_kwargs")
    return kwargs if isinstance(kwargs, dict) else {}


def _naive_rows(tokenizer, fmt, lines):
    rows = []
    for line in lines:
        record = json.loads(line)
        messages, finish = record["messages"], record.get("finish_reason")
        prompt = tokenizer.apply_chat_template(messages[:-1], tokenize=False, add_generation_prompt=True,
                                               **_record_kwargs(record))
        completion = fmt.completion_text(messages[-1], prompt, finish)
        prompt_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
        completion_ids = tokenizer(completion, add_special_tokens=False)["input_ids"]
        if finish != "length" and fmt.eot is not None:
            completion_ids.append(fmt.eot)
        rows.append((prompt_ids + completion_ids, [0] * len(prompt_ids) + [1] * len(completion_ids)))
    return rows


_NAIVE = None  # (tokenizer, TurnFormat), inherited by the fork Pool's workers


def _naive_chunk(lines):
    return _naive_rows(*_NAIVE, lines)


def run_naive(data, tok_path, processes):
    """The usual script: load the tokenizer, loop (or multiprocessing.Pool, fork: the usual default on Linux).

    The turn format (reasoning delimiters, end-of-turn id) is budgetgen's TurnFormat, built once per run
    (a few probe renders), so the texts and ids are budgetgen's; a script would hard-code them."""
    global _NAIVE
    from transformers import AutoTokenizer

    from budgetgen.turn_format import TurnFormat

    with open(data) as f:
        lines = f.readlines()
    tokenizer = AutoTokenizer.from_pretrained(tok_path)
    _NAIVE = (tokenizer, TurnFormat(tokenizer, _render(tokenizer)))
    if processes == 1:
        rows = _naive_rows(*_NAIVE, lines)
    else:
        import multiprocessing

        with multiprocessing.get_context("fork").Pool(processes) as pool:
            chunks = [lines[i:i + 512] for i in range(0, len(lines), 512)]
            rows = [r for part in pool.imap(_naive_chunk, chunks) for r in part]
    return sum(len(ids) for ids, _ in rows), len(rows)


def run_budgetgen(data, tok_path, processes, out):
    from budgetgen.tokenization import TokenizeOptions, tokenize_file

    stats = tokenize_file(data, out, TokenizeOptions(tokenizer=tok_path, max_length=1 << 20, processes=processes),
                          log=lambda msg: None)
    return stats["tokens"], stats["rows"]


# budgetgen at another revision (--against): a helper process with that tree's scripts/ first on
# sys.path (bench/common imports the current budgetgen, so the helper is not this file). It reads one
# JSON line per run [data, out, tokenizer] and answers {"wall", "cpu", "tokens", "rows"}.
BEFORE_HELPER = r"""
import json, os, resource, sys, time
sys.path.insert(0, sys.argv[1])
import transformers  # noqa: F401
try:  # tokenize_file's settings object (since the tokenize module split), or its keyword arguments before
    from budgetgen.tokenization import TokenizeOptions, tokenize_file
    run = lambda data, out, tok: tokenize_file(data, out, TokenizeOptions(tokenizer=tok, max_length=1 << 20),
                                               log=lambda msg: None)
except ImportError:
    from budgetgen.tokenization import tokenize_file
    run = lambda data, out, tok: tokenize_file(data, out, tok, 1 << 20, processes=1, log=lambda msg: None)
def cpu():
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime
print(json.dumps({"ready": True}), flush=True)
for line in sys.stdin:
    data, out, tok = json.loads(line)
    t0, c0 = time.perf_counter(), cpu()
    stats = run(data, out, tok)
    wall, used = time.perf_counter() - t0, cpu() - c0
    import gc; gc.collect()
    print(json.dumps({"wall": wall, "cpu": used, "tokens": stats["tokens"], "rows": stats["rows"]}), flush=True)
"""


def start_before(scripts_dir):
    proc = subprocess.Popen([sys.executable, "-c", BEFORE_HELPER, scripts_dir], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    if not json.loads(proc.stdout.readline()).get("ready"):
        raise RuntimeError("the --against helper did not start")
    return proc


def run_before(proc, data, tok_path, out):
    proc.stdin.write(json.dumps([str(data), str(out), str(tok_path)]) + "\n")
    proc.stdin.flush()
    line = proc.stdout.readline()
    if not line:
        raise RuntimeError(f"the --against helper died ({proc.wait()})")
    return json.loads(line)


def row_texts(tokenizer, records):
    """Prompt texts + completion texts of the records (budgetgen's), and the number of end-of-turn ids."""
    from budgetgen.turn_format import TurnFormat

    fmt = TurnFormat(tokenizer, _render(tokenizer))
    # one kwargs group (the bench's records have none), so rendered in one batch
    assert not any(_record_kwargs(r) for r in records)
    prompts = tokenizer.apply_chat_template([r["messages"][:-1] for r in records], tokenize=False,
                                            add_generation_prompt=True)
    completions = [fmt.completion_text(r["messages"][-1], p, r.get("finish_reason"))
                   for r, p in zip(records, prompts)]
    eots = sum(r.get("finish_reason") != "length" for r in records) if fmt.eot is not None else 0
    return prompts + completions, eots


def child(args):
    cpus = sorted(os.sched_getaffinity(0))[:args.child]
    os.sched_setaffinity(0, cpus)  # before any Rust thread pool exists: it sizes itself to these
    os.environ["TOKENIZERS_PARALLELISM"] = "true"
    import transformers  # noqa: F401  (imported before any timing, as a running job has it)

    from budgetgen.turn_format import load_tokenizer

    tokenizer = load_tokenizer(args.tokenizer)
    with open(args.data) as f:
        records = [json.loads(line) for line in f]
    texts, eots = row_texts(tokenizer, records)
    n = len(records)
    del records
    methods = [("budgetgen", 1), ("naive", 1), ("ceiling", 1), ("backend", 1)]
    if args.child > 1:
        methods = [("budgetgen", args.child), ("budgetgen", 1), ("naive", args.child), ("ceiling", 1),
                   ("backend", 1)]
    helper = None
    if args.against_dir:
        methods.append(("before", 1))
        helper = start_before(args.against_dir)  # inherits this process's cores
    out = Path(args.work) / f"tokenized.{args.child}.arrow"
    # one untimed run of each on a few records: one-time imports (pyarrow, ...) and first-call setup are
    # paid here, as by a running job, not by whichever method comes first
    warm = Path(args.work) / f"warm.{args.child}.jsonl"
    with open(args.data) as f, open(warm, "w") as w:
        w.writelines(line for _, line in zip(range(16), f))
    run_budgetgen(warm, args.tokenizer, 1, out)
    run_naive(warm, args.tokenizer, 1)
    if helper is not None:
        run_before(helper, warm, args.tokenizer, out)
    results = []
    for rep in range(args.reps):
        for name, procs in (methods if rep % 2 == 0 else methods[::-1]):
            if name == "before":
                r = run_before(helper, args.data, args.tokenizer, out)
                wall, cpu, tokens, rows = r["wall"], r["cpu"], r["tokens"], r["rows"]
            else:
                t0, c0 = time.perf_counter(), cpu_seconds()
                if name == "budgetgen":
                    tokens, rows = run_budgetgen(args.data, args.tokenizer, procs, out)
                elif name == "naive":
                    tokens, rows = run_naive(args.data, args.tokenizer, procs)
                elif name == "ceiling":
                    tokens = sum(map(len, tokenizer(texts, add_special_tokens=False)["input_ids"])) + eots
                    rows = n
                else:
                    encs = tokenizer.backend_tokenizer.encode_batch_fast(texts, add_special_tokens=False)
                    tokens = sum(len(e.ids) for e in encs) + eots
                    rows = n
                    del encs  # freed inside the timing, not during the next method's (GBs at 50k conversations)
                wall, cpu = time.perf_counter() - t0, cpu_seconds() - c0
                gc.collect()  # each method starts from the same heap
            results.append({"method": name, "processes": procs, "rep": rep, "wall": wall, "cpu": cpu,
                            "tokens": tokens, "rows": rows})
            print(f"  {args.child} core(s) rep {rep}: {name} x{procs}: {tokens / wall:,.0f} tok/s, "
                  f"{rows / wall:,.0f} rows/s ({wall:.2f} s wall, {cpu:.2f} s CPU)", file=sys.stderr, flush=True)
    if helper is not None:
        helper.stdin.close()
        helper.wait()
    if args.child == 1:
        results.append({"method": "breakdown", **breakdown(args.data, args.tokenizer, out)})
    print(json.dumps(results), flush=True)


def breakdown(data, tok_path, out):
    """One more 1-process tokenize_file with RowEncoder.ids timed: (total, prompt ids, completion ids) seconds.

    encode() tokenizes a batch's prompt renders first and its completion texts second (ids() is called
    for both, even with nothing to do), so calls alternate."""
    from budgetgen import rows

    calls, original = [], rows.RowEncoder.ids

    def timed_ids(self, texts):
        t0 = time.process_time()
        out = original(self, texts)
        calls.append(time.process_time() - t0)
        return out

    rows.RowEncoder.ids = timed_ids
    try:
        t0 = time.process_time()
        run_budgetgen(data, tok_path, 1, out)
        total = time.process_time() - t0
    finally:
        rows.RowEncoder.ids = original
    if len(calls) % 2:
        raise RuntimeError(f"_Encoder.ids called {len(calls)} times: prompts and completions no longer alternate")
    return {"total": total, "prompt": sum(calls[0::2]), "completion": sum(calls[1::2])}


# -- parent ------------------------------------------------------------------------------------------

def extract_revision(rev, dest):
    """scripts/ of git revision rev, unpacked into dest (git archive: the working tree is not touched)."""
    archive = subprocess.run(["git", "-C", str(common.REPO), "archive", rev, "scripts/budgetgen"],
                             stdout=subprocess.PIPE, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)
    commit = subprocess.run(["git", "-C", str(common.REPO), "rev-parse", "--short", rev + "^{commit}"],
                            stdout=subprocess.PIPE, text=True, check=True).stdout.strip()
    return dest / "scripts", commit


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    size = ap.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_true", help="3,000 conversations")
    size.add_argument("--full", action="store_true", help="50,000 conversations (several minutes)")
    ap.add_argument("--conversations", type=int, default=None, help="default 4,000")
    ap.add_argument("--reps", type=int, default=4)
    ap.add_argument("--against", metavar="REV", help="also run tokenize_file of budgetgen at git revision REV "
                    "(e.g. 5620e83^, before prompt + completion rows), paired, processes=1")
    ap.add_argument("--output", default="tokenize", help="results file name, bench/results/NAME.md")
    ap.add_argument("--child", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--data", help=argparse.SUPPRESS)
    ap.add_argument("--tokenizer", help=argparse.SUPPRESS)
    ap.add_argument("--work", help=argparse.SUPPRESS)
    ap.add_argument("--against-dir", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return child(args)
    n = args.conversations or (3000 if args.quick else 50_000 if args.full else 4000)
    available = len(os.sched_getaffinity(0))
    core_counts = [1, 2] if available >= 2 else [1]
    load0 = os.getloadavg()[0]

    with tempfile.TemporaryDirectory(prefix="bench_tokenize.") as tmp:
        work = Path(tmp)
        against_dir = against_commit = None
        if args.against:
            (work / "against").mkdir()
            against_dir, against_commit = extract_revision(args.against, work / "against")
        data = work / "raw_responses.jsonl"
        generate(data, n)
        from budgetgen_testkit.tiny_tokenizer import build_tokenizer

        rng = random.Random(1)
        build_tokenizer(work / "tokenizer", [text(rng, 300) for _ in range(400)], vocab_size=4096)
        results = []
        for cores in core_counts:
            cmd = [sys.executable, __file__, "--child", str(cores), "--data", str(data), "--tokenizer",
                   str(work / "tokenizer"), "--work", str(work), "--reps", str(args.reps)]
            if against_dir:
                cmd += ["--against-dir", str(against_dir)]
            proc = subprocess.run(cmd, stdout=subprocess.PIPE, text=True,
                                  env={**os.environ, "HF_HUB_OFFLINE": "1"})
            if proc.returncode != 0:
                raise RuntimeError(f"child ({cores} cores) failed with {proc.returncode}")
            for r in json.loads(proc.stdout.strip().splitlines()[-1]):
                results.append({**r, "cores": cores})

    split = next(r for r in results if r["method"] == "breakdown")
    results = [r for r in results if r["method"] != "breakdown"]
    tokens = {r["tokens"] for r in results if r["method"] != "before"}
    if len(tokens) != 1:
        raise RuntimeError(f"methods disagree on the token count: {sorted(tokens)}")
    if {r["rows"] for r in results} != {n}:
        raise RuntimeError(f"a method made fewer rows than {n} conversations: {sorted({r['rows'] for r in results})}")
    total = tokens.pop()
    before_tokens = {r["tokens"] for r in results if r["method"] == "before"}
    if len(before_tokens) > 1:
        raise RuntimeError(f"the --against runs disagree on the token count: {sorted(before_tokens)}")
    before_total = before_tokens.pop() if before_tokens else None

    def key(cores):
        return "cpu" if cores == 1 else "wall"

    def rate(cores, method, procs, count):
        """1 core: per CPU second (= per s on an idle core, robust to other load); more: per wall second."""
        times = [r[key(cores)] for r in results if (r["cores"], r["method"], r["processes"]) == (cores, method, procs)]
        return count / common.median(times) if times else None

    def paired(cores, method, procs, base, base_procs):
        """Median over repetitions of method's rate / base's rate in the same repetition (same rows: a time ratio).

        The methods of one repetition run back to back, so their ratio is what this machine's speed
        swings (CPU seconds of the same work vary by up to 1.5x from minute to minute) disturb least."""
        by = {(r["method"], r["processes"], r["rep"]): r[key(cores)] for r in results if r["cores"] == cores}
        return common.median([by[(base, base_procs, rep)] / by[(method, procs, rep)] for rep in range(args.reps)])

    labels = [("budgetgen", "budgetgen tokenize_file, processes = cores", "p"),
              ("budgetgen", "budgetgen tokenize_file, processes=1", 1),
              ("naive", "naive per-record loop (Pool of `cores` processes)", "p"),
              ("ceiling", "ceiling: tokenizer(texts), batched", 1),
              ("backend", "backend encode_batch_fast(texts)", 1)]
    if against_dir:
        labels.append(("before", f"budgetgen before ({against_commit}): full + prompt renders, processes=1", 1))
    rows, ratios = [], {}
    for method, label, procs in labels:
        row = [label]
        for cores in core_counts:
            p = cores if procs == "p" else procs
            if method == "budgetgen" and procs == 1 and cores == 1:
                row += ["(row above)", "", "", ""]
                continue
            count = before_total if method == "before" else total
            to_naive, to_ceil = paired(cores, method, p, "naive", cores), paired(cores, method, p, "ceiling", 1)
            tok = f"{rate(cores, method, p, count):,.0f}" + (" *" if method == "before" else "")
            row += [tok, f"{rate(cores, method, p, n):,.0f}", f"{to_naive:.2f}x", f"{to_ceil:.2f}x"]
            ratios[(method, procs, cores)] = (to_naive, to_ceil)
        rows.append(row)
    headers = ["method"]
    for cores in core_counts:
        headers += (["1 core: tok per CPU-s", "rows per CPU-s"] if cores == 1
                    else [f"{cores} cores: tok/s (wall)", "rows/s (wall)"]) + ["vs naive", "vs ceiling"]

    def verdict(key):
        to_naive, to_ceiling = ratios[key]
        return (f"{to_naive:.2f}x naive ({'met' if to_naive >= GOAL_NAIVE else 'missed'}), {to_ceiling:.2f}x "
                f"ceiling ({'met' if to_ceiling >= GOAL_CEILING else 'missed'})")

    goal = "; ".join([f"1 core: {verdict(('budgetgen', 'p', 1))}"] + [
        f"{c} cores, processes={c}: {verdict(('budgetgen', 'p', c))}; {c} cores, processes=1: "
        f"{verdict(('budgetgen', 1, c))}" for c in core_counts if c > 1])
    speedup = "; ".join(
        f"{c} cores: processes={c} takes {paired(c, 'budgetgen', c, 'budgetgen', 1):.2f}x the rows/s of "
        f"processes=1 (paired), and processes=1 on {c} cores "
        f"{rate(c, 'budgetgen', 1, n) / rate(1, 'budgetgen', 1, n):.2f}x "
        f"the rows/s of 1 core" for c in core_counts if c > 1)
    tokenized = split["prompt"] + split["completion"]
    notes = [
        f"{n:,} conversations, {total:,} tokens in the rows ({total / n:.0f} per row: prompt + completion + "
        f"end-of-turn); tiny BPE (4096) with a ChatML template; {available} CPU core(s) available. "
        f"tok/s and rows/s: medians of {args.reps} runs; ratios (vs): medians of the per-run time ratios "
        "(the methods of a run go back to back, in alternating order; all make the same rows).",
        "1 core: per CPU second (user + system, all threads and worker processes) of a process pinned "
        "to one core: per second on an idle core, and not skewed by other load; 2 cores: per wall-clock "
        "second, meaningful only when both cores are idle.",
        "budgetgen and naive times include loading the tokenizer (and, with several processes, starting the "
        "pool: spawn + import in each worker); ceiling/backend time tokenization of pre-rendered prompt and "
        "completion texts only.",
        f"goals: >= {GOAL_NAIVE:g}x naive, >= {GOAL_CEILING:g}x ceiling: {goal}.",
        f"processes: {speedup}." if speedup else "",
        f"where budgetgen's time goes (1 core, one more run with the tokenizer calls timed): Rust tokenizer "
        f"{100 * tokenized / split['total']:.0f}% (prompts {100 * split['prompt'] / split['total']:.0f}%, "
        f"completions {100 * split['completion'] / split['total']:.0f}%), everything else (JSON, template "
        f"rendering, completion text, masks, Arrow, tokenizer load) {100 * (1 - tokenized / split['total']):.0f}%. "
        "The naive loop spends most of its time in the same tokenizer (with offsets, one text per call), so "
        "with a tokenizer this cheap per call no implementation can be much more than naive time / ceiling "
        "time faster than it.",
    ]
    if against_dir:
        b = [f"{c} core{'s' if c > 1 else ''}: {1 / paired(c, 'before', 1, 'budgetgen', 1):.2f}x the rows/s "
             f"({rate(c, 'budgetgen', 1, n):,.0f} vs {rate(c, 'before', 1, n):,.0f}), tokens/s "
             f"{rate(c, 'budgetgen', 1, total):,.0f} vs {rate(c, 'before', 1, before_total):,.0f}"
             for c in core_counts]
        notes.append(
            f"* before ({args.against} = {against_commit}) counts its own rows' tokens: {before_total:,} "
            f"({before_total / n:.0f} per row, the full conversation rendered by the template) vs {total:,} now, "
            "so its tokens/s is not comparable with the others; the same conversations make the same number of "
            f"rows, so rows/s and the vs columns are. budgetgen now (processes=1) vs before, paired: "
            + "; ".join(b) + ".")
    notes.append(f"load average {load0:.1f} at the start, {os.getloadavg()[0]:.1f} at the end, on {available} "
                 "cores: figures with more cores than are idle are not meaningful.")
    common.report(args.output, "Tokenize: tokens/s and rows/s (budgetgen vs naive loop vs tokenizer alone)",
                  headers, rows, [x for x in notes if x])


if __name__ == "__main__":
    main()
