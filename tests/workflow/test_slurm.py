"""The workflow through SLURM (snakemake-executor-plugin-slurm) on a real one-node cluster.

The cluster is tests/slurm/cluster.sh's (started by .ci/run, which then sets BUDGETGEN_SLURM=1). Without \
BUDGETGEN_SLURM=1 the cluster tests are skipped; the dry-runs of the two profiles
need only the plugin and always run. Every snakemake run is wrapped in `timeout -k`: a SLURM status
query that never sees a job finish would otherwise hang for ever (see tests/slurm/profile).
"""

import json
import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest
import yaml
from datasets import Dataset

from support import REPO
from support.workflow import Workflow, base_config, planned_inference, wait_for, write_prompts

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("slurm")]  # one node: its jobs one test at a time

SLURM_PROFILE = REPO / "profiles" / "slurm"
TEST_PROFILE = REPO / "tests" / "slurm" / "profile"
CLUSTER_SH = REPO / "tests" / "slurm" / "cluster.sh"
SUBMITTED = re.compile(r"Job \d+ has been submitted with SLURM jobid (\d+) \(log: (\S+)\)\.")

needs_cluster = pytest.mark.skipif(
    os.environ.get("BUDGETGEN_SLURM") != "1" or shutil.which("sbatch") is None,
    reason="no SLURM cluster: run `tests/slurm/cluster.sh start` (root) and set BUDGETGEN_SLURM=1, "
    "as .ci/run does",
)


def guarded(wf, *args, limit):
    """snakemake under `timeout -k 30 LIMIT`, never unguarded."""
    return ["timeout", "-k", "30", str(limit), *wf.cmd(*args)]


def slurm_run(wf, *args, limit=300, check=True):
    proc = subprocess.run(guarded(wf, "--profile", str(TEST_PROFILE), *args, limit=limit), capture_output=True,
                          text=True, timeout=limit + 60)
    proc.output = proc.stdout + proc.stderr
    assert proc.returncode != 124, f"snakemake through SLURM timed out after {limit} s:\n{proc.output[-6000:]}"
    if check and proc.returncode != 0:
        raise AssertionError(f"snakemake via SLURM failed ({proc.returncode}):\n{proc.output[-6000:]}")
    return proc


def submissions(output):
    """{rule: [(slurm job id, log path)]} from the plugin's 'submitted with SLURM jobid' lines."""
    out = {}
    for jobid, log in SUBMITTED.findall(output):
        rule = re.search(r"/rule_([^/]+)/", log).group(1)
        out.setdefault(rule, []).append((jobid, Path(log)))
    return out


def squeue_states(jobids):
    """{jobid: state} as the controller still remembers them (MinJobAge=300 s)."""
    out = subprocess.run(["squeue", "--states=all", "-h", "-o", "%i|%T", "-j", ",".join(jobids)],
                         capture_output=True, text=True, timeout=30, check=True).stdout
    return dict(line.split("|") for line in out.split())


def scontrol_job(jobid):
    out = subprocess.run(["scontrol", "show", "job", jobid], capture_output=True, text=True,
                         timeout=30, check=True).stdout
    return dict(kv.split("=", 1) for kv in out.split() if "=" in kv)


def make(path, srv, tokenizer, prompts, **gen):
    for name, n in prompts.items():
        write_prompts(path / "prompts" / f"{name}.jsonl", n, prefix=name)
    datasets = {name: {"prompts": f"prompts/{name}.jsonl"} for name in prompts}
    return Workflow(path, base_config(srv.base_url, tokenizer, datasets, **gen))


def content(wf, dataset):
    """What the server generated, by id: everything of a record but timing and attempts."""
    recs = wf.records(dataset, "raw_responses.jsonl")
    return {r["id"]: {k: r[k] for k in ("messages", "finish_reason", "usage", "params")} for r in recs}


