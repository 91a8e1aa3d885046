"""Two runs on one working directory (real snakemake, real mock server on 127.0.0.1): a second
`snakemake` is refused by Snakemake's directory lock while the first runs; one started with --nolock
gets as far as the inference job, which the journal lock (JournalLock) refuses, naming the pid that
holds it. Either way the first run completes with every prompt once. (Two inference processes on one
journal outside snakemake: tests/test_inference.py::test_second_writer_on_one_journal_is_refused.)"""

import json

import pytest

from conftest import Workflow, base_config, server_stats, wait_for, write_prompts

pytestmark = pytest.mark.slow

N = 48


def make(tmp_path, srv, tokenizer):
    wf_dir = tmp_path / "work"
    write_prompts(wf_dir / "prompts" / "C.jsonl", N, prefix="C")
    return Workflow(wf_dir, base_config(srv.base_url, tokenizer, {"C": {"prompts": "prompts/C.jsonl"}},
                                        token_budget=10**6, concurrency=4))


def inference_pid(wf):
    """The pid the running inference job wrote into its journal lock."""
    return int(wf.path("results", "C", "journal.jsonl.lock").read_text().strip())


def first_run_completes_with_every_prompt_once(wf, proc, srv):
    assert proc.wait(timeout=120) == 0, wf.path("snakemake.out").read_text()[-3000:]
    ids = [r["id"] for r in wf.records("C")]
    assert len(ids) == len(set(ids)) == N
    assert sorted(r["id"] for r in wf.records("C", "raw_responses.jsonl")) == sorted(ids)
    assert server_stats(srv)["requests"] == N  # nothing was generated twice


def test_second_snakemake_on_the_same_directory_is_refused_by_its_lock(tmp_path, server, tiny_tokenizer):
    srv = server("--mean-tokens", "50", "--tokens-per-s", "50")
    wf = make(tmp_path, srv, tiny_tokenizer)
    first = wf.start("--cores", "2", "results/C/raw_responses.jsonl")
    try:
        wait_for(lambda: len(wf.journal_lines("C")) >= 4, timeout=90, what="4 journaled responses")
        lines = wf.journal_lines("C")
        second = wf.run("--cores", "2", "results/C/raw_responses.jsonl", check=False, timeout=120)
        assert second.returncode != 0
        assert "Directory cannot be locked" in second.output and "--unlock" in second.output, second.output[-3000:]
        print("second snakemake:", next(x for x in second.output.splitlines() if "cannot be locked" in x))
        assert first.poll() is None  # the first run is untouched and still going
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
    first = wf.start("--cores", "2", "results/C/raw_responses.jsonl")
    try:
        wait_for(lambda: len(wf.journal_lines("C")) >= 4, timeout=90, what="4 journaled responses")
        holder = inference_pid(wf)
        # --nolock skips Snakemake's guard; the job's own journal lock is what stops a second writer.
        # (Its log would replace the first job's log file: read the error from the second's output.)
        second = wf.run("--cores", "2", "--nolock", "results/C/raw_responses.jsonl", check=False, timeout=120)
        assert second.returncode != 0
        err = [line for line in second.output.splitlines() if "another inference process" in line]
        assert err and f"results/C/journal.jsonl.lock: another inference process (pid {holder}) is writing" \
            in err[0], second.output[-4000:]
        assert "Traceback" not in second.output
        print("second snakemake --nolock:", err[0])
        assert first.poll() is None
        first_run_completes_with_every_prompt_once(wf, first, srv)
    finally:
        if first.poll() is None:
            wf.killpg(first)
    assert json.loads(wf.path("results", "C", "inference.done").read_text())["responses"] == N
