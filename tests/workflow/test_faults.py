"""Server faults under real snakemake runs against a real mock server on 127.0.0.1: a fault mix with a
whole-server outage mid-run (completes, budget met, nothing twice, retries counted by kind in the
inference log), a server gone for good (fails within the deadline naming the URL, journal intact,
resumes once it is back), SIGTERM to the inference job (preemption) and a full disk under the journal."""

import ast
import json
import os
import re
import signal
import subprocess
import time

import pytest

from budgetgen_testkit import mock_server
from budgetgen_testkit.records import stamped
from support.jobs import job_cmd
from support.workflow import Workflow, base_config, server_stats, wait_for, write_prompts

pytestmark = pytest.mark.slow

SOAK = os.environ.get("BUDGETGEN_SOAK") == "1"  # on demand: a 60 s outage instead of 6 s


def make(tmp_path, base_url, tokenizer, n, **gen):
    wf_dir = tmp_path / "work"
    write_prompts(wf_dir / "prompts" / "F.jsonl", n, prefix="F")
    return Workflow(wf_dir, base_config(base_url, tokenizer, {"F": {"prompts": "prompts/F.jsonl"}}, **gen))


def done_line(log):
    """The inference log's final 'Done:' line: (total retries, {kind: count})."""
    m = re.search(r"Done: .* retries (\d+) (\{.*\})?", log)
    assert m, log[-3000:]
    return int(m.group(1)), ast.literal_eval(m.group(2)) if m.group(2) else {}


def journal_ids(wf):
    return [r["id"] for r in wf.records("F")]


