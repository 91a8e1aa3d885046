"""Real snakemake runs of the workflow (-s REPO/Snakefile -d WORKDIR) against a real mock server."""

import json
import os
import re
import shutil
import signal
import subprocess
import sys

import pyarrow as pa
import pytest
from datasets import Dataset

from support import REPO
from support.workflow import (
    Workflow,
    base_config,
    planned_inference,
    planned_jobs,
    server_stats,
    wait_for,
    write_prompts,
)

pytestmark = pytest.mark.slow


def make(tmp_path, srv, tokenizer, datasets, prompts, **gen):
    wf_dir = tmp_path / "work"
    for name, n in prompts.items():
        write_prompts(wf_dir / "prompts" / f"{name}.jsonl", n, prefix=name)
    ds = {name: {"prompts": f"prompts/{name}.jsonl", **datasets.get(name, {})} for name in prompts}
    return Workflow(wf_dir, base_config(srv.base_url, tokenizer, ds, **gen))


def ids(records):
    return [r["id"] for r in records]


def test_full_run_then_nothing_to_do(tmp_path, server, tiny_tokenizer):
    srv = server("--length-dist", "lognormal", "--mean-tokens", "40", "--reasoning-share", "0.3")
    wf = make(tmp_path, srv, tiny_tokenizer, {"A": {"token_budget": 1500}, "B": {"token_budget": 10**6}},
              {"A": 200, "B": 12})
    wf.run("--cores", "2", "all")
    a_journal, a_raw = wf.records("A"), wf.records("A", "raw_responses.jsonl")
    assert sorted(ids(a_journal)) == sorted(ids(a_raw)) and len(set(ids(a_raw))) == len(a_raw)
    assert 1500 <= sum(r["usage"]["completion_tokens"] for r in a_raw) < 1500 + 8 * 256
    assert len(wf.records("B", "raw_responses.jsonl")) == 12  # exhausted
    for name, n in (("A", len(a_raw)), ("B", 12)):
        ds = Dataset.from_file(str(wf.path("results", name, "tokenized.arrow")))
        assert ds.num_rows == n and {"id", "input_ids", "loss_mask", "num_tokens"} <= set(ds.column_names)
    summary = wf.path("results", "summary.tsv").read_text().splitlines()
    header = summary[0].split("\t")
    rows = {r.split("\t")[0]: dict(zip(header, r.split("\t"))) for r in summary[1:]}
    assert rows["A"]["status"] == "met" and rows["B"]["status"] == "exhausted"
    assert rows["A"]["tokenize_skipped"] == rows["B"]["tokenize_skipped"] == "0"  # skips per reason, none
    assert int(rows["B"]["responses"]) == 12
    log = wf.path("logs", "inference", "A.log").read_text()
    assert "Resuming: 0 already done (0 tokens)" in log and "progress:" in log and "ETA" in log
    dry = wf.run("-n", "all")
    assert "Nothing to be done" in dry.output
    assert "budgetgen: A" in dry.output  # per-dataset status table at DAG time


