"""The inference job with its streams read in worker processes (server.client_processes,
budgetgen.stream_workers): the same journal as in one process, the budget rule fed by the workers'
progress, a worker killed -9 mid-stream (its streams retried, a new worker started, nothing lost or
twice), the job killed -9 mid-stream (its workers exit; the rerun resumes exact), and SIGTERM (workers
closed, the journal flushed)."""

import asyncio
import os
import signal
import subprocess
import time
from pathlib import Path

from budgetgen.client import ChatClient
from budgetgen.progress import StreamProgress
from budgetgen.stream_workers import StreamWorkers
from support.jobs import JobFiles, job_cmd
from support.workflow import server_stats, wait_for, write_prompts


def children(pid):
    """The pids of a process's children (Linux /proc)."""
    out = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            out += [int(x) for x in (task / "children").read_text().split()]
        except FileNotFoundError:
            pass
    return out


def workers_of(pid):
    return [c for c in children(pid) if b"budgetgen.stream_workers" in Path(f"/proc/{c}/cmdline").read_bytes()]


def alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie (exited, not yet reaped) is gone for this purpose
    return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1][0] != "Z"


def check_journal(files, budget=None, max_tokens=None):
    recs = files.records()
    ids = [r["id"] for r in recs]
    assert len(ids) == len(set(ids)), "an id journaled twice"
    tokens = sum(r["usage"]["completion_tokens"] for r in recs)
    if budget is not None:
        assert budget <= tokens < budget + 8 * max_tokens, tokens
    return recs


def test_two_stream_workers_journal_what_one_process_does(tmp_path, server):
    # 8 slots for 32 in flight: requests wait in the server's queue for seconds before their first byte, past
    # the watchdog's first tick (a stream reported as seen before its first line would be timed out there)
    srv = server("--length-dist", "fixed", "--mean-tokens", "60", "--tokens-per-s", "60", "--slots", "8")
    results = {}
    for n in (0, 2):
        wd = tmp_path / f"p{n}"
        write_prompts(wd / "prompts.jsonl", 200)
        p = subprocess.run(job_cmd(wd, srv.base_url, client_processes=n, concurrency=32, budget=3000, max_tokens=64),
                           capture_output=True, text=True, timeout=120)
        out = p.stdout + p.stderr
        assert p.returncode == 0, out[-3000:]
        assert ("worker processes" in out) == bool(n)
        assert "retries 0 " in out, out[-2000:]  # nothing timed out, nothing asked twice
        recs = check_journal(JobFiles(wd), budget=3000, max_tokens=64)
        results[n] = {r["id"]: (r["messages"], r["usage"]["completion_tokens"]) for r in recs}
    # the same prompts answered the same way (fixed lengths, deterministic text), the budget met alike
    assert results[2] == {i: results[2][i] for i in results[0]} and set(results[2]) == set(results[0])


def test_the_rule_sees_a_workers_stream_in_the_chunks_it_came_in(server):
    # 1 token per event, 10 events per network write: the budget rule's StreamProgress extrapolates a
    # stream by its chunks, so a worker must report the server's chunks, not one per flush of its pipe
    srv = server("--length-dist", "fixed", "--mean-tokens", "60", "--tokens-per-s", "100",
                 "--chunk-interval-s", "0.1", "--tokens-per-event", "1")

    async def one(workers):
        client = ChatClient(srv.base_url, "mock-model", workers=workers)
        progress = StreamProgress()

        def on_token(n, chunks=1, now=None):  # as budgetgen.inference feeds it
            progress.add(n, time.monotonic() if now is None else now, chunks)

        try:
            res = await client.chat([{"role": "user", "content": "hi"}], {"max_tokens": 60}, on_token=on_token)
        finally:
            await client.aclose()
        return res, progress

    (own, in_job), (theirs, in_worker) = asyncio.run(one(None)), asyncio.run(
        one(StreamWorkers(1, api_key_env=None, concurrency=4, engine="openai")))
    assert own.content == theirs.content and own.usage["completion_tokens"] == 60
    assert in_job.seen == in_worker.seen == 60
    assert in_job.chunks == in_worker.chunks == 60  # one per SSE event, not one per 20 ms flush
    assert in_worker.first_tokens == 1