def test_slurm_profile_dry_run(tmp_path, server, tiny_tokenizer):
    """`snakemake --profile profiles/slurm -n all`: unedited, the placeholder account refuses in one line
    before anything is submitted; copied out of the clone (as docs/cluster.md says) and edited, it plans
    every job with every resource expression evaluated, and says what inference asks for: with
    server.base_url one CPU and no GPU, on the CPU partition (a GPU key in the profile is refused)."""
    srv = server()
    wf = make(tmp_path / "work", srv, tiny_tokenizer, {"A": 3, "B": 3})
    proc = subprocess.run(guarded(wf, "--profile", str(SLURM_PROFILE), "-n", "all", limit=120),
                          capture_output=True, text=True, timeout=180)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "profile key default-resources.slurm_account is the placeholder CHANGE_ME" in out
    assert not SUBMITTED.search(out)
    mine = tmp_path / "home" / ".config" / "snakemake" / "budgetgen"
    shutil.copytree(SLURM_PROFILE, mine)
    text = (mine / "config.yaml").read_text().replace("\"'CHANGE_ME'\"", "\"'my-lab'\"")
    (mine / "config.yaml").write_text(text)
    proc = subprocess.run(guarded(wf, "--profile", str(mine), "-n", "all", limit=120),
                          capture_output=True, text=True, timeout=180)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-6000:]
    assert planned_inference(out) == {"A", "B"}
    # Snakemake's job stats (the quiet profile hides them in a run), where each step runs, and the server
    # the compute nodes cannot reach (a loopback base_url), each in one line
    assert re.search(r"^Job stats:\n(?:.*\n)*?inference\s+2$", out, re.M), out[-3000:]
    assert "budgetgen: on this host, not as cluster jobs: budget_status, finalize, summary, plots" in out
    [loopback] = [line for line in out.splitlines() if line.startswith("warning: server.base_url")]
    assert srv.base_url in loopback and "compute nodes" in loopback
    assert ("inference jobs ask the cluster for: 1 CPU, 4000 MB, no GPU, partition cpu, runtime 1440 * attempt, "
            "account my-lab (each is an HTTP client of") in out, out[-3000:]
    tokenize = re.search(r"^rule tokenize:\n(?:.*\n)*?\s+resources: (.*)$", out, re.M).group(1)
    assert "slurm_partition=cpu" in tokenize and "runtime=120" in tokenize and "gres" not in tokenize
    profile = yaml.safe_load(text)
    inference = profile["set-resources"]["inference"]
    assert profile["executor"] == "slurm" and profile["slurm-requeue"] and profile["retries"] >= 1
    assert profile["keep-going"] is True
    assert (inference["slurm_extra"] == "'--signal=TERM@120'"
            and not set(inference) & {"gres", "mem_mb", "cpus_per_task"})
    assert "cpus_per_task" not in profile["default-resources"]  # it would override every rule's threads
    # profiles/default wins per key over --profile: it must not set what profiles/slurm sets
    default = yaml.safe_load((REPO / "profiles" / "default" / "config.yaml").read_text())
    assert not set(default) & {"default-resources", "set-resources", "executor", "jobs", "retries"}
    # a GPU asked for an HTTP client is refused, naming the key
    (mine / "config.yaml").write_text(text.replace("    runtime: 1440 * attempt", "    gres: \"'gpu:8'\"\n"
                                                   "    runtime: 1440 * attempt"))
    proc = subprocess.run(guarded(wf, "--profile", str(mine), "-n", "all", limit=120),
                          capture_output=True, text=True, timeout=180)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "profile key set-resources.inference.gres asks the cluster for GPUs" in out


def test_test_profile_dry_run(tmp_path, server, tiny_tokenizer):
    srv = server()
    wf = make(tmp_path / "work", srv, tiny_tokenizer, {"A": 3})
    proc = subprocess.run(guarded(wf, "--profile", str(TEST_PROFILE), "-n", "all", limit=120),
                          capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-6000:]
    assert planned_inference(proc.stdout + proc.stderr) == {"A"}


