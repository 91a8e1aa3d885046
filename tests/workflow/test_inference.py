"""The inference entry point against a real mock server on loopback: budget, resume, retries,
errors, signals, locking, unreachable servers."""

import json
import os
import signal
import subprocess
import time

import pytest

from support.jobs import job_cmd
from support.workflow import server_stats, wait_for, write_prompts


def cmd(tmp_path, base_url, budget=2000, **kw):
    kw = {"max_tokens": 256, "concurrency": 8, "startup_wait_s": 0, **kw}
    return job_cmd(tmp_path, base_url, budget=budget, **kw)


def run(tmp_path, base_url, timeout=120, **kw):
    p = subprocess.run(cmd(tmp_path, base_url, **kw), capture_output=True, text=True, timeout=timeout)
    p.output = p.stdout + p.stderr
    return p


def journal(tmp_path):
    path = tmp_path / "results" / "d" / "journal.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


def test_budget_met_with_small_overshoot_and_records_complete(tmp_path, server):
    write_prompts(tmp_path / "prompts.jsonl", 300)
    srv = server("--length-dist", "lognormal", "--mean-tokens", "60", "--reasoning-share", "0.25")
    p = run(tmp_path, srv.base_url, budget=3000, temperature=0.5)
    assert p.returncode == 0, p.output
    recs = journal(tmp_path)
    tokens = sum(r["usage"]["completion_tokens"] for r in recs)
    assert tokens >= 3000 and tokens < 3000 + 8 * 256
    assert len({r["id"] for r in recs}) == len(recs) < 300
    r = recs[0]
    assert r["messages"][-1]["role"] == "assistant" and r["messages"][-1]["reasoning_content"]
    assert r["params"] == {"model": "mock-model", "max_tokens": 256, "temperature": 0.5}
    assert list(r)[0] == "id" and list(r)[-1] == "usage"
    done = json.loads((tmp_path / "results" / "d" / "inference.done").read_text())
    assert done["state"] == "met" and done["tokens"] == tokens
    assert server_stats(srv)["tokens_abandoned"] == 0  # nothing generated was thrown away
    assert "Resuming: 0 already done (0 tokens)" in p.output and "progress:" in p.output and "ETA" in p.output


def test_dispatch_order_is_seeded_not_file_order(tmp_path, server):
    write_prompts(tmp_path / "prompts.jsonl", 200)
    srv = server("--mean-tokens", "20")
    assert run(tmp_path, srv.base_url, budget=400, concurrency=1).returncode == 0
    got = [r["messages"][0]["content"] for r in journal(tmp_path)]
    first = [f"q question number {i}: explain topic {i * 7 % 13}" for i in range(len(got))]
    assert got != first  # not the file's first lines
    from budgetgen import prompts

    ps = prompts.load_prompts(tmp_path / "prompts.jsonl")
    order = prompts.dispatch_order([x.id for x in ps.prompts], 0)
    assert [r["id"] for r in journal(tmp_path)] == order[: len(got)]


def test_resume_skips_done_ids_and_raised_budget_continues(tmp_path, server):
    write_prompts(tmp_path / "prompts.jsonl", 100)
    srv = server("--mean-tokens", "20")
    assert run(tmp_path, srv.base_url, budget=300).returncode == 0
    first = journal(tmp_path)
    n_req = server_stats(srv)["requests"]
    p = run(tmp_path, srv.base_url, budget=300)
    assert p.returncode == 0 and f"Resuming: {len(first)} already done" in p.output
    assert server_stats(srv)["requests"] == n_req  # met: not one request sent
    p = run(tmp_path, srv.base_url, budget=900)
    assert p.returncode == 0
    recs = journal(tmp_path)
    assert recs[: len(first)] == first  # nothing rewritten
    assert len({r["id"] for r in recs}) == len(recs)
    assert sum(r["usage"]["completion_tokens"] for r in recs) >= 900
    assert "remaining budget: " in p.output