def test_dry_run_lists_only_unfinished_dataset_and_budget_raise_resumes(tmp_path, server, tiny_tokenizer):
    srv = server("--mean-tokens", "30")
    wf = make(tmp_path, srv, tiny_tokenizer, {}, {"B1": 100, "B2": 100, "B3": 100}, token_budget=600)
    fresh = wf.run("-n", "all")
    assert planned_inference(fresh.output) == {"B1", "B2", "B3"}  # fresh tree: no <TBD> hiding them
    # as a user types it, under the quiet profile: Snakemake's job stats, no rule blocks; no cluster lines
    plain = wf.run("-n", "all", listing=False).output
    assert re.search(r"^Job stats:\n(?:.*\n)*?inference\s+3$", plain, re.M), plain[-3000:]
    assert "rule inference:" not in plain and "not as cluster jobs" not in plain and "warning:" not in plain
    run = wf.run("--cores", "2", "all").output
    assert "Job stats" not in run and "rule inference:" not in run  # a run stays as quiet as before
    # B3 half done, as a crash mid-inference leaves it: a partial journal, no done marker and
    # no final files yet, and a status of at most the journal's tokens (a killed job leaves the one the
    # checkpoint wrote before it; one that ends rewrites it): here the checkpoint script's own count
    lines = wf.journal_lines("B3")
    wf.path("results", "B3", "journal.jsonl").write_text("".join(lines[: len(lines) // 2]))
    for name in ("inference.done", "raw_responses.jsonl", "tokenized.arrow"):
        wf.path("results", "B3", name).unlink()
    subprocess.run([sys.executable, str(REPO / "scripts" / "budget_status.py"), "--config", "config.yaml",
                    "--dataset", "B3"], cwd=wf.dir, check=True, capture_output=True,
                   env={**os.environ, "PYTHONPATH": str(REPO / "scripts")})
    dry = wf.run("-n", "all")
    assert planned_inference(dry.output) == {"B3"}
    assert planned_jobs(dry.output).get("inference") == 1
    wf.run("--cores", "2", "all")
    log = wf.path("logs", "inference", "B3.log").read_text()
    assert f"Resuming: {len(lines) // 2} already done" in log
    assert "Nothing to be done" in wf.run("-n", "all").output
    # raise B2's budget: its work reappears, resumes, and only new prompts are generated
    before = wf.records("B2")
    requests = server_stats(srv)["requests"]
    wf.config["datasets"]["B2"]["token_budget"] = 1500
    wf.write_config()
    dry = wf.run("-n", "all")
    assert planned_inference(dry.output) == {"B2"}
    wf.run("--cores", "2", "all")
    after = wf.records("B2")
    assert after[: len(before)] == before and len(set(ids(after))) == len(after)
    assert sum(r["usage"]["completion_tokens"] for r in after) >= 1500
    assert server_stats(srv)["requests"] - requests == len(after) - len(before)
    # lowering it never deletes data
    wf.config["datasets"]["B2"]["token_budget"] = 100
    wf.write_config()
    wf.run("--cores", "2", "all")
    assert len(wf.records("B2", "raw_responses.jsonl")) == len(after)


def test_met_journal_is_finalized_without_inference_job(tmp_path, server, tiny_tokenizer):
    srv = server("--mean-tokens", "30")
    wf = make(tmp_path, srv, tiny_tokenizer, {}, {"M": 50}, token_budget=300)
    # a journal brought from elsewhere that already meets the budget
    (wf.path("results", "M")).mkdir(parents=True)
    src = tmp_path / "src"
    src.mkdir()
    import subprocess

    from support.jobs import job_cmd

    cmd = job_cmd(src, srv.base_url, dataset="M", prompts=wf.path("prompts", "M.jsonl"), budget=300, max_tokens=256)
    subprocess.run(cmd, check=True, capture_output=True)
    shutil.copy(src / "results" / "M" / "journal.jsonl", wf.path("results", "M", "journal.jsonl"))
    requests = server_stats(srv)["requests"]
    out = wf.run("--cores", "2", "all").output
    assert "rule inference" not in out and not wf.path("logs", "inference", "M.log").exists()
    assert server_stats(srv)["requests"] == requests
    assert sorted(ids(wf.records("M", "raw_responses.jsonl"))) == sorted(ids(wf.records("M")))
    assert "Nothing to be done" in wf.run("-n", "all").output


def test_kill_9_of_the_process_group_mid_inference_then_resume(tmp_path, server, tiny_tokenizer):
    srv = server("--mean-tokens", "40", "--tokens-per-s", "100")
    wf = make(tmp_path, srv, tiny_tokenizer, {}, {"K": 200}, token_budget=2500, concurrency=4)
    proc = wf.start("--cores", "2", "all")
    wait_for(lambda: len(wf.journal_lines("K")) >= 5, timeout=120, what="5 journaled responses")
    wf.killpg(proc, signal.SIGKILL)  # returns once every process of the group is gone
    before = wf.journal_lines("K")
    assert not wf.path("results", "K", "inference.done").exists()
    dry = wf.run("-n", "all")  # works despite the stale lock, and lists the interrupted inference
    assert planned_inference(dry.output) == {"K"}
    blocked = wf.run("--cores", "2", "all", check=False)
    assert blocked.returncode != 0 and "--unlock" in blocked.output
    wf.run("--unlock")
    wf.run("--cores", "2", "all")
    after = wf.records("K")
    assert [json.dumps(r) for r in after[: len(before)]] == [json.dumps(json.loads(x)) for x in before]
    assert len(set(ids(after))) == len(after)
    raw = wf.records("K", "raw_responses.jsonl")
    assert sorted(ids(raw)) == sorted(ids(after))
    assert sum(r["usage"]["completion_tokens"] for r in raw) >= 2500
    assert f"Resuming: {len(before)} already done" in wf.path("logs", "inference", "K.log").read_text()
    with pa.memory_map(str(wf.path("results", "K", "tokenized.arrow"))) as f:
        assert pa.ipc.open_stream(f).read_all().num_rows == len(raw)


def test_unreachable_server_fails_clearly(tmp_path, server, tiny_tokenizer):
    import socket

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    srv = server()
    wf = make(tmp_path, srv, tiny_tokenizer, {}, {"U": 5})
    wf.config["server"]["base_url"] = f"http://127.0.0.1:{port}/v1"
    wf.config["server"]["startup_wait_s"] = 0
    wf.write_config()
    p = wf.run("--cores", "1", "all", check=False)
    assert p.returncode != 0
    log = wf.path("logs", "inference", "U.log").read_text()
    errors = [line for line in log.splitlines() if line.startswith("error:")]
    assert errors == [f"error: server unreachable at http://127.0.0.1:{port}/v1/models (ConnectError: "
                      + errors[0].split("(ConnectError: ", 1)[1]]
    assert "Traceback" not in log


def test_config_errors_name_the_key(tmp_path, server, tiny_tokenizer):
    srv = server()
    wf = make(tmp_path, srv, tiny_tokenizer, {}, {"ok": 3})
    wf.config["datasets"]["bad/name"] = {"prompts": "prompts/ok.jsonl"}
    wf.write_config()
    p = wf.run("-n", "all", check=False)
    assert p.returncode != 0 and "bad/name" in p.output and "does not match" in p.output
    del wf.config["datasets"]["bad/name"]
    wf.config["datasets"]["ok"]["prompts"] = "prompts/missing.jsonl"
    wf.write_config()
    p = wf.run("-n", "all", check=False)
    assert p.returncode != 0 and "config key datasets.ok.prompts: file not found: prompts/missing.jsonl" in p.output
    wf.config["datasets"]["ok"]["prompts"] = "prompts/ok.jsonl"
    wf.config["generation"]["concurrency"] = "many"
    wf.write_config()
    p = wf.run("-n", "all", check=False)
    assert p.returncode != 0 and "'many' is not of type 'integer'" in p.output


def test_tokenizer_edited_in_place_reruns_tokenize_only(tmp_path, server, tiny_tokenizer):
    srv = server("--mean-tokens", "10")
    tok = tmp_path / "tok"
    shutil.copytree(tiny_tokenizer, tok)
    wf = make(tmp_path, srv, tok, {}, {"A": 6}, token_budget=10**6)
    wf.run("--cores", "2", "all")
    template = tok / "chat_template.jinja"
    template.write_text(template.read_text().replace("<|im_start|>", "<|im_start|> "))
    dry = wf.run("-n", "all")
    jobs = planned_jobs(dry.output)
    assert jobs.get("tokenize") == 1 and "inference" not in jobs
