#!/usr/bin/env python3
"""Benchmark 6: wall time of `snakemake -n all` with many datasets, against Snakemake's own floor.

Per size (8, 100, 500 datasets) a temporary working directory with one prompts file per dataset
(50 prompts each) and a config, in two states:

  fresh   nothing run yet (no results/)
  mix     what a user sees after a first run: 1/3 of the datasets met (journal over the budget and the
          budget_status checkpoint's output), 1/3 partial (journal at half the budget, checkpoint output),
          1/3 fresh; journals written with budgetgen.journal.JournalWriter, statuses with
          budgetgen.status.compute_status (what the checkpoint script runs)

The baseline is a trivial workflow with the same jobs (the same rules, per-rule job counts and edges
as budgetgen's dry-run planned, parsed from its job stats; `touch` rules, no config, no input
functions, no checkpoint): what Snakemake itself costs to plan that many jobs. Each time is the wall
time of a whole `python -m snakemake -n` process (startup included, as a user sees it).

    .venv/bin/python bench/bench_dag.py [--quick] [--sizes 8,100,500] [--reps R] [--profile]

--profile (or a size-500 time over the goal) adds a cProfile of budgetgen's 500-dataset mix dry-run:
where the time goes in Snakemake and in rules/*.smk.
"""

import argparse
import cProfile  # noqa: F401  (run as `python -m cProfile` in the child; imported to fail early if absent)
import json
import os
import pstats
import re
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import common
import yaml

from budgetgen import journal
from budgetgen.configfile import load_config
from budgetgen.fsutil import write_json_atomic
from budgetgen.settings import InferenceSettings
from budgetgen.status import compute_status
from budgetgen_testkit.records import stamped

GOAL_S = 10.0
BUDGET = 2000
PROMPTS = 50
CHAIN = ("budget_status", "inference", "finalize", "tokenize")  # plots hang off finalize