@needs_cluster
def test_workflow_through_slurm_matches_a_local_run(tmp_path, server, tiny_tokenizer):
    srv = server("--length-dist", "lognormal", "--mean-tokens", "30", "--reasoning-share", "0.3")
    prompts = {"A": 12, "B": 8}  # both exhausted (budget 10**6): the same ids whatever the timing
    cluster = make(tmp_path / "slurm", srv, tiny_tokenizer, prompts, token_budget=10**6)
    local = make(tmp_path / "local", srv, tiny_tokenizer, prompts, token_budget=10**6)
    t0 = time.monotonic()
    proc = slurm_run(cluster, "all", "--verbose")  # --verbose: the plugin logs each sbatch call
    elapsed = time.monotonic() - t0
    print(f"SLURM end-to-end: {elapsed:.1f} s")
    jobs = submissions(proc.output)
    # only what needs a node went through sbatch, once per dataset; the light steps ran on the head node
    assert {rule: len(v) for rule, v in jobs.items()} == {"inference": 2, "tokenize": 2}, jobs
    ids = [jobid for v in jobs.values() for jobid, _ in v]
    assert set(squeue_states(ids).values()) == {"COMPLETED"}
    for jobid, log in jobs["inference"]:
        info = scontrol_job(jobid)
        assert info["JobState"] == "COMPLETED" and info["ExitCode"] == "0:0"
        assert Path(info["WorkDir"]) == cluster.dir
        assert log.is_file() and log.parent.parent.name == "rule_inference"
    assert (cluster.dir / "logs" / "slurm" / "rule_inference" / "A").is_dir()
    calls = [line for line in proc.output.splitlines() if "sbatch call:" in line and "rule_inference" in line]
    assert len(calls) == 2 and all("--signal=TERM@120" in c and "-p debug" in c for c in calls), calls
    # an HTTP client of an existing server: a CPU job, no GPU in the request or the job's record
    assert all("gres" not in c and "gpu" not in c.lower() for c in calls), calls
    for jobid, _ in jobs["inference"]:
        info = scontrol_job(jobid)
        assert info["NumCPUs"] == "1" and "gpu" not in info.get("TRES", "") + info.get("TresPerNode", ""), info
    local.run("--cores", "2", "all")
    for name, n in prompts.items():
        via_slurm, here = content(cluster, name), content(local, name)
        assert len(via_slurm) == n and via_slurm == here
        a = Dataset.from_file(str(cluster.path("results", name, "tokenized.arrow")))
        b = Dataset.from_file(str(local.path("results", name, "tokenized.arrow")))
        assert sorted(zip(a["id"], a["input_ids"])) == sorted(zip(b["id"], b["input_ids"]))
    assert cluster.path("results", "summary.tsv").read_text() == local.path("results", "summary.tsv").read_text()
    assert "Nothing to be done" in slurm_run(cluster, "-n", "all").output