def two_worker_job(tmp_path, server, prompts, **popen):
    """(server, files, cmd, job): a job with 2 stream workers and 8 streams of 2 s each (100 tokens at 50/s,
    so streams are always in flight in both workers) over `prompts` prompts, started."""
    srv = server("--length-dist", "fixed", "--mean-tokens", "100", "--tokens-per-s", "50")
    write_prompts(tmp_path / "prompts.jsonl", prompts)
    cmd = job_cmd(tmp_path, srv.base_url, client_processes=2, concurrency=8, budget=10**6, max_tokens=128)
    return srv, JobFiles(tmp_path), cmd, subprocess.Popen(cmd, **popen)


def test_a_worker_killed_mid_stream_is_replaced_and_its_streams_retried(tmp_path, server):
    srv, files, _, job = two_worker_job(tmp_path, server, 60, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                        text=True)
    try:
        # all 8 of the job's streams at the server: the parent gives each chat to the worker with the fewest,
        # so both hold streams on the wire (4 in flight could all be the other worker's while the victim is
        # still starting under load: then the kill cuts nothing)
        wait_for(lambda: len(workers_of(job.pid)) == 2 and server_stats(srv)["active"] == 8, timeout=60,
                 what="two workers with all 8 streams in flight")
        victim = workers_of(job.pid)[0]
        os.kill(victim, signal.SIGKILL)
        out, _ = job.communicate(timeout=120)
    finally:
        if job.poll() is None:
            job.kill()
    assert job.returncode == 0, out[-3000:]
    assert f"stream worker {victim} exited" in out
    recs = check_journal(files)
    assert len(recs) == 60  # every prompt answered once: the killed streams were asked again
    assert all(r["usage"]["completion_tokens"] == 100 for r in recs)
    assert server_stats(srv)["tokens_abandoned"] > 0  # the premise: streams were cut by the kill


def test_the_job_killed_mid_stream_takes_its_workers_and_the_rerun_resumes_exact(tmp_path, server):
    srv, files, cmd, job = two_worker_job(tmp_path, server, 40, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for(lambda: files.journal.exists() and len(files.records()) >= 4 and server_stats(srv)["active"] >= 4,
                 timeout=60, what="records journaled and streams in flight")
        workers = workers_of(job.pid)
        assert len(workers) == 2
        os.kill(job.pid, signal.SIGKILL)
        job.wait(timeout=30)
    finally:
        if job.poll() is None:
            job.kill()
    wait_for(lambda: not any(alive(w) for w in workers), timeout=30, what="the workers to exit with their job")
    before = {r["id"]: r for r in check_journal(files)}
    assert len(before) < 40  # the premise: killed with work left
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, (p.stdout + p.stderr)[-3000:]
    after = {r["id"]: r for r in check_journal(files)}
    assert len(after) == 40 and all(after[i] == rec for i, rec in before.items())


def test_sigterm_closes_the_workers_and_flushes_the_journal(tmp_path, server):
    _, files, _, job = two_worker_job(tmp_path, server, 40, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                      text=True)
    try:
        wait_for(lambda: len(workers_of(job.pid)) == 2 and files.journal.exists() and len(files.records()) >= 2,
                 timeout=60, what="records journaled")
        workers = workers_of(job.pid)
        job.send_signal(signal.SIGTERM)
        out, _ = job.communicate(timeout=60)
    finally:
        if job.poll() is None:
            job.kill()
    assert job.returncode == 143, out[-3000:]
    assert not any(alive(w) for w in workers)
    check_journal(files)
    assert "exited" not in out, out[-2000:]  # closed, not found dead and restarted
