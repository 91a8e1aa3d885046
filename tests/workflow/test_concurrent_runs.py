"""Two runs on one working directory (real snakemake, real mock server on 127.0.0.1): a second
`snakemake` is refused by Snakemake's directory lock while the first runs; one started with --nolock
gets as far as the inference job, which the journal lock (JournalLock) refuses, naming the pid that
holds it. Either way the first run completes with every prompt once. (Two inference processes on one
journal outside snakemake: tests/workflow/test_inference.py::test_second_writer_on_one_journal_is_refused.)

The premise, "the first run is still running while the second starts and is refused", must hold on
a loaded machine (CI shares one): the second snakemake can take longer to start than the first takes
to finish its prompts. So once the first run's inference job has journaled a few responses, the mock
server is frozen with SIGSTOP (connections stay open, no byte is sent: the job's requests wait, and
its timeouts are far longer than the test), the test checks that the first job is alive and holds the
journal lock, runs the second snakemake, checks again, and only then lets the server go on (SIGCONT).
"""

import fcntl
import json
import os
import signal
from contextlib import contextmanager

import pytest

from support.workflow import Workflow, base_config, server_stats, wait_for, write_prompts

pytestmark = pytest.mark.slow

N = 48


def make(tmp_path, srv, tokenizer):
    wf_dir = tmp_path / "work"
    write_prompts(wf_dir / "prompts" / "C.jsonl", N, prefix="C")
    cfg = base_config(srv.base_url, tokenizer, {"C": {"prompts": "prompts/C.jsonl"}},
                      token_budget=10**6, concurrency=4)
    # a frozen server must not make the first job give up: no request timeout, no deadline within the test
    cfg["server"].update(request_timeout_s=3600, unreachable_deadline_s=3600)
    return Workflow(wf_dir, cfg)


def inference_pid(wf):
    """The pid the running inference job wrote into its journal lock."""
    return int(wf.path("results", "C", "journal.jsonl.lock").read_text().strip())


def first_job_holds_the_journal(wf, first, n_lines):
    """The premise, checked rather than assumed: the first snakemake and its inference job are alive,
    the job holds the journal lock (its pid in the lock file, the lock not free) and has not finished
    its prompts. Returns the job's pid."""
    assert first.poll() is None, "the first snakemake is no longer running"
    pid = inference_pid(wf)
    with open(f"/proc/{pid}/cmdline", "rb") as f:  # raises if the job is gone
        assert b"run_inference.py" in f.read()
    fd = os.open(wf.path("results", "C", "journal.jsonl.lock"), os.O_RDONLY)
    try:
        with pytest.raises(BlockingIOError):  # held: a non-blocking exclusive lock is refused
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    finally:
        os.close(fd)  # (had the lock been free, closing releases it at once)
    assert n_lines <= len(wf.journal_lines("C")) < N
    return pid


@contextmanager
def frozen(srv):
    """The mock server stopped (SIGSTOP) for the block: the first run can make no progress."""
    os.kill(srv.pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(srv.pid, signal.SIGCONT)


def start_first_and_freeze_it(wf, srv):
    first = wf.start("--cores", "2", "results/C/raw_responses.jsonl")
    wait_for(lambda: len(wf.journal_lines("C")) >= 4, timeout=120, what="4 journaled responses")
    return first


def first_run_completes_with_every_prompt_once(wf, proc, srv):
    assert proc.wait(timeout=180) == 0, wf.path("snakemake.out").read_text()[-3000:]
    ids = [r["id"] for r in wf.records("C")]
    assert len(ids) == len(set(ids)) == N
    assert sorted(r["id"] for r in wf.records("C", "raw_responses.jsonl")) == sorted(ids)
    assert server_stats(srv)["requests"] == N  # nothing was generated twice


def test_second_snakemake_on_the_same_directory_is_refused_by_its_lock(tmp_path, server, tiny_tokenizer):
    srv = server("--mean-tokens", "50", "--tokens-per-s", "50")
    wf = make(tmp_path, srv, tiny_tokenizer)
    first = start_first_and_freeze_it(wf, srv)
    try:
        with frozen(srv):
            lines = wf.journal_lines("C")
            holder = first_job_holds_the_journal(wf, first, len(lines))
            second = wf.run("--cores", "2", "results/C/raw_responses.jsonl", check=False, timeout=300)
            assert second.returncode != 0
            assert "Directory cannot be locked" in second.output and "--unlock" in second.output, \
                second.output[-3000:]
            print("second snakemake:", next(x for x in second.output.splitlines() if "cannot be locked" in x))
            # the first run is untouched and still going: the same job, nothing lost
            assert first_job_holds_the_journal(wf, first, len(lines)) == holder
            assert wf.journal_lines("C")[: len(lines)] == lines
        first_run_completes_with_every_prompt_once(wf, first, srv)
    finally:
        if first.poll() is None:
            wf.killpg(first)
    log = wf.path("logs", "inference", "C.log").read_text()
    assert log.count("Resuming: ") == 1  # only the first run's job ever started


def test_second_snakemake_with_nolock_is_refused_by_the_journal_lock(tmp_path, server, tiny_tokenizer):
    srv = server("--mean-tokens", "50", "--tokens-per-s", "50")
    wf = make(tmp_path, srv, tiny_tokenizer)
    first = start_first_and_freeze_it(wf, srv)
    try:
        with frozen(srv):
            lines = wf.journal_lines("C")
            holder = first_job_holds_the_journal(wf, first, len(lines))
            # --nolock skips Snakemake's guard; the job's own journal lock is what stops a second writer.
            # (Its log would replace the first job's log file: read the error from the second's output.)
            second = wf.run("--cores", "2", "--nolock", "results/C/raw_responses.jsonl", check=False,
                            timeout=300)
            assert second.returncode != 0
            err = [line for line in second.output.splitlines() if "another inference process" in line]
            assert err and f"results/C/journal.jsonl.lock: another inference process (pid {holder}) is writing" \
                in err[0], second.output[-4000:]
            assert "Traceback" not in second.output
            print("second snakemake --nolock:", err[0])
            assert first_job_holds_the_journal(wf, first, len(lines)) == holder  # still the first job's
            assert wf.journal_lines("C")[: len(lines)] == lines
        first_run_completes_with_every_prompt_once(wf, first, srv)
    finally:
        if first.poll() is None:
            wf.killpg(first)
    assert json.loads(wf.path("results", "C", "inference.done").read_text())["responses"] == N
