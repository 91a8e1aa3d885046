"""Issue 29: a production run as its first user runs it (many datasets, an existing server, days): one
failed dataset never stops the others and its cause comes last; a failed rerun leaves nothing that
looks finished; budget_status.json states the journal's real tokens; what each inference job asks a
cluster for follows the server mode and is said before anything runs."""

import json
import os
import re
import subprocess
import sys

import pytest

from support import REPO
from support.workflow import Workflow, base_config, write_prompts

pytestmark = pytest.mark.slow

FAILED = re.compile(r"^budgetgen: FAILED (\S+) (\S+): (.*) \(log: (\S+)\)$", re.M)


def make(path, srv, tokenizer, prompts, datasets=None, **gen):
    for name, n in prompts.items():
        write_prompts(path / "prompts" / f"{name}.jsonl", n, prefix=name)
    ds = {name: {"prompts": f"prompts/{name}.jsonl", **((datasets or {}).get(name) or {})} for name in prompts}
    return Workflow(path, base_config(srv.base_url, tokenizer, ds, **gen))


def journal_tokens(wf, dataset):
    return sum(r["usage"]["completion_tokens"] for r in wf.records(dataset))


def test_one_failed_dataset_never_stops_the_others_and_its_cause_comes_last(tmp_path, server, tiny_tokenizer):
    # BAD asks for more than the server's context: every request is refused (HTTP 400), a permanent error
    srv = server("--context-limit", "1000", "--mean-tokens", "20")
    wf = make(tmp_path, srv, tiny_tokenizer, {"OK": 6, "BAD": 6}, {"BAD": {"max_tokens": 4000}},
              token_budget=10**6, max_tokens=64)
    proc = wf.run("--cores", "2", "all", check=False)
    assert proc.returncode != 0
    # the other dataset finished all the way (keep-going: true in profiles/default)
    assert wf.path("results", "OK", "tokenized.arrow").is_file()
    assert not wf.path("results", "BAD", "inference.done").exists()
    failed = FAILED.findall(proc.output)
    assert [(rule, ds) for rule, ds, _, _ in failed] == [("inference", "BAD")], proc.output[-3000:]
    _, _, cause, log = failed[0]
    assert "no response from the server for any prompt" in cause and "maximum context length" in cause
    assert log == "logs/inference/BAD.last.log" and wf.path(log).is_file()
    # the cause is among the run's last lines, after every job's output (Snakemake's own 4 lines follow)
    tail = proc.output.strip().splitlines()[-8:]
    assert any(line.startswith("budgetgen: FAILED inference BAD: ") for line in tail), tail
    assert any("1 job(s) failed" in line and "keep-going" in line for line in tail), tail
    # a rerun that succeeds leaves no record of the earlier failure
    wf.config["datasets"]["BAD"]["max_tokens"] = 64
    wf.write_config()
    again = wf.run("--cores", "2", "all")
    assert "budgetgen: FAILED" not in again.output


def test_a_failed_rerun_leaves_nothing_that_looks_finished(tmp_path, server, tiny_tokenizer):
    srv = server("--mean-tokens", "30")
    wf = make(tmp_path, srv, tiny_tokenizer, {"D": 60, "E": 4}, token_budget=300)
    wf.run("--cores", "2", "all")
    status = json.loads(wf.path("results", "D", "budget_status.json").read_text())
    # the checkpoint wrote it before the journal existed; the job rewrote it as it ended
    assert status["tokens"] == journal_tokens(wf, "D") >= 300 and status["responses"] == len(wf.records("D"))
    finished = [wf.path("results", "D", name) for name in ("inference.done", "raw_responses.jsonl",
                                                          "tokenized.arrow", "plots")]
    finished.append(wf.path("results", "summary.tsv"))
    assert all(p.exists() for p in finished)
    # a raised budget against a server that is gone: the rerun fails
    wf.config["datasets"]["D"]["token_budget"] = 5000
    wf.config["server"].update(base_url="http://127.0.0.1:9/v1", unreachable_deadline_s=1, startup_wait_s=0)
    wf.write_config()
    proc = wf.run("--cores", "2", "all", check=False)
    assert proc.returncode != 0 and "budgetgen: FAILED inference D: server unreachable" in proc.output
    assert [p for p in finished if p.exists()] == []
    assert wf.path("results", "E", "tokenized.arrow").is_file()  # E met: not touched
    assert journal_tokens(wf, "D") == status["tokens"]  # the journal is never touched
    again = json.loads(wf.path("results", "D", "budget_status.json").read_text())
    assert again["tokens"] == status["tokens"]
    dry = wf.run("-n", "all")
    assert re.search(r"^budgetgen: D\s+\d+\s+5000\s+\d+\s+\d+\s+partial$", dry.output, re.M), dry.output[-3000:]


def test_the_dry_run_says_what_each_inference_job_asks_the_cluster_for(tmp_path, server, tiny_tokenizer):
    srv = server()
    wf = make(tmp_path, srv, tiny_tokenizer, {"A": 3})
    dry = wf.run("-n", "all")
    assert ("budgetgen: inference jobs ask the cluster for: 1 CPU, 4000 MB, no GPU (each is an HTTP client of "
            f"{srv.base_url})") in dry.output
    del wf.config["server"]["base_url"]
    wf.config["server"].update(launch="python -m sglang.launch_server --model-path {model_path} --port {port} "
                                      "--tp 4 --dp-size 2", model_path=str(tmp_path / "weights"),
                               launch_resources={"mem_mb": 512000, "slurm_partition": "gpu-h100"})
    wf.write_config()
    dry = wf.run("-n", "all")
    line = next(x for x in dry.output.splitlines() if "inference jobs ask the cluster for" in x)
    assert "16 CPU, 512000 MB, gres gpu:8, partition gpu-h100" in line and "launches its server" in line, line


def test_a_config_file_outside_the_working_directory_and_its_relative_paths(tmp_path, server, tiny_tokenizer):
    """Run from elsewhere: --configfile is read from the current directory (Snakemake's rule), every path
    inside it from -d; a path that exists beside the config file instead is named in the one line."""
    srv = server()
    mine = tmp_path / "mine"
    write_prompts(mine / "prompts" / "A.jsonl", 3, prefix="A")
    config = base_config(srv.base_url, tiny_tokenizer, {"A": {"prompts": "prompts/A.jsonl"}})
    (mine / "my.yaml").write_text(json.dumps(config))
    work = tmp_path / "work"
    work.mkdir()
    cmd = [sys.executable, "-m", "snakemake", "-s", str(REPO / "Snakefile"), "-d", "work", "--configfile",
           "mine/my.yaml", "-n", "all"]
    p = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=120, env=os.environ)
    out = p.stdout + p.stderr
    assert p.returncode != 0 and "Traceback" not in out, out[-3000:]
    assert (f"config key datasets.A.prompts: file not found: prompts/A.jsonl (relative paths in the config are read "
            f"from the working directory {work}, snakemake -d; it exists in {mine}, beside the config file: give it "
            f"as {mine / 'prompts' / 'A.jsonl'})") in out.splitlines(), out[-3000:]
    config["datasets"]["A"]["prompts"] = str(mine / "prompts" / "A.jsonl")
    (mine / "my.yaml").write_text(json.dumps(config))
    p = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=120, env=os.environ)
    assert p.returncode == 0, (p.stdout + p.stderr)[-3000:]
    # --unlock takes the same -s/-d/--configfile as the run (README, Troubleshooting)
    unlock = subprocess.run(cmd[:-2] + ["--unlock"], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert unlock.returncode == 0 and "Unlocked working directory" in unlock.stdout + unlock.stderr
