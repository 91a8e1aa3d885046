"""server.launch: the inference job starts its own server (a real local server process), waits until
it is ready, uses it, and stops it on success, on failure and on SIGTERM."""

import os
import re
import signal
import subprocess
import sys
import time

import httpx
import pytest

from support import REPO
from support.jobs import job_cmd
from support.workflow import wait_for, write_prompts

MOCK = f"{sys.executable} {REPO / 'scripts' / 'mock_server.py'}"


def launch_args(tmp_path, launch, budget=600, **kw):
    kw = {"max_tokens": 64, "concurrency": 4, "startup_wait_s": 0, "launch": launch, **kw}
    return job_cmd(tmp_path, None, budget=budget, **kw)


def launched_pid(output):
    m = re.search(r"Launched server pid (\d+) on (\S+) ", output)
    assert m, output[-3000:]
    return int(m.group(1)), m.group(2)


def gone(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    # a zombie is gone for our purposes (nobody serves on its port)
    with open(f"/proc/{pid}/stat") as f:
        return f.read().split(") ", 1)[1].startswith("Z")


def test_launched_server_is_used_and_stopped_after_success(tmp_path):
    write_prompts(tmp_path / "prompts.jsonl", 30)
    p = subprocess.run(launch_args(tmp_path, MOCK + " --port {port} --model {model} --ttft-s 0.01", budget=10**6),
                       capture_output=True, text=True, timeout=120)
    out = p.stdout + p.stderr
    assert p.returncode == 0, out[-3000:]
    pid, url = launched_pid(out)
    assert "Server ready after" in out and f"Server {url} serves mock-model" in out
    assert ("Done: budget exhausted" in out
            and len((tmp_path / "results" / "d" / "journal.jsonl").read_text().splitlines()) == 30)
    assert gone(pid) and "Stopped server pid" in out
    with pytest.raises(httpx.ConnectError):
        httpx.get(url + "/models", timeout=2)
    assert "starting:" in (tmp_path / "logs" / "server" / "d.log").read_text()  # the server's own output is kept


def test_server_that_exits_before_ready_is_one_line_naming_its_log(tmp_path):
    write_prompts(tmp_path / "prompts.jsonl", 5)
    cmd = f"{sys.executable} -c \"import sys; print('CUDA out of memory'); sys.exit(3)\""
    p = subprocess.run(launch_args(tmp_path, cmd), capture_output=True, text=True, timeout=60)
    assert p.returncode == 2  # a UserError: one line, exit 2
    err = [x for x in p.stderr.splitlines() if x.startswith("error:")]
    assert len(err) == 1 and "exited with code 3 before it was ready" in err[0], p.stderr
    assert "see logs/server/d.log" in err[0] and "CUDA out of memory" in err[0]  # relative to the workdir
    assert "Traceback" not in p.stderr


def test_server_never_ready_fails_at_the_deadline_and_is_killed(tmp_path):
    write_prompts(tmp_path / "prompts.jsonl", 5)
    t0 = time.monotonic()
    p = subprocess.run(launch_args(tmp_path, "sleep 600", launch_ready_timeout_s=2), capture_output=True,
                       text=True, timeout=60)
    assert p.returncode == 2 and time.monotonic() - t0 < 30
    assert "not ready at http://127.0.0.1:" in p.stderr and "after 2 s" in p.stderr, p.stderr
    pid, _ = launched_pid(p.stdout)
    assert gone(pid)


def test_failing_run_still_stops_the_server(tmp_path):
    """Every request fails (HTTP 500, no retries): the job fails, and its server goes with it."""
    write_prompts(tmp_path / "prompts.jsonl", 5)
    p = subprocess.run(launch_args(tmp_path, MOCK + " --port {port} --fail-500 1.0", max_retries=0),
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 1, p.stdout[-3000:]
    pid, _ = launched_pid(p.stdout)
    assert "still failing" in p.stdout and gone(pid)


def test_sigterm_stops_the_job_and_its_server_within_seconds(tmp_path):
    write_prompts(tmp_path / "prompts.jsonl", 100)
    log = open(tmp_path / "job.out", "w")
    proc = subprocess.Popen(launch_args(tmp_path, MOCK + " --port {port} --tokens-per-s 20 --mean-tokens 40",
                                        budget=10**6), stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_for(lambda: ((tmp_path / "results" / "d" / "journal.jsonl").exists()
                          and (tmp_path / "results" / "d" / "journal.jsonl").read_text().count("\n") >= 2),
                 timeout=60, what="2 journaled responses")
        pid, _ = launched_pid((tmp_path / "job.out").read_text())
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(timeout=30)
        took = time.monotonic() - t0
    finally:
        if proc.poll() is None:
            proc.kill()
    out = (tmp_path / "job.out").read_text()
    assert rc == 143 and took < 10, out[-3000:]
    assert gone(pid) and "Stopped server pid" in out
    print(f"SIGTERM to exit (job and launched server): {took:.2f} s")


def test_workflow_launches_a_server_per_inference_job_and_keeps_its_log(tmp_path, tiny_tokenizer):
    """server.launch in config.yaml: no base_url; each inference job starts its own server (log under
    logs/server/), and the config's command template goes through as argv, never through a shell."""
    from support.workflow import Workflow, base_config

    for name in ("A", "B"):
        write_prompts(tmp_path / "prompts" / f"{name}.jsonl", 6, prefix=name)
    config = base_config("unused", tiny_tokenizer, {n: {"prompts": f"prompts/{n}.jsonl"} for n in "AB"},
                         token_budget=10**6)
    del config["server"]["base_url"]
    config["server"]["launch"] = MOCK + " --port {port} --model {model} --seed 7 --mean-tokens 12"
    wf = Workflow(tmp_path, config)
    out = wf.run("--cores", "2", "all").output
    for name in "AB":
        job_log = wf.path("logs", "inference", f"{name}.log").read_text()
        pid, _ = launched_pid(job_log)
        assert gone(pid) and "Stopped server pid" in job_log
        assert "starting:" in wf.path("logs", "server", f"{name}.log").read_text()
        assert len(wf.records(name, "raw_responses.jsonl")) == 6
    assert "Nothing to be done" in wf.run("-n", "all").output, out[-2000:]


def test_a_launched_servers_canary_is_asked_by_its_job_before_any_request(tmp_path, tiny_tokenizer):
    """server.canary with server.launch: no server exists before the job starts it, so the job asks the
    canary of the server it launched, once it is ready, before any dataset request; one that fails stops the
    job naming its lines (a loop: --garbage loop), the server stopped, nothing journaled."""
    import json

    from support.workflow import Workflow, base_config

    write_prompts(tmp_path / "prompts" / "A.jsonl", 6, prefix="A")
    canary = tmp_path / "canary.jsonl"
    canary.write_text("".join(json.dumps({"prompt": f"canary {i}", "expect": r"\w+"}) + "\n" for i in range(3)))
    config = base_config("unused", tiny_tokenizer, {"A": {"prompts": "prompts/A.jsonl"}}, token_budget=10**6)
    del config["server"]["base_url"]
    config["server"]["launch"] = MOCK + " --port {port} --model {model} --mean-tokens 12"
    config["server"]["canary"] = {"prompts": str(canary), "min_pass": 1.0}
    wf = Workflow(tmp_path, config)
    wf.run("--cores", "1", "all")
    log = wf.path("logs", "inference", "A.log").read_text()
    assert "server.canary: http://127.0.0.1:" in log and "3 of 3 passed (min_pass 1)" in log
    assert log.index("3 of 3 passed") < log.index("dispatching up to")

    config["server"]["launch"] += " --garbage loop"
    wf.config = config
    wf.write_config()
    write_prompts(tmp_path / "prompts" / "A.jsonl", 9, prefix="A")  # 3 prompts more: the job runs again
    proc = wf.run("--cores", "1", "all", check=False)
    log = wf.path("logs", "inference", "A.log").read_text()
    assert proc.returncode != 0 and "server.canary: nothing was dispatched: http://127.0.0.1:" in log, log[-2000:]
    pid, _ = launched_pid(log.rsplit("=====", 1)[-1])
    assert gone(pid) and len(wf.journal_lines("A")) == 6  # the 3 new prompts not asked