def make_workdir(d, n, state):
    d.mkdir(parents=True)
    (d / "prompts").mkdir()
    datasets, journals = {}, []
    for i in range(n):
        name = f"d{i:04d}"
        p = d / "prompts" / f"{name}.jsonl"
        with open(p, "w") as f:
            for j in range(PROMPTS):
                f.write(json.dumps({"id": f"{name}-{j}", "prompt": f"dataset {i} question {j}: explain topic {j}"})
                        + "\n")
        datasets[name] = {"prompts": f"prompts/{name}.jsonl"}
        kind = "fresh" if state == "fresh" else ("met", "partial", "fresh")[i % 3]
        if kind != "fresh":
            journals.append((name, BUDGET if kind == "met" else BUDGET // 2))
    tok = d / "tokenizer"  # the dry-run only hashes the folder; nothing loads it
    tok.mkdir()
    (tok / "tokenizer.json").write_text("{}")
    config = {"server": {"base_url": "http://127.0.0.1:9/v1", "model": "mock-model"},
              "generation": {"token_budget": BUDGET, "max_tokens": 256, "concurrency": 8},
              "tokenizer": {"path": "tokenizer", "max_length": 1024},
              "datasets": datasets}
    with open(d / "config.yaml", "w") as f:
        yaml.safe_dump(config, f, sort_keys=False)
    for name, tokens in journals:  # after the config: the status is counted under its settings
        write_journal(d, name, tokens)


def write_journal(d, name, tokens):
    res = d / "results" / name
    res.mkdir(parents=True)
    w = journal.JournalWriter(res / "journal.jsonl", fsync_interval_s=3600)
    per = 100
    for j in range(tokens // per):
        w.append(stamped({"id": f"{name}-{j}",
                  "messages": [{"role": "user", "content": f"question {j}"},
                               {"role": "assistant", "content": "answer " * per}],
                  "finish_reason": "stop", "params": {"model": "mock-model", "max_tokens": 256},
                  "served_model": "mock-model", "created": 0.0, "latency_s": 1.0, "attempts": 1,
                  "usage": {"prompt_tokens": 5, "completion_tokens": per, "total_tokens": per + 5}}))
    w.close()
    here = os.getcwd()
    os.chdir(d)  # the config's paths are relative to the working directory
    try:
        status = compute_status(InferenceSettings.from_config(load_config("config.yaml"), name))
    finally:
        os.chdir(here)
    write_json_atomic(str(res / "budget_status.json"), status)


def job_counts(output):
    """{rule: count} from a dry-run's job stats table."""
    counts, table = {}, False
    for line in output.splitlines():
        parts = line.split()
        if parts[:2] == ["job", "count"]:
            table = True
        elif table and len(parts) == 2 and parts[1].isdigit():
            if parts[0] == "total":
                break
            counts[parts[0]] = int(parts[1])
    return counts


def make_trivial(d, n, counts):
    """A touch-rule workflow with budgetgen's planned jobs: dataset i runs chain rule r iff i is among
    the last counts[r] datasets' worth of that rule (earlier steps' outputs exist already)."""
    d.mkdir(parents=True)
    for rule in CHAIN[:-1]:
        have = counts.get(rule, 0)
        for i in range(n):
            if i >= have:  # this step is done for dataset i: its output exists
                p = d / "t" / rule / f"{i}"
                p.parent.mkdir(parents=True, exist_ok=True)
                p.touch()
    lines = [f"N = {n}", ""]
    lines += ["rule all:", "    input:",
              "        expand('t/tokenize/{i}', i=range(N)),",
              "        expand('t/budget_status/{i}', i=range(N)),",
              "        expand('t/plots/{i}', i=range(N)),",
              "        't/summary',", ""]
    prev = None
    for rule in CHAIN:
        lines += [f"rule {rule}:"]
        if prev:
            lines += ["    input:", f"        't/{prev}/{{i}}',"]
        lines += ["    output:", f"        't/{rule}/{{i}}',", "    shell:", "        'touch {output}'", ""]
        prev = rule
    lines += ["rule plots:", "    input:", "        't/finalize/{i}',", "    output:", "        't/plots/{i}',",
              "    shell:", "        'touch {output}'", "",
              "rule summary:", "    input:", "        expand('t/finalize/{i}', i=range(N)),",
              "        expand('t/tokenize/{i}', i=range(N)),", "    output:", "        't/summary',",
              "    shell:", "        'touch {output}'", ""]
    (d / "Snakefile").write_text("\n".join(lines))


def check_listing(out, n, state):
    """budgetgen's dry-run prints its per-dataset status table: one row per dataset, in the right states."""
    states = [m.group(1) for m in re.finditer(r"^budgetgen: d\d+ .*\s(met|partial|fresh|exhausted)$", out, re.M)]
    want = {"fresh": n} if state == "fresh" else {"met": (n + 2) // 3, "partial": (n + 1) // 3, "fresh": n // 3}
    got = {k: states.count(k) for k in set(states)}
    if got != want:
        raise RuntimeError(f"status table: {got}, expected {want}")


def budgetgen_cmd(d, profile=None):
    pre = [sys.executable] + (["-m", "cProfile", "-o", str(profile)] if profile else [])
    return pre + ["-m", "snakemake", "-s", str(common.REPO / "Snakefile"), "-d", str(d), "--configfile",
                  str(d / "config.yaml"), "-n", "all"]


def trivial_cmd(d):
    return [sys.executable, "-m", "snakemake", "-s", str(d / "Snakefile"), "-d", str(d), "-n", "all"]


def children_cpu():
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def dry_run(cmd):
    """(wall s, CPU s of the snakemake process, its output)."""
    t0, c0 = time.perf_counter(), children_cpu()
    proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    wall, cpu = time.perf_counter() - t0, children_cpu() - c0
    out = proc.stdout + proc.stderr
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[-8:])} failed ({proc.returncode}):\n{out[-4000:]}")
    return wall, cpu, out


# Where a dry-run's time goes: (label, file suffix, function) whose cumulative time is reported.
PROFILE_BUCKETS = (
    ("Snakefile + rules/*.smk parsed, config checked and validated", str(common.REPO / "Snakefile"), "<module>"),
    ("DAG built (all of it)", "snakemake/workflow.py", "_build_dag"),
    ("  checkpoint handling (update_checkpoint_dependencies)", "snakemake/dag.py", "update_checkpoint_dependencies"),
    ("  `script:` rules: script source looked up per job", "snakemake/dag.py", "process_job"),
    ("  params evaluated per job (lambdas + Snakemake)", "snakemake/rules.py", "expand_params"),
    ("  input functions evaluated", "snakemake/rules.py", "apply_input_function"),
    ("jobs printed (dry-run listing)", "snakemake/jobs.py", "log_info"),
)


def profile_summary(prof_path, total):
    """Where a profiled dry-run spends its time: the buckets above, and the rules/*.smk functions."""
    st = pstats.Stats(str(prof_path))
    cum = {}
    smk = []
    for (filename, line, func), (_, _, _, ct, _) in st.stats.items():
        for label, suffix, name in PROFILE_BUCKETS:
            if filename.endswith(suffix) and func == name:
                cum[label] = cum.get(label, 0.0) + ct
        if filename.endswith(".smk") and func != "<module>":
            smk.append((ct, f"{Path(filename).name}:{line} {func}"))
    smk.sort(reverse=True)
    whole = max(ct for (_, _, _, ct, _) in st.stats.values())
    out = [f"profiled run {total:.1f} s wall (cProfile slows Python ~2x; shares are of the profiled "
           f"{whole:.1f} s)"]
    out += ["; ".join(f"{label.strip()} {100 * cum.get(label, 0) / whole:.0f}%" for label, _, _ in PROFILE_BUCKETS)]
    out += ["budgetgen's own functions in rules/*.smk (cumulative, each call counted): " + "; ".join(
        f"{name} {100 * ct / whole:.1f}%" for ct, name in smk[:5])]
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="sizes 8 and 100 only")
    ap.add_argument("--sizes", default=None, help="comma-separated dataset counts (default 8,100,500)")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--profile", action="store_true", help="cProfile budgetgen's largest mix dry-run")
    args = ap.parse_args()
    sizes = [int(s) for s in (args.sizes or ("8,100" if args.quick else "8,100,500")).split(",")]

    rows, notes, worst = [], [], {}
    with tempfile.TemporaryDirectory(prefix="bench_dag.") as tmp:
        tmp = Path(tmp)
        for n in sizes:
            for state in ("fresh", "mix"):
                wd = tmp / f"{state}-{n}"
                make_workdir(wd, n, state)
                tv = tmp / f"trivial-{state}-{n}"
                times, counts = {"budgetgen": [], "trivial": []}, None
                for rep in range(args.reps):
                    pair = [("budgetgen", budgetgen_cmd(wd)), ("trivial", trivial_cmd(tv))]
                    for name, cmd in (pair if rep % 2 == 0 else pair[::-1]):
                        wall, cpu, out = dry_run(cmd)
                        times[name].append((wall, cpu))
                        if counts is None:  # budgetgen's first run: what the trivial workflow must plan
                            counts = job_counts(out)
                            check_listing(out, n, state)
                            make_trivial(tv, n, counts)
                        elif name == "trivial" and job_counts(out) != counts:
                            raise RuntimeError(f"trivial workflow plans {job_counts(out)}, budgetgen {counts}")
                (b, bc), (t, tc) = [(common.median([w for w, _ in times[k]]), common.median([c for _, c in times[k]]))
                                    for k in ("budgetgen", "trivial")]
                print(f"  {n} datasets, {state}: budgetgen {b:.2f} s ({bc:.2f} s CPU), trivial {t:.2f} s "
                      f"({tc:.2f} s CPU), {sum(counts.values())} jobs", file=sys.stderr, flush=True)
                rows.append([n, state, sum(counts.values()), f"{b:.2f}", f"{bc:.2f}", f"{t:.2f}", f"{tc:.2f}",
                             f"{bc / tc:.2f}x", f"{bc - tc:+.2f}", "yes" if max(b, bc) <= GOAL_S else
                             ("CPU yes, wall NO" if bc <= GOAL_S else "NO")])
                worst[(n, state)] = (b, bc)
        largest = max(sizes)
        state = max(("fresh", "mix"), key=lambda st: max(worst[(largest, st)]))
        if args.profile or (largest >= 500 and max(worst[(largest, state)]) > GOAL_S):
            prof = tmp / "dag.prof"
            wall, _, _ = dry_run(budgetgen_cmd(tmp / f"{state}-{largest}", profile=prof))
            notes += [f"profile ({largest} datasets, {state}): " + line for line in profile_summary(prof, wall)]

    big = {k: v for k, v in worst.items() if k[0] >= 500}
    verdict = ", ".join(f"{n} {s}: {w:.1f} s wall, {c:.1f} s CPU" for (n, s), (w, c) in big.items())
    met_cpu, met_wall = all(c <= GOAL_S for _, c in big.values()), all(w <= GOAL_S for w, _ in big.values())
    notes = [
        f"a whole `python -m snakemake -n all` process each (startup included, as a user sees it): wall time and "
        f"its CPU seconds (user + system; what the wall time is on an idle core, and not skewed by other load); "
        f"medians of {args.reps} runs; {len(os.sched_getaffinity(0))} CPU cores, load average "
        f"{os.getloadavg()[0]:.1f} at the end. Ratio and overhead: CPU seconds.",
        "mix = 1/3 met (journal over the budget + checkpoint output), 1/3 partial (half the budget + "
        "checkpoint output), 1/3 fresh; trivial = touch rules with the same jobs and edges.",
        (f"goal: <= {GOAL_S:g} s at 500 datasets: " + ("met" if met_cpu and met_wall else
                                                      "met in CPU time, missed in wall time on this loaded machine"
                                                      if met_cpu else "missed") + f" ({verdict}).")
        if big else f"goal: <= {GOAL_S:g} s at 500 datasets: not run (sizes {sizes}).",
    ] + notes
    common.report("dag", "DAG: `snakemake -n all` wall time (budgetgen vs a trivial workflow with the same jobs)",
                  ["datasets", "state", "jobs", "budgetgen wall s", "budgetgen CPU s", "trivial wall s",
                   "trivial CPU s", "ratio", "overhead s", f"<= {GOAL_S:g} s"], rows, notes)


if __name__ == "__main__":
    main()
