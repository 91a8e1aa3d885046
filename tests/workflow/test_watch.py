"""Watching a run: the compact per-dataset progress lines each inference job writes to the run's terminal,
and scripts/watch.py, the read-only view of a working directory, on a live run (a real snakemake holding
its lock, a real mock server) and on a finished one (the same figures as summary.tsv), through a torn
journal tail and a journal replaced under it; piped (plain text, no escape sequences) from another
folder with -d, and the one-line hint when no config is found."""

import csv
import io
import os
import re
import shutil
import signal
import subprocess
import sys

import pytest

from budgetgen.progress import TERMINAL_LINE
from support import REPO
from support.workflow import Workflow, base_config, wait_for, write_prompts

pytestmark = pytest.mark.slow

WATCH = [sys.executable, str(REPO / "scripts" / "watch.py")]


def two_datasets(tmp_path, srv, tokenizer, budgets, n=60, **server):
    d = tmp_path / "work"
    for ds in budgets:
        write_prompts(d / "prompts" / f"{ds}.jsonl", n, prefix=ds)
    cfg = base_config(srv.base_url, tokenizer, {ds: {"prompts": f"prompts/{ds}.jsonl", "token_budget": b}
                                                 for ds, b in budgets.items()}, concurrency=4)
    cfg["server"].update(server)
    return Workflow(d, cfg)


def journal_tokens(wf, ds):
    return sum(r["usage"]["completion_tokens"] for r in wf.records(ds))