def test_exhausted_prompts_finish_as_exhausted_and_duplicates_are_generated_once(tmp_path, server):
    path = write_prompts(tmp_path / "prompts.jsonl", 10)
    with open(path, "a") as f:
        f.write(json.dumps({"prompt": "q question number 0: explain topic 0"}) + "\n")
    srv = server("--mean-tokens", "10")
    p = run(tmp_path, srv.base_url, budget=10**6)
    assert p.returncode == 0, p.output
    assert "1 duplicates dropped" in p.output
    assert len(journal(tmp_path)) == 10 and server_stats(srv)["requests"] == 10
    assert json.loads((tmp_path / "results" / "d" / "inference.done").read_text())["state"] == "exhausted"


def test_length_cut_responses_are_kept_and_counted(tmp_path, server):
    write_prompts(tmp_path / "prompts.jsonl", 5)
    srv = server("--mean-tokens", "500")
    assert run(tmp_path, srv.base_url, budget=10**6, max_tokens=16).returncode == 0
    recs = journal(tmp_path)
    assert len(recs) == 5
    assert all(r["finish_reason"] == "length" and r["usage"]["completion_tokens"] == 16 for r in recs)


def test_transient_faults_are_retried_and_counted(tmp_path, server):
    write_prompts(tmp_path / "prompts.jsonl", 150)
    srv = server("--mean-tokens", "20", "--fail-500", "0.1", "--fail-429", "0.05", "--retry-after", "0.2",
                 "--drop", "0.05", "--fault-seed", "3")
    p = run(tmp_path, srv.base_url, budget=10**6)
    assert p.returncode == 0, p.output
    recs = journal(tmp_path)
    assert len(recs) == 150 and len({r["id"] for r in recs}) == 150
    faults = server_stats(srv)["faults"]
    done = json.loads((tmp_path / "results" / "d" / "inference.done").read_text())
    assert done["retries"] == faults["500"] + faults["429"] + faults["drop"] > 0
    assert "HTTP 500" in p.output and "HTTP 429" in p.output


def test_non_transient_4xx_goes_to_errors_once_and_is_not_counted(tmp_path, server):
    path = tmp_path / "prompts.jsonl"
    with open(path, "w") as f:
        f.write(json.dumps({"id": "short", "prompt": "hi"}) + "\n")
        f.write(json.dumps({"id": "long", "prompt": " ".join(["word"] * 400)}) + "\n")
    srv = server("--mean-tokens", "10", "--context-limit", "300")
    p = run(tmp_path, srv.base_url, budget=10**6, max_tokens=32)
    assert p.returncode == 0, p.output
    assert [r["id"] for r in journal(tmp_path)] == ["short"]
    errors = [json.loads(x) for x in (tmp_path / "results" / "d" / "errors.jsonl").read_text().splitlines()]
    assert [e["id"] for e in errors] == ["long"] and errors[0]["status"] == 400
    assert "maximum context length" in errors[0]["error"]
    requests = server_stats(srv)["requests"]
    assert run(tmp_path, srv.base_url, budget=10**6, max_tokens=32).returncode == 0
    assert server_stats(srv)["requests"] == requests  # not retried on resume
    assert len((tmp_path / "results" / "d" / "errors.jsonl").read_text().splitlines()) == 1


def test_sigterm_stops_flushes_and_exits_nonzero_within_seconds(tmp_path, server):
    write_prompts(tmp_path / "prompts.jsonl", 200)
    srv = server("--mean-tokens", "200", "--tokens-per-s", "50")
    proc = subprocess.Popen(cmd(tmp_path, srv.base_url, budget=10**6), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    wait_for(lambda: len(journal(tmp_path)) >= 3, timeout=60, what="3 journaled responses")
    t0 = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=30)
    elapsed = time.monotonic() - t0
    assert proc.returncode == 143 and elapsed < 10, out
    assert "SIGTERM received" in out and "rerun to resume" in out
    kept = journal(tmp_path)  # every line whole (json.loads above would fail on a torn one)
    assert not (tmp_path / "results" / "d" / "inference.done").exists()
    p = run(tmp_path, srv.base_url, budget=sum(r["usage"]["completion_tokens"] for r in kept) + 50)
    assert p.returncode == 0 and f"Resuming: {len(kept)} already done" in p.output
    assert journal(tmp_path)[: len(kept)] == kept


