"""Several servers behind one job (server.base_url as a list), and several datasets against one server
(the server_slots resource): real mock servers on loopback, the real inference job, real snakemake."""

import json
import os
import re
import signal
import subprocess
import time

from budgetgen_testkit import mock_server
from support.jobs import job_cmd
from support.workflow import Workflow, base_config, server_stats, wait_for, write_prompts


def job(tmp_path, urls, budget=10**6, **kw):
    kw = {"max_tokens": 64, "concurrency": 8, "startup_wait_s": 0, "unreachable_deadline_s": 30, **kw}
    return job_cmd(tmp_path, list(urls), budget=budget, **kw)


def records(tmp_path):
    return [json.loads(x) for x in (tmp_path / "results" / "d" / "journal.jsonl").read_text().splitlines()]


def test_requests_go_to_the_least_loaded_endpoint_with_a_per_endpoint_cap(tmp_path, server):
    write_prompts(tmp_path / "prompts.jsonl", 60)
    a, b = (server("--tokens-per-s", "400", "--mean-tokens", "20"),
            server("--tokens-per-s", "400", "--mean-tokens", "20"))
    p = subprocess.run(job(tmp_path, [a.base_url, b.base_url], endpoint_concurrency=3), capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 0, p.stdout[-3000:]
    sa, sb = server_stats(a), server_stats(b)
    assert sa["completed"] + sb["completed"] == 60 and len({r["id"] for r in records(tmp_path)}) == 60
    # equal servers share the work; neither ever had more than its cap of 3 (the job's concurrency is 8)
    assert 20 <= sa["completed"] <= 40 and 20 <= sb["completed"] <= 40, (sa["completed"], sb["completed"])
    assert sa["max_active"] <= 3 and sb["max_active"] <= 3
    assert "Requests per endpoint:" in p.stdout and "(3 per endpoint)" in p.stdout


def test_an_endpoint_that_dies_is_taken_out_and_probed_back_in(tmp_path, server):
    """B dies mid-run: its requests fail over to A, nothing is lost or doubled; B comes back on the same
    port and, after a probe, gets requests again."""
    write_prompts(tmp_path / "prompts.jsonl", 150)
    args = ["--tokens-per-s", "100", "--mean-tokens", "20"]
    a = server(*args)
    b_dir = tmp_path / "b"
    b, b_url = mock_server.spawn(args, b_dir)
    port = b_url.split(":")[-1].split("/")[0]
    log = open(tmp_path / "job.out", "w")
    proc = subprocess.Popen(job(tmp_path, [a.base_url, b_url], endpoint_recheck_s=0.5), stdout=log,
                            stderr=subprocess.STDOUT)
    journal = tmp_path / "results" / "d" / "journal.jsonl"
    out = lambda: (tmp_path / "job.out").read_text()  # noqa: E731
    b2 = None
    try:
        wait_for(lambda: journal.exists() and len(journal.read_text().splitlines()) >= 20, timeout=120,
                 interval=0.05, what="20 records journaled")
        b.kill()  # the server process dies: open streams break, new connections are refused
        b.wait()
        wait_for(lambda: f"endpoint {b_url} taken out" in out(), timeout=60, what="B taken out")
        # A is frozen while B comes back, so the job cannot finish on A alone before B is probed back in
        # (A answers the rest in ~3 s: on a loaded machine that was before B's revival)
        os.kill(a.pid, signal.SIGSTOP)
        try:
            b2, _ = mock_server.spawn([*args, "--port", port], tmp_path / "b2")  # same port, a fresh process
            wait_for(lambda: f"endpoint {b_url} back in service" in out(), timeout=60, what="B back in service")
            wait_for(lambda: server_stats(type("S", (), {"base_url": b_url})())["completed"] > 0, timeout=60,
                     what="the revived endpoint completing a request")
        finally:
            os.kill(a.pid, signal.SIGCONT)
        rc = proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
        if b2 is not None:
            mock_server.stop(b2)
    assert rc == 0, out()[-4000:]
    assert f"endpoint {b_url} taken out" in out() and f"endpoint {b_url} back in service" in out(), out()[-4000:]
    recs = records(tmp_path)
    assert len(recs) == 150 and len({r["id"] for r in recs}) == 150


def test_all_endpoints_down_at_start_is_one_line_naming_them(tmp_path):
    write_prompts(tmp_path / "prompts.jsonl", 5)
    p = subprocess.run(job(tmp_path, ["http://127.0.0.1:9/v1", "http://127.0.0.1:7/v1"]), capture_output=True,
                       text=True, timeout=60)
    assert p.returncode == 2
    err = [x for x in p.stderr.splitlines() if x.startswith("error:")]
    assert len(err) == 1 and "no server reachable" in err[0], p.stderr
    assert "127.0.0.1:9/v1/models" in err[0] and "127.0.0.1:7/v1/models" in err[0]


def inference_windows(wf, names):
    """(start, end) of each dataset's inference, from its log's timestamps."""
    out = {}
    for name in names:
        stamps = re.findall(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d) ", wf.path("logs", "inference", f"{name}.log")
                            .read_text(), re.M)
        t = [time.mktime(time.strptime(s, "%Y-%m-%d %H:%M:%S")) for s in stamps]
        out[name] = (min(t), max(t))
    return out


