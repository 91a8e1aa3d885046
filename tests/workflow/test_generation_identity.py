"""One generation identity (budgetgen.identity) through real snakemake runs against the mock server: the
settings changes users make between runs (turn policy, history reasoning, temperature, samples per
prompt, max_tokens) are refused before any request unless generation.on_settings_change says how; the
rows, the budget and the provenance are those of the identity they were made under; the server is
proved to work in the run that records errors; journals written before identities are refused until
scripts/migrate_journal.py stamps them, then resume as they are."""

import json
import os
import subprocess
import sys

import pyarrow as pa
import pytest
from datasets import Dataset

from support import REPO
from support.workflow import Workflow, base_config, planned_inference, server_stats, write_conversations

pytestmark = pytest.mark.slow


def workflow(tmp_path, srv, tokenizer, prompts="conv", n=4, **generation):
    d = tmp_path / "work"
    d.mkdir()
    if prompts == "conv":
        write_conversations(d / "p.jsonl", n)
    else:
        (d / "p.jsonl").write_text("".join(json.dumps({"id": f"c{i}", "prompt": f"question number {i}: explain"})
                                           + "\n" for i in range(n)))
    generation = {"token_budget": 10**6, "max_tokens": 48, **generation}
    return Workflow(d, base_config(srv.base_url, tokenizer, {"D": {"prompts": "p.jsonl"}}, **generation))


def change(wf, **generation):
    wf.config["generation"].update(generation)
    wf.write_config()


def finished_files(wf):
    """{path: bytes} of every file of the workflow's results (the journal, rows, exports, plots, summary)."""
    return {str(p.relative_to(wf.dir)): p.read_bytes() for p in sorted(wf.path("results").rglob("*"))
            if p.is_file() and p.suffix != ".lock"}  # the lock file holds the last job's pid