def test_fault_mix_and_outage_mid_run_complete_with_budget_met_nothing_twice_and_retries_logged(
        tmp_path, server):
    """The inference job itself (no snakemake start-up in the timing): a backoff begun during the
    outage can last up to 30 s past it, which is most of this test's run time."""
    outage_for = 60 if SOAK else 6
    # 10 % HTTP 500, 5 % 429 + Retry-After, 5 % streams dropped mid-response, 1 % never answered
    # (the client's request_timeout_s must end them), and the listener down for outage_for seconds
    # while the job is generating (started once it has journaled 3 records).
    srv = server("--mean-tokens", "20", "--tokens-per-s", "20", "--fail-500", "0.10", "--fail-429", "0.05",
                 "--retry-after", "0.5", "--drop", "0.05", "--hang", "0.01", "--fault-seed", "11",
                 "--outage-for", outage_for)
    write_prompts(tmp_path / "prompts.jsonl", 400)
    journal = tmp_path / "results" / "d" / "journal.jsonl"
    t0 = time.monotonic()
    proc = subprocess.Popen(job_cmd(tmp_path, srv.base_url, budget=800, max_tokens=256, concurrency=4,
                                    request_timeout_s=2, unreachable_deadline_s=outage_for + 30),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        wait_for(lambda: journal.exists() and len(journal.read_text().splitlines()) >= 3, timeout=120,
                 what="3 records journaled")
        mock_server.outage(srv)
        at_outage = len(journal.read_text().splitlines())
        assert at_outage >= 3 and proc.poll() is None  # mid-run
        log, _ = proc.communicate(timeout=outage_for + 120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    wall = time.monotonic() - t0
    assert proc.returncode == 0, log[-4000:]
    recs = [json.loads(x) for x in journal.read_text().splitlines()]
    ids = [r["id"] for r in recs]
    assert len(ids) > at_outage and len(set(ids)) == len(ids)
    done = json.loads((tmp_path / "results" / "d" / "inference.done").read_text())
    tokens = sum(r["usage"]["completion_tokens"] for r in recs)
    assert done["state"] == "met" and done["tokens"] == tokens >= 800
    retries, kinds = done_line(log)
    faults = server_stats(srv)["faults"]
    assert retries == done["retries"] == sum(kinds.values())
    assert kinds["HTTP 500"] == faults["500"] > 0 and kinds["HTTP 429"] == faults["429"] > 0
    assert faults["drop"] > 0 and faults["hang"] > 0
    assert kinds.get("ConnectError", 0) > 0  # refused while the listener was down
    # a hung request ends by request_timeout_s (ReadTimeout), or by the outage's abort if it hung before
    # it; either way the run could not have finished with one still hanging
    # every other retry is a dropped stream, a hung request, or one cut by the outage's abort
    broken = retries - faults["500"] - faults["429"] - kinds["ConnectError"]
    assert broken >= faults["drop"]
    assert "error: " not in log and "giving up" not in log
    slowest = max(recs, key=lambda r: r["latency_s"])
    print(f"fault run: {wall:.1f} s, {len(ids)} responses, {tokens} tokens, retries {retries} {kinds}, "
          f"server faults {faults}; slowest response {slowest['latency_s']} s after {slowest['attempts']} attempts")


def test_hung_requests_are_ended_by_request_timeout_and_retried(tmp_path, server):
    """30 % of requests never answered; request_timeout_s 3 ends each (one ReadTimeout retry per hang; 3 s,
    so an answered request is never timed out on a loaded machine)."""
    write_prompts(tmp_path / "prompts.jsonl", 30)
    srv = server("--mean-tokens", "10", "--hang", "0.3", "--fault-seed", "5")
    t0 = time.monotonic()
    p = run_job(tmp_path, srv.base_url, budget=10**6, concurrency=8, request_timeout_s=3)
    assert p.returncode == 0, p.output[-3000:]
    retries, kinds = done_line(p.output)
    hangs = server_stats(srv)["faults"]["hang"]
    assert hangs > 0 and kinds == {"ReadTimeout": hangs} and retries == hangs
    assert len({json.loads(x)["id"]
                for x in (tmp_path / "results" / "d" / "journal.jsonl").read_text().splitlines()}) == 30
    print(f"hangs: {hangs} ended by the 3 s request timeout, run {time.monotonic() - t0:.1f} s")


def test_server_down_for_good_fails_within_deadline_naming_url_then_resumes_when_back(
        tmp_path, server, tiny_tokenizer):
    deadline = 5
    srv = server("--mean-tokens", "20", "--tokens-per-s", "40", "--outage-for", "3600")
    wf = make(tmp_path, srv.base_url, tiny_tokenizer, 300, token_budget=10**6, concurrency=4)
    wf.config["server"]["unreachable_deadline_s"] = deadline
    wf.write_config()
    proc = wf.start("--cores", "2", "results/F/raw_responses.jsonl")
    log_path = wf.path("logs", "inference", "F.log")
    try:
        # the outage right after a record is journaled (the deadline runs from the last success, so it
        # starts within one response of it), once the job is well under way however slow its start
        journal = wf.path("results", "F", "journal.jsonl")
        count = lambda: journal.read_bytes().count(b"\n") if journal.exists() else 0  # noqa: E731
        wait_for(lambda: count() >= 3, timeout=120, interval=0.05, what="3 records journaled")
        n = count()
        wait_for(lambda: count() > n, timeout=60, interval=0.01, what="one more record")
        t_down = time.monotonic()
        mock_server.outage(srv)
        wait_for(lambda: log_path.exists() and "error: " in log_path.read_text(), timeout=deadline + 60,
                 interval=0.05, what="the inference job's error line")
        failed_after = time.monotonic() - t_down
        assert proc.wait(timeout=60) != 0
    finally:
        if proc.poll() is None:
            wf.killpg(proc)
    log = log_path.read_text()
    errors = [line for line in log.splitlines() if "error: " in line]
    assert len(errors) == 1 and srv.base_url in errors[0] and f"deadline {deadline} s" in errors[0], log[-3000:]
    assert "Traceback" not in log
    # no success since the outage began: the deadline runs from the last response journaled before it
    assert deadline <= failed_after + 1.0 and failed_after <= deadline + 8, failed_after
    before = wf.journal_lines("F")  # all whole lines (journal_lines drops a torn tail; there is none)
    assert before and wf.path("results", "F", "journal.jsonl").read_text().endswith("\n")
    assert len({json.loads(x)["id"] for x in before}) == len(before)
    assert not wf.path("results", "F", "inference.done").exists()
    # the server comes back (a new one on the same port): the next run resumes and completes
    mock_server.stop(srv)
    back = server("--mean-tokens", "20", "--port", str(srv.port))
    assert back.base_url == srv.base_url
    wf.run("--cores", "2", "results/F/raw_responses.jsonl")
    after = wf.journal_lines("F")
    assert after[: len(before)] == before and len(after) == 300
    assert len(set(journal_ids(wf))) == 300
    assert f"Resuming: {len(before)} already done" in log_path.read_text()
    assert server_stats(back)["requests"] == 300 - len(before)  # nothing journaled was asked for again
    print(f"server down: job failed {failed_after:.1f} s after the outage (deadline {deadline} s): {errors[0]}")


def inference_pid(proc):
    """The pid of the inference job's python process under snakemake (same process group)."""
    from soak.soak import group_members

    found = [pid for pid, cmd in group_members(proc.pid) if "run_inference.py" in cmd and pid != proc.pid]
    return found[0] if found else None


def alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except FileNotFoundError:
        return False


@pytest.mark.parametrize("target", ["inference", "group"])
def test_sigterm_under_snakemake_stops_within_10s_and_resume_loses_nothing(
        tmp_path, server, tiny_tokenizer, target):
    """Preemption: SIGTERM to the inference job alone, or to the whole process group (what a batch
    scheduler's preemption sends to every process of the job)."""
    srv = server("--mean-tokens", "100", "--tokens-per-s", "50")
    wf = make(tmp_path, srv.base_url, tiny_tokenizer, 56, token_budget=10**6, concurrency=8)
    proc = wf.start("--cores", "2", "results/F/raw_responses.jsonl")
    try:
        wait_for(lambda: len(wf.journal_lines("F")) >= 10, timeout=90, what="10 journaled responses")
        pid = inference_pid(proc)
        assert pid, "no inference process in snakemake's process group"
        t0 = time.monotonic()
        if target == "inference":
            os.kill(pid, signal.SIGTERM)
        else:
            os.killpg(proc.pid, signal.SIGTERM)
        wait_for(lambda: not alive(pid), timeout=10, interval=0.02, what="the inference process to exit")
        job_exit_s = time.monotonic() - t0
        rc = proc.wait(timeout=60)
        snakemake_exit_s = time.monotonic() - t0
    finally:
        if proc.poll() is None:
            wf.killpg(proc)
    assert rc != 0
    log = wf.path("logs", "inference", "F.log").read_text()
    assert "SIGTERM received: stop dispatching" in log and "Stopped by SIGTERM: journal flushed" in log
    assert not wf.path("results", "F", "inference.done").exists()
    data = wf.path("results", "F", "journal.jsonl").read_bytes()
    assert data.endswith(b"\n")  # flushed whole
    kept = wf.journal_lines("F")
    m = re.search(r"Stopped by SIGTERM: journal flushed \((\d+) responses", log)
    assert m and int(m.group(1)) == len(kept)  # what the job said it kept is what is on disk
    requests_before = server_stats(srv)["requests"]
    wf.run("--cores", "2", "results/F/raw_responses.jsonl")  # no --unlock needed: snakemake exited cleanly
    after = wf.journal_lines("F")
    assert after[: len(kept)] == kept and len(after) == 56 and len(set(journal_ids(wf))) == 56
    assert f"Resuming: {len(kept)} already done" in wf.path("logs", "inference", "F.log").read_text()
    assert server_stats(srv)["requests"] - requests_before == 56 - len(kept)
    print(f"SIGTERM to {target}: inference exited {job_exit_s:.2f} s after, snakemake {snakemake_exit_s:.2f} s "
          f"(rc {rc}), {len(kept)} responses kept")


# -- disk full ---------------------------------------------------------------------------------------
@pytest.fixture
def small_fs(tmp_path):
    """mount(dir, size): a tmpfs of `size` on dir (root only), unmounted at teardown."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    mounted = []

    def mount(path, size):
        path.mkdir(parents=True, exist_ok=True)
        p = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                           capture_output=True, text=True)
        if p.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here: {p.stderr.strip()}")
        mounted.append(path)
        return path

    yield mount
    for path in reversed(mounted):
        if subprocess.run(["umount", str(path)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", str(path)], capture_output=True)


def fill(path, leave):
    """Fill the filesystem of `path` with a dummy file until `leave` bytes are free."""
    st = os.statvfs(path)
    free = st.f_bavail * st.f_frsize
    with open(path / "filler", "wb") as f:
        f.write(b"\0" * max(0, free - leave))
    return path / "filler"


def test_disk_full_under_the_journal_fails_clearly_without_torn_record_and_resumes(
        tmp_path, server, tiny_tokenizer, small_fs):
    srv = server("--mean-tokens", "150", "--tokens-per-s", "0")
    wf = make(tmp_path, srv.base_url, tiny_tokenizer, 150, token_budget=10**6, concurrency=4)
    results = small_fs(wf.path("results", "F"), "2m")  # the journal's filesystem
    filler = fill(results, 96 * 1024)
    p = wf.run("--cores", "2", "results/F/raw_responses.jsonl", check=False)
    assert p.returncode != 0
    log = wf.path("logs", "inference", "F.log").read_text()
    errors = [line for line in log.splitlines() if line.startswith("error: ")]
    assert errors == ["error: results/F/journal.jsonl: cannot append to journal (No space left on device)"], \
        log[-3000:]
    assert "Traceback" not in log
    data = wf.path("results", "F", "journal.jsonl").read_bytes()
    assert data.endswith(b"\n")  # no torn record past the last whole line
    kept = data.decode().splitlines(keepends=True)
    assert 0 < len(kept) < 150 and all(json.loads(x)["id"] for x in kept)
    assert not wf.path("results", "F", "inference.done").exists()
    filler.unlink()  # space returns
    wf.run("--cores", "2", "results/F/raw_responses.jsonl")
    after = wf.journal_lines("F")
    assert after[: len(kept)] == kept and len(after) == 150 and len(set(journal_ids(wf))) == 150
    assert len(wf.records("F", "raw_responses.jsonl")) == 150
    print(f"disk full: {errors[0]} ({len(kept)} whole records kept)")


def test_disk_full_at_finalize_fails_in_one_line_leaving_the_journal_and_resumes(
        tmp_path, server, tiny_tokenizer, small_fs):
    """raw_responses.jsonl lives next to the journal and is as large: a disk the journal just fits on
    fills at finalize."""
    srv = server("--mean-tokens", "150")
    wf = make(tmp_path, srv.base_url, tiny_tokenizer, 60, token_budget=10**6, concurrency=4)
    results = small_fs(wf.path("results", "F"), "2m")
    wf.run("--cores", "2", "results/F/inference.done")
    journal = wf.path("results", "F", "journal.jsonl").read_bytes()
    filler = fill(results, 0)
    p = wf.run("--cores", "2", "results/F/tokenized.arrow", check=False)
    assert p.returncode != 0
    log = wf.path("logs", "finalize", "F.log").read_text()
    assert log.strip().splitlines() == [
        "error: results/F/raw_responses.jsonl: cannot write (No space left on device); free space and rerun"], log
    assert wf.path("results", "F", "journal.jsonl").read_bytes() == journal
    assert not wf.path("results", "F", "raw_responses.jsonl").exists()
    assert not [f for f in os.listdir(results) if f.endswith(".tmp")]  # the partial copy was removed
    filler.unlink()
    wf.run("--cores", "2", "results/F/tokenized.arrow")
    assert len(wf.records("F", "raw_responses.jsonl")) == 60


def test_disk_full_every_writer_fails_in_one_line_naming_its_file(tmp_path, tiny_tokenizer, small_fs):
    """The other writers on the journal's filesystem, each run on a full disk: the status checkpoint,
    tokenize, and an inference rerun (its lock file) -- one `error:` line each, no traceback."""
    import sys

    from support import REPO

    d = small_fs(tmp_path / "results" / "F", "256k")  # the inference job's files: results/F under tmp_path
    write_prompts(tmp_path / "prompts.jsonl", 5)
    rec = stamped({"id": "a", "messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yes"}],
                   "finish_reason": "stop", "params": {"model": "m", "max_tokens": 8}, "served_model": "m",
                   "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}})
    (d / "journal.jsonl").write_text(json.dumps(rec) + "\n")
    (d / "raw_responses.jsonl").write_text(json.dumps(rec) + "\n")
    fill(d, 0)
    py, s = sys.executable, REPO / "scripts"
    inference = job_cmd(tmp_path, "http://127.0.0.1:9/v1", dataset="F", budget=100, model="m", tokenizer=tiny_tokenizer)
    runs = {
        "budget_status.json": [py, s / "budget_status.py", "--config", tmp_path / "config.yaml", "--dataset", "F",
                               "-d", tmp_path],
        "tokenized.arrow": [py, s / "tokenize_responses.py", "--config", tmp_path / "config.yaml", "--dataset", "F",
                            "-d", tmp_path],
        "journal.jsonl.lock": inference,
    }
    for name, cmd in runs.items():
        p = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=120)
        err = [line for line in p.stderr.splitlines() if line.startswith("error: ")]
        assert p.returncode == 2 and "Traceback" not in p.stderr, p.stderr[-2000:]
        where = f"results/F/{name}"  # the jobs' own (relative) paths
        assert len(err) == 1 and err[0].startswith(f"error: {where}: cannot write"), err
        assert "No space left on device" in err[0]
    assert sorted(os.listdir(d)) == ["filler", "journal.jsonl", "journal.jsonl.lock", "raw_responses.jsonl"]  # no temp


# -- retry accounting (direct runs of the inference job) ---------------------------------------------
def run_job(tmp_path, base_url, **kw):
    p = subprocess.run(job_cmd(tmp_path, base_url, **kw), capture_output=True, text=True, timeout=120)
    p.output = p.stdout + p.stderr
    return p


def test_connection_errors_of_an_outage_do_not_use_up_max_retries(tmp_path, server):
    """One request: cut by the outage (a retry), refused while the listener is down (connection
    errors, retried until the deadline), then a 500 (fault seed 14: request #1 fine, #2 a 500, #3
    fine) -- 2 HTTP/stream retries, within max_retries 2. Counting the connection errors too gave up
    on the prompt after the outage and failed the run."""
    write_prompts(tmp_path / "prompts.jsonl", 1)
    srv = server("--mean-tokens", "100", "--tokens-per-s", "20", "--outage-for", "4",
                 "--fail-500", "0.5", "--fault-seed", "14")
    proc = subprocess.Popen(job_cmd(tmp_path, srv.base_url, budget=10**6, max_retries=2, concurrency=1,
                                    startup_wait_s=10, unreachable_deadline_s=60),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:  # the outage while request #1 streams (its tokens reached the client), however late it started
        wait_for(lambda: server_stats(srv)["active"] == 1 and server_stats(srv)["tokens_generated"] > 0,
                 timeout=120, interval=0.05, what="request #1 streaming")
        mock_server.outage(srv)
        output, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    p = subprocess.CompletedProcess(proc.args, proc.returncode, output)
    p.output = output
    assert p.returncode == 0 and "giving up" not in p.output, p.output[-3000:]
    retries, kinds = done_line(p.output)
    assert kinds.get("ConnectError", 0) >= 2 and kinds["HTTP 500"] == 1
    assert retries - kinds["ConnectError"] == 2  # the cut stream and the 500
    assert json.loads((tmp_path / "results" / "d" / "inference.done").read_text())["state"] == "exhausted"
    assert len((tmp_path / "results" / "d" / "journal.jsonl").read_text().splitlines()) == 1


def test_budget_met_despite_a_prompt_out_of_retries_is_success(tmp_path, server):
    """max_retries 0 and request #1 a 500 (fault seed 9): that prompt is deferred, the next two meet
    the budget; the job is done (met), not failed with 'rerun to retry them'."""
    write_prompts(tmp_path / "prompts.jsonl", 10)
    srv = server("--mean-tokens", "20", "--fail-500", "0.5", "--fault-seed", "9")
    p = run_job(tmp_path, srv.base_url, budget=40, max_retries=0, concurrency=1, max_tokens=64)
    assert p.returncode == 0, p.output[-3000:]
    assert "giving up on " in p.output  # the scenario happened
    done = json.loads((tmp_path / "results" / "d" / "inference.done").read_text())
    assert done["state"] == "met" and done["tokens"] >= 40


# -- a torn errors.jsonl (issue 12 item 6) ------------------------------------------------------------
def test_torn_large_error_record_is_dropped_and_later_error_records_are_whole_lines(tmp_path, server):
    """errors.jsonl after a kill during the append of a large error record (a prompt past the
    context, ~1 MB, recorded with its messages): the head of that record is left at the tail. The
    next run (prompts added meanwhile) must drop the torn bytes, ask for that prompt again (its error
    was never recorded) and append the new error as a line of its own; every later run reads the
    file. Before the fix the new record was glued onto the torn head, and every later run failed
    with `errors.jsonl:3: corrupt journal record`."""
    prompts = tmp_path / "prompts.jsonl"
    write_prompts(prompts, 9)
    with open(prompts, "a") as f:  # three prompts far past the context: permanent 400s
        for i in range(3):
            f.write(json.dumps({"id": f"big{i}", "prompt": f"big {i} " + "word " * 250_000}) + "\n")
    srv = server("--mean-tokens", "20", "--context-limit", "100000")
    errors = tmp_path / "results" / "d" / "errors.jsonl"

    def error_lines():
        data = errors.read_bytes()
        assert data.endswith(b"\n"), "errors.jsonl does not end on a whole line"
        return [json.loads(line) for line in data.splitlines()]  # every line must parse

    p = run_job(tmp_path, srv.base_url, budget=10**6, concurrency=2, max_tokens=64)
    assert p.returncode == 0, p.output[-3000:]
    first = error_lines()
    assert sorted(r["id"] for r in first) == ["big0", "big1", "big2"] and len(journal_ids_of(tmp_path)) == 9
    # a kill -9 in the middle of the last record's write: whole lines before it, then half of it
    data = errors.read_bytes()
    last = data[data.rstrip(b"\n").rfind(b"\n") + 1:]
    assert len(last) > 1_000_000  # a large record: the kernel copies it page by page, a kill can cut it
    whole, torn = data[: len(data) - len(last)], last[: len(last) // 2]
    errors.write_bytes(whole + torn)
    torn_id = first[-1]["id"]

    write_prompts(tmp_path / "more.jsonl", 6, prefix="more")  # prompts added before the rerun
    with open(prompts, "a") as f:
        f.write((tmp_path / "more.jsonl").read_text())
    before = server_stats(srv)["requests"]
    p = run_job(tmp_path, srv.base_url, budget=10**6, concurrency=2, max_tokens=64)
    assert p.returncode == 0, p.output[-3000:]
    assert "Traceback" not in p.output and "corrupt" not in p.output
    assert server_stats(srv)["requests"] - before == 7  # the 6 new prompts and the torn one, once
    data = errors.read_bytes()
    rest = data[len(whole):]  # the whole lines kept; after them exactly one new record, not torn + record
    assert data.startswith(whole) and rest.count(b"\n") == 1 and rest.count(b'{"id": ') == 1
    after = error_lines()
    assert [r["id"] for r in after] == [r["id"] for r in first[:-1]] + [torn_id]  # each once, in order
    assert after[-1]["status"] == 400 and after[-1]["messages"] == first[-1]["messages"]
    assert len(journal_ids_of(tmp_path)) == len(set(journal_ids_of(tmp_path))) == 15

    before = server_stats(srv)["requests"]  # and every later run reads the file
    p = run_job(tmp_path, srv.base_url, budget=10**6, concurrency=2, max_tokens=64)
    assert p.returncode == 0 and "corrupt" not in p.output, p.output[-3000:]
    assert server_stats(srv)["requests"] == before  # nothing left to ask: errors are not retried
    assert error_lines() == after


def journal_ids_of(tmp_path):
    return [json.loads(line)["id"] for line in (tmp_path / "results" / "d" / "journal.jsonl").read_text().splitlines()]