def test_two_datasets_share_one_server_through_the_slot_resource(tmp_path, server, tiny_tokenizer):
    """--resources server_slots=8 with two datasets of concurrency 4: both inference jobs run at once,
    and the server never sees more than 8 requests; with server_slots=4 they run one after another."""
    # 3 s responses, 3 waves: each job streams ~9 s, so the two overlap even when a loaded machine starts
    # the second seconds after the first
    srv = server("--tokens-per-s", "10", "--mean-tokens", "30", "--slots", "8")
    for name in ("A", "B"):
        write_prompts(tmp_path / "w" / "prompts" / f"{name}.jsonl", 12, prefix=name)
    datasets = {n: {"prompts": f"prompts/{n}.jsonl"} for n in ("A", "B")}
    wf = Workflow(tmp_path / "w", base_config(srv.base_url, tiny_tokenizer, datasets, token_budget=10**6,
                                              concurrency=4))
    proc = wf.run("--cores", "4", "--resources=server_slots=8", "results/A/raw_responses.jsonl",
                  "results/B/raw_responses.jsonl")
    assert proc.returncode == 0
    stats = server_stats(srv)
    assert stats["max_active"] == 8 and stats["waiting"] == 0, stats["max_active"]
    (a0, a1), (b0, b1) = inference_windows(wf, "AB").values()
    assert a0 < b1 and b0 < a1, "the two inference jobs did not overlap"
    # with room for one job only, they do not overlap and the server sees 4 at most
    srv2 = server("--tokens-per-s", "60", "--mean-tokens", "30", "--slots", "8")
    wf2 = Workflow(tmp_path / "w2", {**wf.config, "server": {**wf.config["server"], "base_url": srv2.base_url}})
    for name in ("A", "B"):
        write_prompts(wf2.dir / "prompts" / f"{name}.jsonl", 24, prefix=name)
    assert wf2.run("--cores", "4", "--resources=server_slots=4", "results/A/raw_responses.jsonl",
                   "results/B/raw_responses.jsonl").returncode == 0
    assert server_stats(srv2)["max_active"] == 4
    (a0, a1), (b0, b1) = inference_windows(wf2, "AB").values()
    assert a1 <= b0 or b1 <= a0


def test_workflow_with_a_list_of_base_urls_uses_every_endpoint(tmp_path, server, tiny_tokenizer):
    a, b = (server("--mean-tokens", "12", "--tokens-per-s", "200"),
            server("--mean-tokens", "12", "--tokens-per-s", "200"))
    write_prompts(tmp_path / "prompts" / "A.jsonl", 40)
    config = base_config([a.base_url, b.base_url], tiny_tokenizer, {"A": {"prompts": "prompts/A.jsonl"}},
                         token_budget=10**6)
    wf = Workflow(tmp_path, config)
    wf.run("--cores", "1", "results/A/raw_responses.jsonl")
    assert server_stats(a)["completed"] > 5 and server_stats(b)["completed"] > 5
    assert server_stats(a)["completed"] + server_stats(b)["completed"] == 40
    assert "Requests per endpoint:" in wf.path("logs", "inference", "A.log").read_text()