def refused(wf, srv, *changed):
    """A run after a settings change: refused before any job starts, non-zero, a line naming each changed
    setting and the ways out, no request sent, nothing touched (journal, rows, plots, summary byte for
    byte); `-n` says the same in its status table. The inference job itself refuses (in one line, before
    it removes anything) when started some other way."""
    before_requests, before = server_stats(srv)["requests"], finished_files(wf)
    dry = wf.run("-n", "all")
    assert planned_inference(dry.output) == {"D"}
    row = next(line for line in dry.output.splitlines() if line.startswith("budgetgen: D "))
    assert "refused: settings changed (" in row and all(c in row for c in changed), row
    p = wf.run("--cores", "2", "all", check=False)
    lines = [line for line in p.output.splitlines() if line.startswith("dataset D: refused: settings changed")]
    assert p.returncode != 0 and len(lines) == 1, p.output[-3000:]
    assert all(c in lines[0] for c in changed), lines[0]
    assert "nothing was run and no output was removed" in p.output and "on_settings_change: regenerate" in p.output
    assert "Traceback" not in p.output and "rule inference" not in p.output
    assert server_stats(srv)["requests"] == before_requests
    assert finished_files(wf) == before
    # the job started by hand (as a cluster's retry would): one line, nothing removed either
    job = subprocess.run([sys.executable, str(REPO / "scripts" / "run_inference.py"), "--config", "config.yaml",
                          "--dataset", "D"], cwd=wf.dir, capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": str(REPO / "scripts")})
    errors = [line for line in job.stderr.splitlines() if line.startswith("error: ")]
    assert job.returncode != 0 and len(errors) == 1, job.stderr[-3000:]
    assert all(c in errors[0] for c in changed) and "nothing was requested" in errors[0], errors[0]
    assert server_stats(srv)["requests"] == before_requests
    assert finished_files(wf) == before


def provenance(wf):
    with pa.OSFile(str(wf.path("results", "D", "tokenized.arrow"))) as f:
        return json.loads(pa.ipc.open_stream(f).schema.metadata[b"budgetgen"])


def rows(wf):
    return Dataset.from_file(str(wf.path("results", "D", "tokenized.arrow")))


def test_turns_last_to_all_on_a_met_dataset_is_refused_then_regenerated_on_policy(tmp_path, server, tiny_tokenizer):
    """Measured case 1: the dataset's own assistant answers must never pass for on-policy turns."""
    srv = server("--mean-tokens", "10")
    wf = workflow(tmp_path, srv, tiny_tokenizer, token_budget=30, concurrency=1)
    wf.run("--cores", "2", "all")
    assert json.loads(wf.path("results", "D", "inference.done").read_text())["state"] == "met"
    old = len(wf.records("D"))
    change(wf, turns="all")
    refused(wf, srv, 'turns "last" -> "all"')
    change(wf, on_settings_change="regenerate")
    wf.run("--cores", "2", "all")
    done = json.loads(wf.path("results", "D", "inference.done").read_text())
    assert done["state"] == "met" and done["tokens"] >= 30
    new = wf.records("D")[old:]  # the records of this run
    now = new[0]["identity"]
    assert all(r["identity"] == now and "/t" in r["id"] for r in new)
    got = rows(wf)
    assert sorted(got["id"]) == sorted(r["id"] for r in new) and set(got["identity"]) == {now}
    assert not any("the dataset's answer" in json.dumps(r["messages"]) for r in new)  # the target's own turns
    meta = provenance(wf)
    assert [g["identity"] for g in meta["generation_settings"]] == [now]
    assert meta["generation_settings"][0]["settings"]["turns"] == "all"
    assert len(wf.records("D")) == old + len(new)  # the old records are still in the journal


def test_history_and_temperature_changed_on_an_exhausted_dataset_never_pass_as_the_new_settings(
        tmp_path, server, tiny_tokenizer):
    """Measured case 2: rows made with drop and the old temperature must not carry the new settings."""
    srv = server("--mean-tokens", "8", "--reasoning-share", "0.5")
    wf = workflow(tmp_path, srv, tiny_tokenizer, n=3, turns="all", temperature=0.6)
    wf.run("--cores", "2", "all")
    assert json.loads(wf.path("results", "D", "inference.done").read_text())["state"] == "exhausted"
    first = provenance(wf)["generation_settings"]
    assert len(first) == 1 and first[0]["settings"]["temperature"] == 0.6
    change(wf, history_reasoning="keep", temperature=0.7)
    refused(wf, srv, 'history_reasoning "drop" -> "keep"', "temperature 0.6 -> 0.7")
    # refused before any job: the rows, summary and provenance of the old settings are as they were (they
    # say temperature 0.6, and `-n` says refused), the journal keeps every record
    assert provenance(wf)["generation_settings"] == first and wf.path("results", "summary.tsv").exists()
    change(wf, on_settings_change="regenerate")
    wf.run("--cores", "2", "all")
    (made,) = provenance(wf)["generation_settings"]
    assert made["settings"]["temperature"] == 0.7 and made["settings"]["history_reasoning"] == "keep"
    assert made["records"] == 9 and set(rows(wf)["identity"]) == {made["identity"]}
    later = [r for r in wf.records("D") if r.get("identity") == made["identity"] and r["turn"] > 1]
    assert later and all("reasoning_content" in m for r in later for m in r["messages"][:-1]
                         if m["role"] == "assistant")  # keep: the earlier answers went back with reasoning


def test_samples_per_prompt_raised_is_refused_and_rows_carry_their_prompt(tmp_path, server, tiny_tokenizer):
    """Measured case 3: c0 and c0/s1, c0/s2 are three generations of one prompt: never mixed silently."""
    srv = server("--mean-tokens", "8", "--length-dist", "lognormal")
    wf = workflow(tmp_path, srv, tiny_tokenizer, prompts="plain", n=4, temperature=0.8)
    wf.run("--cores", "2", "all")
    assert sorted(rows(wf)["id"]) == ["c0", "c1", "c2", "c3"]
    change(wf, samples_per_prompt=2)
    refused(wf, srv, "samples_per_prompt 1 -> 2")
    change(wf, on_settings_change="regenerate")
    wf.run("--cores", "2", "all")
    got = rows(wf)
    assert sorted(got["id"]) == sorted(f"c{i}/s{s}" for i in range(4) for s in (1, 2))
    assert {rid: pid for rid, pid in zip(got["id"], got["prompt_id"])} == {
        f"c{i}/s{s}": f"c{i}" for i in range(4) for s in (1, 2)}  # a split by prompt cannot leak


def test_a_run_whose_every_request_is_refused_fails_in_one_line_never_exhausted(tmp_path, server, tiny_tokenizer):
    """Measured case 4: a record of an earlier run proves nothing about the settings of this one. With
    extend (the explicit way to go on after a change), max_tokens raised past the context: every request
    of the run is a 400; one journaled prompt is asked again to tell the prompts' errors from the
    settings', fails the same way, and the job fails naming the error and max_tokens; nothing recorded."""
    srv = server("--mean-tokens", "10", "--context-limit", "120")
    wf = workflow(tmp_path, srv, tiny_tokenizer, prompts="plain", n=10, token_budget=40, concurrency=1,
                  max_tokens=20)
    wf.run("--cores", "2", "all")
    kept = wf.records("D")
    assert json.loads(wf.path("results", "D", "inference.done").read_text())["state"] == "met" and len(kept) < 10
    change(wf, token_budget=10**6, max_tokens=200, on_settings_change="extend")
    p = wf.run("--cores", "2", "all", check=False)
    log = wf.path("logs", "inference", "D.last.log").read_text()
    errors = [line for line in log.splitlines() if line.startswith("error: ")]
    assert p.returncode != 0 and len(errors) == 1, log[-3000:]
    assert "answered before, now fails the same way (HTTP 400" in errors[0]
    assert "generation.max_tokens (200)" in errors[0] and "nothing recorded" in errors[0]
    assert not wf.path("results", "D", "errors.jsonl").exists() and wf.records("D") == kept
    assert not wf.path("results", "D", "inference.done").exists()
    change(wf, max_tokens=20)  # back to settings that fit: the extended run completes, exhausted
    wf.run("--cores", "2", "all")
    assert json.loads(wf.path("results", "D", "inference.done").read_text())["state"] == "exhausted"
    assert len(wf.records("D")) == 10


def test_non_content_settings_never_change_the_identity(tmp_path, server, tiny_tokenizer):
    srv = server("--mean-tokens", "10")
    wf = workflow(tmp_path, srv, tiny_tokenizer, prompts="plain", n=12, token_budget=40, concurrency=1)
    wf.run("--cores", "2", "all")
    change(wf, token_budget=80, concurrency=3)
    wf.config["server"].update(request_timeout_s=20, progress_interval_s=1)
    wf.write_config()
    wf.run("--cores", "2", "all")
    assert len({r["identity"] for r in wf.records("D")}) == 1
    assert json.loads(wf.path("results", "D", "inference.done").read_text())["tokens"] >= 80


def test_a_journal_written_before_identities_is_refused_then_migrated_and_resumes_without_regenerating(
        tmp_path, server, tiny_tokenizer):
    """Records without an identity are refused in one line naming scripts/migrate_journal.py, at -n and
    in the run, before any request; the migration stamps each with the identity its params imply
    (turns: all with 2 samples: the turns and history_reasoning in params, a sample field), a second
    migration changes nothing, and the run then regenerates nothing: the same rows, identities, prompt ids."""
    srv = server("--mean-tokens", "8")
    wf = workflow(tmp_path, srv, tiny_tokenizer, n=2, turns="all", samples_per_prompt=2)
    wf.run("--cores", "2", "all")
    before = rows(wf)
    journal = wf.path("results", "D", "journal.jsonl")
    legacy = []
    for r in wf.records("D"):  # as the release before identities wrote them
        for key in ("identity", "identity_settings", "prompt_id"):
            r.pop(key)
        r["params"].update(turns="all", history_reasoning="drop")
        legacy.append(json.dumps({"id": r.pop("id"), **{k: v for k, v in r.items() if k != "usage"},
                                  "usage": r["usage"]}) + "\n")
    journal.write_text("".join(legacy))
    for name in ("budget_status.json", "inference.done", "raw_responses.jsonl", "tokenized.arrow"):
        wf.path("results", "D", name).unlink()
    requests = server_stats(srv)["requests"]
    line = ("journal.jsonl:1: a record written before generation identities (no \"identity\"): migrate the dataset's "
            "journal once with `python scripts/migrate_journal.py --config CONFIG --dataset D`")
    for args in (("-n", "all"), ("--cores", "2", "all")):
        p = wf.run(*args, check=False)
        assert p.returncode != 0 and line in p.output and "Traceback" not in p.output, p.output[-3000:]
    assert server_stats(srv)["requests"] == requests
    migrate = [sys.executable, str(REPO / "scripts" / "migrate_journal.py"), "--config", "config.yaml",
               "--dataset", "D"]
    out = subprocess.run(migrate, cwd=wf.dir, capture_output=True, text=True, timeout=120, check=True).stdout
    assert f"{len(legacy)} of {len(legacy)} records stamped" in out
    migrated = journal.read_bytes()
    out = subprocess.run(migrate, cwd=wf.dir, capture_output=True, text=True, timeout=120, check=True).stdout
    assert "0 of" in out and "nothing to do" in out and journal.read_bytes() == migrated
    wf.run("--cores", "2", "all")
    assert server_stats(srv)["requests"] == requests
    after = rows(wf)
    assert after["id"] == before["id"] and after["input_ids"] == before["input_ids"]
    assert after["identity"] == before["identity"] and after["prompt_id"] == before["prompt_id"]
