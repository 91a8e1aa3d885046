"""scripts/migrate_journal.py (budgetgen.migration) as a real process on a journal written before
generation identities: killed with SIGKILL in the middle of writing the new file, it leaves the old
journal byte for byte (and a temporary file beside it); run again, it removes that file and ends with
the journal an uninterrupted migration makes; a third run changes nothing. It refuses to run beside a
job holding the journal's lock."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time

from support import REPO
from support.workflow import Workflow, base_config, write_prompts

MIGRATE = [sys.executable, str(REPO / "scripts" / "migrate_journal.py"), "--config", "config.yaml", "--dataset", "D"]


def legacy_journal(path, n):
    """n records as the release before identities wrote them (no identity; params say the settings)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        for i in range(n):
            f.write(json.dumps({"id": f"p{i}", "messages": [{"role": "user", "content": f"q {i}"},
                                                          {"role": "assistant", "content": "word " * 40}],
                                "finish_reason": "stop", "params": {"model": "mock-model", "max_tokens": 64},
                                "usage": {"prompt_tokens": 3, "completion_tokens": 41, "total_tokens": 44}}) + "\n")


def temporaries(directory):
    return sorted(n for n in os.listdir(directory) if n.startswith(".journal.jsonl.") and n.endswith(".tmp"))


def make(path, tokenizer):
    write_prompts(path / "prompts" / "D.jsonl", 3)
    return Workflow(path, base_config("http://127.0.0.1:9/v1", tokenizer, {"D": {"prompts": "prompts/D.jsonl"}}))


def test_a_kill_mid_migration_leaves_the_old_journal_and_a_rerun_completes_it(tmp_path, tiny_tokenizer):
    reference = make(tmp_path / "reference", tiny_tokenizer)
    legacy_journal(reference.path("results", "D", "journal.jsonl"), 1000)
    subprocess.run(MIGRATE, cwd=reference.dir, check=True, capture_output=True, timeout=120)
    n = 200_000
    for _ in range(3):  # the premise: killed while the new file is being written (a bigger file if it was done)
        wf = make(tmp_path / f"killed{n}", tiny_tokenizer)
        journal = wf.path("results", "D", "journal.jsonl")
        legacy_journal(journal, n)
        original = journal.read_bytes()
        proc = subprocess.Popen(MIGRATE, cwd=wf.dir, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        deadline = time.monotonic() + 120
        while proc.poll() is None and time.monotonic() < deadline:
            tmp = temporaries(journal.parent)
            if tmp and os.path.getsize(journal.parent / tmp[0]) > 0:
                proc.send_signal(signal.SIGKILL)
                break
            time.sleep(0.002)
        proc.wait(timeout=60)
        if proc.returncode == -signal.SIGKILL and temporaries(journal.parent):
            break
        n *= 2
    else:
        raise AssertionError("the migration always finished before it could be killed mid-write")
    assert journal.read_bytes() == original  # the old file, whole
    out = subprocess.run(MIGRATE, cwd=wf.dir, check=True, capture_output=True, text=True, timeout=300).stdout
    assert f"{n} of {n} records stamped" in out and temporaries(journal.parent) == []
    lines = journal.read_text().splitlines()
    assert len(lines) == n and lines[:1000] == reference.path("results", "D", "journal.jsonl").read_text().splitlines()
    assert all(list(json.loads(line))[:2] == ["id", "identity"] for line in lines[::997])
    migrated = journal.read_bytes()
    out = subprocess.run(MIGRATE, cwd=wf.dir, check=True, capture_output=True, text=True, timeout=300).stdout
    assert "nothing to do" in out and journal.read_bytes() == migrated
    shutil.rmtree(wf.dir)


def test_migration_refuses_beside_a_job_holding_the_lock(tmp_path, tiny_tokenizer):
    from budgetgen import journal as journal_module

    wf = make(tmp_path / "work", tiny_tokenizer)
    journal = wf.path("results", "D", "journal.jsonl")
    legacy_journal(journal, 3)
    lock = journal_module.JournalLock(journal).acquire()  # as a running inference job holds it
    try:
        p = subprocess.run(MIGRATE, cwd=wf.dir, capture_output=True, text=True, timeout=120)
    finally:
        lock.release()
    assert p.returncode != 0 and p.stderr.startswith("error: ") and "Traceback" not in p.stderr, p.stderr
    assert "identity" not in journal.read_text()