def watch_tsv(wf):
    p = subprocess.run(WATCH + ["-d", str(wf.dir), "--once", "--tsv"], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0 and not p.stderr, p.stdout + p.stderr
    return {r["dataset"]: r for r in csv.DictReader(io.StringIO(p.stdout), delimiter="\t")}


def test_the_runs_terminal_holds_a_progress_line_per_dataset(tmp_path, server, tiny_tokenizer):
    srv = server("--mean-tokens", "20", "--tokens-per-s", "100")
    wf = two_datasets(tmp_path, srv, tiny_tokenizer, {"A": 600, "B": 400}, terminal_progress_interval_s=0.5)
    p = wf.run("--cores", "2", "all")
    lines = {}
    for line in p.stderr.splitlines():
        m = re.match(TERMINAL_LINE, line)
        if m:
            lines.setdefault(m["dataset"], []).append(m)
    assert set(lines) == {"A", "B"}, p.stderr[-3000:]
    for ds, found in lines.items():
        states = [m["state"] for m in found]
        assert states[0] == "started" and states[-1] == "done: met" and "running" in states, states
        last = found[-1]
        assert int(last["tokens"].replace(",", "")) == journal_tokens(wf, ds)
        assert int(last["budget"].replace(",", "")) == (600 if ds == "A" else 400)
    # the full lines stay in the log, not on the terminal
    assert "progress: " in wf.path("logs", "inference", "A.log").read_text() and "progress: " not in p.stderr


def test_watch_once_on_a_live_run_then_a_finished_one(tmp_path, server, tiny_tokenizer):
    srv = server("--mean-tokens", "20", "--tokens-per-s", "50")
    wf = two_datasets(tmp_path, srv, tiny_tokenizer, {"A": 3000, "B": 2000}, request_timeout_s=120,
                      unreachable_deadline_s=120)
    proc = wf.start("--cores", "2", "all")
    locks = wf.path(".snakemake", "locks")
    try:
        wait_for(lambda: all(len(wf.journal_lines(ds)) >= 2 for ds in "AB"), timeout=120,
                 what="both datasets to journal responses")
        os.kill(srv.pid, signal.SIGSTOP)  # the server stalls: the journals stop growing, the run goes on
        try:
            sizes = {}

            def stable():
                now = {ds: wf.path("results", ds, "journal.jsonl").stat().st_size for ds in "AB"}
                same = now == sizes.get("last")
                sizes["last"] = now
                return same

            wait_for(stable, timeout=30, interval=1.5, what="the journals to stop growing")
            before = {ds: journal_tokens(wf, ds) for ds in "AB"}
            responses = {ds: len(wf.records(ds)) for ds in "AB"}  # read while stalled: the server goes on after
            assert proc.poll() is None and any(locks.iterdir())  # the premise: snakemake holds its lock
            got = watch_tsv(wf)
            table = subprocess.run(WATCH + ["-d", str(wf.dir), "--once"], capture_output=True, text=True,
                                   timeout=60, env={**os.environ, "COLUMNS": "160"})
            assert {ds: journal_tokens(wf, ds) for ds in "AB"} == before  # the premise still holds
            assert proc.poll() is None and any(locks.iterdir())
        finally:
            os.kill(srv.pid, signal.SIGCONT)
        for ds in "AB":
            assert int(got[ds]["tokens"]) == before[ds] and got[ds]["state"] == "partial", got[ds]
            assert int(got[ds]["responses"]) == responses[ds]
        assert int(got["TOTAL"]["tokens"]) == sum(before.values())
        assert table.returncode == 0 and plain_rows(table.stdout) == {"A": "partial", "B": "partial"}, (
            table.stdout + table.stderr)
        assert "total" in table.stdout and "tokens left" in table.stdout
        assert proc.wait(timeout=300) == 0
    finally:
        if proc.poll() is None:
            wf.killpg(proc)

    # finished: the same figures as summary.tsv
    got = watch_tsv(wf)
    with open(wf.path("results", "summary.tsv")) as f:
        summary = {r["dataset"]: r for r in csv.DictReader(f, delimiter="\t")}
    for ds in "AB":
        w, s = got[ds], summary[ds]
        assert (w["tokens"], w["responses"], w["budget"], w["budget_pct"], w["state"], w["errors"]) == (
            s["completion_tokens"], s["responses"], s["token_budget"], s["budget_pct"], s["status"], s["errors"])

    # a torn tail (a record a crash cut) is not read; a journal replaced under the watcher is read anew
    journal = wf.path("results", "A", "journal.jsonl")
    with open(journal, "a") as f:
        f.write('{"id": "A-torn", "identity": "0123", "messages": [{"role": "us')
    assert watch_tsv(wf)["A"]["tokens"] == got["A"]["tokens"]
    copy = journal.with_suffix(".copy")
    shutil.copy(journal, copy)
    os.replace(copy, journal)
    assert watch_tsv(wf)["A"]["tokens"] == got["A"]["tokens"]


def test_watch_help_and_a_missing_folder():
    assert subprocess.run(WATCH + ["--help"], capture_output=True, text=True).returncode == 0
    p = subprocess.run(WATCH + ["-d", "/nonexistent/run", "--once"], capture_output=True, text=True)
    assert p.returncode == 2 and p.stderr.strip() == "error: --directory /nonexistent/run: no such folder"


def plain_rows(text):
    """{dataset: state} of format_plain's table (a row: name, [bar], tokens / budget, %, state, ...)."""
    rows = {}
    for line in text.splitlines():
        m = re.match(r"(\S+)\s+\[[#-]{20}\]\s+[\d,]+ / [\d,]+\s+[\d.]+\s+(\S+)\s", line)
        if m:
            rows[m[1]] = m[2]
    return rows


def test_watch_once_piped_from_another_folder_prints_every_dataset_as_plain_text(tmp_path, server, tiny_tokenizer):
    srv = server("--mean-tokens", "20")
    d = tmp_path / "work"
    write_prompts(d / "prompts" / "A.jsonl", 60, prefix="A")
    write_prompts(d / "prompts" / "B.jsonl", 4, prefix="B")  # too few prompts for its budget: exhausted
    wf = Workflow(d, base_config(srv.base_url, tiny_tokenizer, {"A": {"prompts": "prompts/A.jsonl",
                                                                      "token_budget": 300},
                                                             "B": {"prompts": "prompts/B.jsonl",
                                                                   "token_budget": 100000}}))
    wf.run("--cores", "2", "all")
    with open(wf.path("results", "summary.tsv")) as f:
        summary = {r["dataset"]: r["status"] for r in csv.DictReader(f, delimiter="\t")
                   if r.get("cell", "all") == "all"}
    assert summary == {"A": "met", "B": "exhausted"}
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    shutil.copy(wf.path("config.yaml"), wf.path("other.yaml"))
    env = {**os.environ, "FORCE_COLOR": "1", "TERM": "xterm-256color"}  # rich would colour a pipe under these
    shutil.copy(wf.path("config.yaml"), elsewhere / "mine.yaml")
    # --config read as snakemake reads --configfile: relative to the current folder, not to -d
    for extra in ([], ["--config", "mine.yaml"], ["--config", str(wf.path("other.yaml"))]):
        p = subprocess.run(WATCH + ["--once", "-d", str(wf.dir), *extra], cwd=elsewhere, capture_output=True,
                           text=True, timeout=60, env=env)
        assert p.returncode == 0 and not p.stderr, p.stdout + p.stderr
        assert "\x1b" not in p.stdout and p.stdout.isascii(), repr(p.stdout)
        assert p.stdout.splitlines()[0] == f"budgetgen {wf.dir}"
        assert plain_rows(p.stdout) == summary, p.stdout
        assert re.search(r"^total\s.*tokens left", p.stdout, re.M), p.stdout

    # without --once, off a terminal: a plain table appended every interval, Ctrl-C leaves with 0
    live = subprocess.Popen(WATCH + ["-d", str(wf.dir), "--interval", "0.2"], cwd=elsewhere, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)
    try:
        lines = [live.stdout.readline() for _ in range(2 * (len(summary) + 5))]
        live.send_signal(signal.SIGINT)
        out, err = live.communicate(timeout=30)
    finally:
        if live.poll() is None:
            live.kill()
    text = "".join(lines) + out
    assert live.returncode == 0 and not err, err
    assert "\x1b" not in text and sum(line.startswith(f"budgetgen {wf.dir}  ") for line in text.splitlines()) >= 2
    assert plain_rows(text) == summary


def test_watch_without_a_config_says_where_it_looked_in_one_line(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    p = subprocess.run(WATCH + ["--once"], cwd=empty, capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and not p.stdout and len(p.stderr.splitlines()) == 1, p.stdout + p.stderr
    assert p.stderr.startswith(f"error: no config file in {empty} (tried {empty / 'config.yaml'}, "
                               f"{empty / 'config' / 'config.yaml'})"), p.stderr
    assert "-d DIR" in p.stderr and "--config FILE" in p.stderr
    (empty / "my.yaml").write_text("{}\n")  # in -d, where snakemake would not look for --configfile my.yaml
    p = subprocess.run(WATCH + ["-d", str(empty), "--config", "my.yaml"], cwd=tmp_path, capture_output=True, text=True,
                       timeout=60)
    assert p.returncode == 2 and len(p.stderr.splitlines()) == 1, p.stderr
    assert p.stderr.startswith(f"error: --config my.yaml: no such file (tried {tmp_path / 'my.yaml'}); "
                               f"{empty / 'my.yaml'} exists in -d, but snakemake reads --configfile from the "
                               "current folder"), p.stderr