def test_unreachable_server_is_one_line_naming_the_url(tmp_path):
    write_prompts(tmp_path / "prompts.jsonl", 3)
    import socket

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    p = run(tmp_path, f"http://127.0.0.1:{port}/v1")
    assert p.returncode == 2
    err = [line for line in p.stderr.splitlines() if line.startswith("error:")]
    assert len(err) == 1 and f"http://127.0.0.1:{port}/v1/models" in err[0]
    assert "Traceback" not in p.output


def test_unknown_model_is_one_line(tmp_path, server):
    write_prompts(tmp_path / "prompts.jsonl", 3)
    srv = server()
    p = subprocess.run(cmd(tmp_path, srv.base_url, model="other-model"), capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and "model 'other-model' is not served at" in p.stderr
    assert "mock-model" in p.stderr


def test_server_down_mid_run_fails_after_deadline_with_journal_intact(tmp_path, server):
    from budgetgen_testkit import mock_server

    write_prompts(tmp_path / "prompts.jsonl", 400)
    srv = server("--mean-tokens", "30", "--tokens-per-s", "300", "--outage-for", "600")
    proc = subprocess.Popen(cmd(tmp_path, srv.base_url, budget=10**6, unreachable_deadline_s=3),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:  # the outage once the job has journaled (mid-run, however slow its start on a loaded machine)
        wait_for(lambda: len(journal(tmp_path)) >= 3, timeout=120, what="3 records journaled")
        assert proc.poll() is None
        mock_server.outage(srv)
        t0 = time.monotonic()
        _, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 2 and time.monotonic() - t0 < 60
    assert "error: server at " in stderr and srv.base_url in stderr and "deadline 3 s" in stderr
    assert len(journal(tmp_path)) >= 3  # whole records, all parseable
    assert not (tmp_path / "results" / "d" / "inference.done").exists()


def test_api_key_from_environment_never_logged(tmp_path, server):
    write_prompts(tmp_path / "prompts.jsonl", 5)
    env = {**os.environ, "BG_TEST_KEY": "sk-secret-123"}
    srv = server("--api-key-env", "BG_TEST_KEY", "--mean-tokens", "5", env={"BG_TEST_KEY": "sk-secret-123"})
    p = subprocess.run(cmd(tmp_path, srv.base_url, budget=10**6, api_key_env="BG_TEST_KEY"),
                       capture_output=True, text=True, timeout=60, env=env)
    assert p.returncode == 0, p.stdout + p.stderr
    assert ("sk-secret-123" not in p.stdout + p.stderr
            and "sk-secret-123" not in (tmp_path / "results" / "d" / "journal.jsonl").read_text())
    write_prompts(tmp_path / "prompts.jsonl", 10)  # work left, so the key is needed
    p = run(tmp_path, srv.base_url, budget=10**6, api_key_env="BG_NOT_SET")
    assert p.returncode == 2 and "BG_NOT_SET" in p.stderr


def test_second_writer_on_one_journal_is_refused(tmp_path, server):
    write_prompts(tmp_path / "prompts.jsonl", 100)
    srv = server("--mean-tokens", "200", "--tokens-per-s", "20")
    first = subprocess.Popen(cmd(tmp_path, srv.base_url, budget=10**6), stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
    try:
        lock = tmp_path / "results" / "d" / "journal.jsonl.lock"
        # the holder writes its pid once it holds the lock (the file exists a moment before)
        wait_for(lambda: lock.exists() and lock.read_text().strip() == str(first.pid), timeout=60,
                 what="the lock held by the first job")
        p = run(tmp_path, srv.base_url, budget=10**6)
        assert p.returncode == 2 and "another inference process" in p.stderr and str(first.pid) in p.stderr
    finally:
        first.terminate()
        first.wait(30)


@pytest.mark.parametrize("bad", ["{not json\n", "[1, 2]\n"])
def test_bad_prompt_line_stops_the_run_naming_file_and_line(tmp_path, server, bad):
    path = write_prompts(tmp_path / "prompts.jsonl", 3)
    with open(path, "a") as f:
        f.write(bad)
    p = run(tmp_path, server().base_url)
    assert p.returncode == 2 and f"{path}:4: " in p.stderr and "Traceback" not in p.output
    p = run(tmp_path, server().base_url, on_bad_line="skip", budget=10**6)
    assert p.returncode == 0 and "1 bad lines skipped" in p.output and f"skipped {path}:4" in p.output
