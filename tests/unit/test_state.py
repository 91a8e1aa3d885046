"""budgetgen.state: the one definition of a dataset's state (fresh/partial/met/exhausted), the DAG-time
decision finalize's input makes, and the status table."""

import json
import os
import time

from budgetgen import state
from budgetgen.state import EXHAUSTED, FRESH, MET, PARTIAL, DatasetFiles


def files(tmp_path):
    return DatasetFiles(journal=str(tmp_path / "journal.jsonl"), done=str(tmp_path / "inference.done"),
                        status=str(tmp_path / "budget_status.json"), prompts=str(tmp_path / "prompts.jsonl"))


def write(path, obj, mtime=None):
    with open(path, "w") as f:
        f.write(obj if isinstance(obj, str) else json.dumps(obj))
    if mtime is not None:
        os.utime(path, (mtime, mtime))


def status(tokens, remaining, errored=None, journal_bytes=0):
    return {"tokens": tokens, "responses": tokens // 10, "remaining_prompts": remaining,
            "errored_by_params": errored or {}, "journal_bytes": journal_bytes}


def test_budget_state():
    assert state.budget_state(100, 100, False) == MET and state.budget_state(100, 100, True) == MET
    assert state.budget_state(99, 100, True) == EXHAUSTED and state.budget_state(99, 100, False) == PARTIAL


def test_exhausted_only_under_the_parameters_of_its_errors():
    s = status(5, 4, {"p1": 4, "p2": 1})
    assert state.exhausted_under(s, "p1") and not state.exhausted_under(s, "p2")
    assert state.exhausted_under(status(5, 0), "any")
    assert state.exhausted_under({"remaining_prompts": 3, "exhausted": True}, "p")  # an older status file


def test_decide_against_the_budget_now():
    # the done marker wins: a raised budget turns "met" into partial
    assert state.decide({"tokens": 500, "state": "met"}, None, 400, "p", False, True)[0] == MET
    assert state.decide({"tokens": 500, "state": "met"}, None, 900, "p", False, True)[0] == PARTIAL
    assert state.decide({"tokens": 500, "state": "exhausted"}, None, 900, "p", False, True)[0] == EXHAUSTED
    assert state.decide(None, None, 900, "p", False, False)[0] == FRESH
    assert state.decide(None, None, 900, "p", False, True)[0] == PARTIAL
    assert state.decide(None, status(0, 10), 900, "p", False, False)[0] == FRESH
    assert state.decide(None, status(950, 10), 900, "p", False, True)[0] == MET
    assert state.decide(None, status(50, 0), 900, "p", False, True)[0] == EXHAUSTED
    assert state.decide(None, status(50, 0), 900, "p", True, True)[0] == PARTIAL  # prompts added since
    assert state.decide(None, status(50, 2, {"p": 2}), 900, "p", False, True)[0] == EXHAUSTED
    assert state.decide(None, status(50, 2, {"old": 2}), 900, "p", False, True)[0] == PARTIAL


def test_finalize_reads_the_journal_only_when_the_checkpoint_says_met_or_exhausted(tmp_path):
    f = files(tmp_path)
    assert not state.finalize_from_journal(f, 100, "p", status(0, 5))  # no journal: inference first
    write(f.journal, "")
    write(f.prompts, "", mtime=time.time() - 100)
    write(f.status, status(150, 5))
    assert state.finalize_from_journal(f, 100, "p", status(150, 5))
    assert not state.finalize_from_journal(f, 200, "p", status(150, 5))  # budget raised
    assert state.finalize_from_journal(f, 200, "p", status(150, 0))  # no prompt left
    write(f.prompts, "", mtime=time.time() + 100)
    assert not state.finalize_from_journal(f, 200, "p", status(150, 0))  # ... until prompts are added
    write(f.done, {"tokens": 150, "state": "met"})
    assert not state.finalize_from_journal(f, 100, "p", status(150, 5))  # a finished job: through its marker


def test_status_row_counts_the_journal_when_the_status_is_older(tmp_path):
    f = files(tmp_path)
    write(f.prompts, "")
    assert state.status_row("D", f, 100, "p", None)[1:] == (0, 100, 100, 0, FRESH, False)
    write(f.journal, "x" * 10)
    write(f.status, status(0, 5, journal_bytes=10))
    assert state.status_row("D", f, 100, "p", None)[1:] == (0, 100, 100, 0, PARTIAL, False)  # up to date
    write(f.journal, "x" * 30)  # a run since (killed): the status says 0, the journal holds 120
    row = state.status_row("D", f, 100, "p", lambda path: (120, 12))
    assert row == ("D", 120, 100, 0, 12, "met (journal; not finalized)", True)
    table = state.format_status_table([row, ("E", 5, 10, 5, 1, PARTIAL, False)])
    assert table.splitlines()[1].split() == ["budgetgen:", "D", "120", "100", "0", "12", "met", "(journal;",
                                             "not", "finalized)"]
    assert table.splitlines()[-1].endswith("later run wrote to it: D)")


def test_looks_local():
    assert state.looks_local("/models/x") and state.looks_local("./tok") and state.looks_local("a/b/c")
    assert not state.looks_local("Qwen/Qwen3-8B")
