"""Settings changed between real snakemake runs, as users change them: a budget raised or prompts added
on a finished dataset and the resumed run interrupted (Ctrl-C, preemption, the server unreachable),
a user's own --configfile next to the bundled config, a configured concurrency against the server_slots
resource. Each must end in the data the current settings ask for, or in a non-zero exit: never exit 0
with a dataset short of its budget."""

import json
import os
import re
import signal
import subprocess
import sys

import pytest
import yaml

from support import REPO
from support.workflow import LISTING, Workflow, base_config, planned_inference, wait_for, write_prompts

pytestmark = pytest.mark.slow


def journal_tokens(wf, name="F"):
    return sum(r["usage"]["completion_tokens"] for r in wf.records(name))


def status_row(output, name="F"):
    """(tokens, state) of the DAG-time status table's row for the dataset."""
    m = re.search(rf"^budgetgen: {name}\s+(\d+)\s+(\d+)\s+(\d+)\s+(\d+)\s+(.+)$", output, re.M)
    assert m, output[-3000:]
    return int(m.group(1)), m.group(5).strip()


@pytest.mark.parametrize("change,interruption", [("budget", "ctrl-c"), ("budget", "unreachable"),
                                                 ("prompts", "preemption")])
def test_changed_settings_then_an_interrupted_run_never_leave_a_finished_looking_dataset(
        tmp_path, server, tiny_tokenizer, change, interruption):
    """Item 1 (and 12, 13): the interrupted job's new params are recorded by Snakemake; the old done
    marker must not satisfy the DAG. The next `-n` plans inference and shows the journal's count, the
    next run completes the dataset under the new settings, and the log keeps every run's lines."""
    from budgetgen_testkit import mock_server

    srv = server("--mean-tokens", "20", "--tokens-per-s", "100")
    wd = tmp_path / "work"
    prompts = write_prompts(wd / "prompts" / "F.jsonl", 30 if change == "prompts" else 600, prefix="F")
    budget = 10**6 if change == "prompts" else 300
    wf = Workflow(wd, base_config(srv.base_url, tiny_tokenizer, {"F": {"prompts": "prompts/F.jsonl"}},
                                  token_budget=budget))
    wf.run("--cores", "2", "all")
    done = json.loads(wf.path("results", "F", "inference.done").read_text())
    assert done["state"] == ("exhausted" if change == "prompts" else "met")
    before = journal_tokens(wf)

    if change == "budget":
        wf.config["generation"]["token_budget"] = new_budget = 8000
        wf.write_config()
    else:
        new_budget = 10**6
        with open(prompts, "a") as f:  # 600 more prompts
            f.writelines(json.dumps({"prompt": f"G question number {i}: more"}) + "\n" for i in range(600))

    if interruption == "unreachable":
        mock_server.stop(srv)
        p = wf.run("--cores", "2", "all", check=False)
        assert p.returncode != 0 and "server unreachable" in wf.path("logs", "inference", "F.log").read_text()
    else:
        proc = wf.start("--cores", "2", "all")
        try:
            wait_for(lambda: len(wf.journal_lines("F")) >= len(wf.records("F")) and journal_tokens(wf) > before + 100,
                     timeout=120, what="the resumed run to journal new responses")
            os.killpg(proc.pid, signal.SIGINT if interruption == "ctrl-c" else signal.SIGTERM)
            assert proc.wait(timeout=60) != 0
        finally:
            if proc.poll() is None:
                wf.killpg(proc)
        partial = journal_tokens(wf)
        assert before < partial < new_budget  # the premise: interrupted short of the new budget
        mock_server.stop(srv)
    assert not wf.path("results", "F", "inference.done").exists()

    dry = wf.run("-n", "all")
    (tmp_path / "dry.txt").write_text(dry.output)
    assert "F" in planned_inference(dry.output), dry.output[-3000:]
    tokens, state = status_row(dry.output)
    assert tokens == journal_tokens(wf) and state == "partial", dry.output[-3000:]  # the journal's count now

    back = server("--mean-tokens", "20", "--port", str(srv.port))
    assert back.base_url == srv.base_url
    wf.run("--cores", "2", "all")
    if change == "budget":
        assert journal_tokens(wf) >= new_budget
    else:
        assert len(wf.records("F")) == 630  # every prompt, old and added
    summary = wf.path("results", "summary.tsv").read_text().splitlines()
    row = dict(zip(summary[0].split("\t"), summary[1].split("\t")))
    assert row["status"] == ("met" if change == "budget" else "exhausted")
    log = wf.path("logs", "inference", "F.log").read_text()
    assert log.count("===== inference run started") == 3  # item 13: every run's lines, appended
    if interruption == "ctrl-c":
        assert "SIGINT received" in log
    elif interruption == "preemption":
        assert "SIGTERM received" in log


