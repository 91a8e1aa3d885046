"""Real `snakemake` runs of the repository's Snakefile in a temporary working directory, and what the
tests around them share: a config for the mock server and a tiny tokenizer (base_config), prompt files
(write_prompts), dry-run parsing (planned_jobs, planned_inference), polling (wait_for) and the mock
server's counters (server_stats)."""

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import yaml

from support import REPO


def write_prompts(path, n, prefix="q", fmt="prompt"):
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        for i in range(n):
            text = f"{prefix} question number {i}: explain topic {i * 7 % 13}"
            rec = {"prompt": text} if fmt == "prompt" else {"messages": [{"role": "user", "content": text}]}
            f.write(json.dumps(rec) + "\n")
    return path


def write_conversations(path, n, turns=3, prefix="c"):
    """n ShareGPT conversations of `turns` user turns, each with the dataset's own answers between."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        for i in range(n):
            conv = []
            for t in range(1, turns + 1):
                conv.append({"from": "human", "value": f"{prefix}{i} question {t}: explain topic {i * 7 % 13 + t}"})
                if t < turns:
                    conv.append({"from": "gpt", "value": f"the dataset's answer {t} (not the target's)"})
            f.write(json.dumps({"id": f"{prefix}{i}", "conversations": conv}) + "\n")
    return path


class Workflow:
    """A working directory with a config, and real snakemake runs of the repo's Snakefile in it."""

    def __init__(self, workdir, config):
        self.dir = Path(workdir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.config = config
        self.write_config()

    def write_config(self):
        with open(self.dir / "config.yaml", "w") as f:
            yaml.safe_dump(self.config, f, sort_keys=False)

    def cmd(self, *args, listing=True):
        """snakemake on this directory; a dry-run lists its jobs (profiles/default's `quiet: rules` hides
        the listing planned_inference reads; `--quiet host` on the command line replaces it), unless
        listing=False (the command as a user types it, under the profile's quiet)."""
        dry = "-n" in args or "--dry-run" in args
        listing = list(LISTING) if listing and dry and "--quiet" not in args else []
        return [sys.executable, "-m", "snakemake", "-s", str(REPO / "Snakefile"), "-d", str(self.dir),
                "--configfile", str(self.dir / "config.yaml"), *args, *listing]

    def run(self, *args, check=True, timeout=300, env=None, listing=True):
        proc = subprocess.run(self.cmd(*args, listing=listing), capture_output=True, text=True, timeout=timeout,
                              env={**os.environ, **(env or {})})
        proc.output = proc.stdout + proc.stderr
        if check and proc.returncode != 0:
            raise AssertionError(f"snakemake {' '.join(args)} failed ({proc.returncode}):\n{proc.output[-6000:]}")
        return proc

    def start(self, *args, env=None):
        """Start snakemake in its own process group (so the whole group can be killed)."""
        log = open(self.dir / "snakemake.out", "w")
        return subprocess.Popen(self.cmd(*args), stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                env={**os.environ, **(env or {})})

    def killpg(self, proc, sig=signal.SIGKILL):
        """Signal the run's process group and wait for snakemake; after SIGKILL, also until no process of
        the group is left (its jobs may write no more), however long a loaded machine takes to reap them."""
        os.killpg(proc.pid, sig)
        proc.wait(timeout=30)
        if sig == signal.SIGKILL:
            def gone():
                try:
                    os.killpg(proc.pid, 0)
                except ProcessLookupError:
                    return True
                return False

            wait_for(gone, timeout=30, interval=0.02, what=f"process group {proc.pid} gone")

    def path(self, *parts):
        return self.dir.joinpath(*parts)

    def journal_lines(self, dataset):
        p = self.path("results", dataset, "journal.jsonl")
        if not p.exists():
            return []
        return [line for line in p.read_text().splitlines(keepends=True) if line.endswith("\n")]

    def records(self, dataset, name="journal.jsonl"):
        p = self.path("results", dataset, name)
        return [json.loads(line) for line in p.read_text().splitlines() if line.strip()] if p.exists() else []


def planned_jobs(output):
    """Job counts from a dry-run's 'Job stats' table: {rule: count}."""
    counts, in_table = {}, False
    for line in output.splitlines():
        if line.startswith("job ") and "count" in line:
            in_table = True
            continue
        if in_table:
            parts = line.split()
            if not parts or parts[0].startswith("-"):
                continue
            if parts[0] == "total":
                break
            if len(parts) == 2 and parts[1].isdigit():
                counts[parts[0]] = int(parts[1])
    return counts


# A dry-run's job listing, which profiles/default's `quiet: rules` hides (the command line's --quiet wins)
LISTING = ("--quiet", "host")


def planned_inference(output):
    """Datasets with an inference job in a dry-run's listing."""
    found, current = set(), None
    for line in output.splitlines():
        s = line.strip()
        m = re.match(r"Job \d+: inference (\S+): ", s)  # the rule's message: line
        if m:
            found.add(m.group(1))
        elif s.startswith("rule ") or s.startswith("localrule "):
            current = s.split()[1].rstrip(":")
        elif s.startswith("wildcards:") and current == "inference":
            found.add(s.split("dataset=")[1].split(",")[0].strip())
    return found


def base_config(base_url, tokenizer, datasets, **generation):
    gen = {"token_budget": 2000, "max_tokens": 256, "concurrency": 8, "seed": 1}
    gen.update(generation)
    return {
        "server": {"base_url": base_url, "model": "mock-model", "request_timeout_s": 30, "startup_wait_s": 2,
                   "unreachable_deadline_s": 30, "progress_interval_s": 0.5},
        "generation": gen,
        # the mock server counts usage in words unless it is given the tokenizer (--token-ids-tokenizer): a
        # server of another model, whose usage no row built here agrees with (tests/workflow/test_usage_check.py
        # holds rows against a mock that counts in the tokenizer's tokens)
        "tokenizer": {"path": str(tokenizer), "max_length": 1024, "processes": 1, "check_usage": False},
        "datasets": datasets,
    }


def wait_for(predicate, timeout=60, interval=0.1, what="condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def server_stats(proc):
    """The counters of a mock server started by the `server` fixture (its GET /stats)."""
    import httpx

    return httpx.get(proc.base_url.rsplit("/v1", 1)[0] + "/stats", timeout=5).json()