@needs_cluster
def test_scancel_mid_inference_then_the_next_run_resumes(tmp_path, server, tiny_tokenizer):
    srv = server("--mean-tokens", "40", "--tokens-per-s", "40")
    wf = make(tmp_path / "work", srv, tiny_tokenizer, {"K": 200}, token_budget=1200, concurrency=4)
    target = "results/K/raw_responses.jsonl"
    log = open(wf.dir / "snakemake.out", "w")
    proc = subprocess.Popen(guarded(wf, "--profile", str(TEST_PROFILE), target, limit=300), stdout=log,
                            stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_for(lambda: "rule_inference" in (wf.dir / "snakemake.out").read_text(), timeout=120,
                 what="the inference job's submission")
        [(jobid, _)] = submissions((wf.dir / "snakemake.out").read_text())["inference"]
        wait_for(lambda: len(wf.journal_lines("K")) >= 4, timeout=120, what="4 journaled responses")
        # the server frozen first, so the job cannot meet its budget before the cancel reaches it
        # (however long scancel takes on a loaded machine); continued once the run has ended
        os.kill(srv.pid, signal.SIGSTOP)
        subprocess.run(["scancel", jobid], check=True, timeout=60)
        rc = proc.wait(timeout=240)
    finally:
        os.kill(srv.pid, signal.SIGCONT)
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    out = (wf.dir / "snakemake.out").read_text()
    assert rc not in (0, 124, 137), out[-6000:]
    # the cause comes last: the job's own line, read on the head node
    assert re.search(r"^budgetgen: FAILED inference K: stopped by SIGTERM .* journal flushed; rerun to resume "
                     r"\(log: logs/inference/K.last.log\)$", out, re.M), out[-6000:]
    wait_for(lambda: squeue_states([jobid]).get(jobid) == "CANCELLED", timeout=60, what="state CANCELLED")
    before = wf.journal_lines("K")
    assert before and not wf.path("results", "K", "inference.done").exists()
    inference_log = wf.path("logs", "inference", "K.log").read_text()
    assert "SIGTERM received" in inference_log, inference_log[-3000:]
    assert len({json.loads(line)["id"] for line in before}) == len(before)
    tokens_before = sum(json.loads(line)["usage"]["completion_tokens"] for line in before)
    assert tokens_before < 1200
    # the next run resumes: the journal's records stay as they were, nothing twice, budget met
    resumed = slurm_run(wf, target)
    [(second, _)] = submissions(resumed.output)["inference"]
    assert second != jobid
    after = wf.records("K")
    assert [json.dumps(r) for r in after[: len(before)]] == [json.dumps(json.loads(x)) for x in before]
    assert len({r["id"] for r in after}) == len(after)
    raw = wf.records("K", "raw_responses.jsonl")
    assert sorted(r["id"] for r in raw) == sorted(r["id"] for r in after)
    assert sum(r["usage"]["completion_tokens"] for r in raw) >= 1200
    assert f"Resuming: {len(before)} already done" in wf.path("logs", "inference", "K.log").read_text()
    print(f"scancel after {len(before)} records ({tokens_before} tokens); resumed to {len(after)} records")


def test_readme_cluster_walkthrough_as_written_from_outside_the_clone(tmp_path, server, tiny_tokenizer):
    """The README's "Cluster (SLURM): against an existing server" block, run as bash from a directory
    outside the clone with its own lines (HOME is a temporary folder holding `budgetgen` -> this clone;
    $EDITOR sets the account): the profile copied to ~/.config/snakemake/budgetgen, `bg -n all` plans
    the inference job and says it asks for no GPU; `bg --unlock` works with the same flags. Only the
    `git clone` (this is the clone), `tmux` and the submitting `bg all` (no cluster here) are left out."""
    readme = (REPO / "README.md").read_text()
    section = readme.split("## Cluster (SLURM): against an existing server\n", 1)[1]
    block = section.split("```bash\n", 1)[1].split("```", 1)[0]
    home, work = tmp_path / "home", tmp_path / "scratch" / "run1"
    home.mkdir()
    (home / "budgetgen").symlink_to(REPO)
    srv = server()
    make(work, srv, tiny_tokenizer, {"A": 3})
    os.rename(work / "config.yaml", work / "my.yaml")
    editor = tmp_path / "editor.sh"
    editor.write_text("#!/bin/sh\nsed -i \"s/'CHANGE_ME'/'my-lab'/\" \"$1\"\n")
    editor.chmod(0o755)
    script = ["shopt -s expand_aliases", "set -e"]
    for line in block.splitlines():
        cmd = line.split("  #", 1)[0].strip()
        if cmd.startswith(("git clone", "tmux")):
            continue
        if cmd == "bg all":
            cmd = "bg --unlock"
        script.append(cmd.replace("/scratch/$USER/run1", str(work)))
    assert ("bg -n all" in script
            and any("cp -r ~/budgetgen/profiles/slurm ~/.config/snakemake/budgetgen" in c for c in script)), block
    proc = subprocess.run(["timeout", "-k", "30", "240", "bash", "-c", "\n".join(script)], cwd=tmp_path,
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, "HOME": str(home), "EDITOR": str(editor)})
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-6000:]
    assert "budgetgen: A " in out and "inference jobs ask the cluster for: 1 CPU, 4000 MB, no GPU" in out, out[-3000:]
    assert "account my-lab" in out and "Unlocked working directory" in out, out[-3000:]
    assert not SUBMITTED.search(out) and not (REPO / "logs" / "slurm").exists()