def test_a_user_configfile_stands_alone_next_to_the_bundled_config(tmp_path, server, tiny_tokenizer):
    """Item 3: --configfile my.yaml in a directory with a config.yaml: only my.yaml's datasets run, and
    what my.yaml omits takes the schema default, not the other file's value."""
    srv = server("--mean-tokens", "5")
    wd = tmp_path / "work"
    write_prompts(wd / "prompts" / "X.jsonl", 3, prefix="X")
    write_prompts(wd / "prompts" / "Y.jsonl", 3, prefix="Y")
    demo = base_config(srv.base_url, tiny_tokenizer, {"X": {"prompts": "prompts/X.jsonl"}},
                       max_tokens=512, temperature=0.7, concurrency=16)
    (wd / "config.yaml").write_text(yaml.safe_dump(demo))
    mine = {"server": {"base_url": srv.base_url, "model": "mock-model"},
            "generation": {"token_budget": 10**6},
            "tokenizer": {"path": str(tiny_tokenizer)},
            "datasets": {"Y": {"prompts": "prompts/Y.jsonl"}}}
    (wd / "my.yaml").write_text(yaml.safe_dump(mine))
    cmd = [sys.executable, "-m", "snakemake", "-s", str(REPO / "Snakefile"), "-d", str(wd),
           "--configfile", str(wd / "my.yaml")]
    dry = subprocess.run(cmd + ["-n", "all", *LISTING], capture_output=True, text=True, timeout=120)
    assert dry.returncode == 0, dry.stderr[-3000:]
    assert planned_inference(dry.stdout + dry.stderr) == {"Y"}
    run = subprocess.run(cmd + ["--cores", "1", "results/Y/inference.done"], capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == 0, (run.stdout + run.stderr)[-3000:]
    params = {json.dumps(json.loads(x)["params"], sort_keys=True)
              for x in (wd / "results" / "Y" / "journal.jsonl").read_text().splitlines()}
    assert params == {json.dumps({"max_tokens": 4096, "model": "mock-model"}, sort_keys=True)}
    assert "dispatching up to 64 at once" in (wd / "logs" / "inference" / "Y.log").read_text()


def test_configured_concurrency_is_honoured_or_the_cap_is_said(tmp_path, server, tiny_tokenizer):
    """Item 4: no profile caps server_slots (the default profile capped 150 to 64 silently); an explicit
    --resources server_slots below the concurrency is said in the log."""
    srv = server("--mean-tokens", "5")
    wd = tmp_path / "work"
    write_prompts(wd / "prompts" / "C.jsonl", 5, prefix="C")
    datasets = {"C": {"prompts": "prompts/C.jsonl"}, "D": {"prompts": "prompts/C.jsonl", "concurrency": 151}}
    wf = Workflow(wd, base_config(srv.base_url, tiny_tokenizer, datasets, token_budget=10**6, concurrency=150))
    wf.run("--cores", "1", "results/C/inference.done")
    log = wf.path("logs", "inference", "C.log").read_text()
    assert "dispatching up to 150 at once" in log and "capped" not in log
    wf.run("--cores", "1", "results/D/inference.done", "--resources", "server_slots=5")
    log = wf.path("logs", "inference", "D.log").read_text()
    assert "concurrency 151 (generation.concurrency) capped to 5 by Snakemake's server_slots resource" in log
    assert "dispatching up to 5 at once" in log
