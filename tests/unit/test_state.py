"""budgetgen.state: the one definition of a dataset's state (fresh/partial/met/exhausted/refused), the
DAG-time decision finalize's input makes, and the status table."""

import json
import os
import time

from budgetgen import state
from budgetgen.identity import Identity, IdentityCount, Policy
from budgetgen.journal import JournalState
from budgetgen.state import EXHAUSTED, FRESH, MET, PARTIAL, REFUSED, DatasetFiles

KEY = {"identity": "p", "on_settings_change": "refuse"}  # the policy key counts were made under


def files(tmp_path):
    return DatasetFiles(journal=str(tmp_path / "journal.jsonl"), done=str(tmp_path / "inference.done"),
                        status=str(tmp_path / "budget_status.json"), prompts=str(tmp_path / "prompts.jsonl"))


def write(path, obj, mtime=None):
    with open(path, "w") as f:
        f.write(obj if isinstance(obj, str) else json.dumps(obj))
    if mtime is not None:
        os.utime(path, (mtime, mtime))


def status(tokens, remaining, errored=0, journal_bytes=0, key=KEY, refused=None):
    return {"tokens": tokens, "responses": tokens // 10, "remaining_prompts": remaining, "errored": errored,
            "exhausted": remaining - errored <= 0, "journal_bytes": journal_bytes, "refused": refused,
            "settings_changed": ["temperature 0.6 -> 0.7"] if refused else None, **key}


def test_budget_state():
    assert state.budget_state(100, 100, False) == MET and state.budget_state(100, 100, True) == MET
    assert state.budget_state(99, 100, True) == EXHAUSTED and state.budget_state(99, 100, False) == PARTIAL


def test_counts_made_under_other_settings_say_nothing():
    """A status or done marker is trusted only under the identity and on_settings_change it was counted
    under: one written before identities (no key), or under other settings, leaves the job to decide."""
    other = {"identity": "q", "on_settings_change": "refuse"}
    assert state.decide({"tokens": 500, "state": "met", **other}, None, 400, KEY, False, True)[0] == PARTIAL
    assert state.decide({"tokens": 500, "state": "met"}, None, 400, KEY, False, True)[0] == PARTIAL
    assert state.decide(None, status(950, 10, key=other), 900, KEY, False, True)[0] == PARTIAL
    assert state.decide(None, status(50, 0, key={**KEY, "on_settings_change": "extend"}), 900, KEY, False,
                        True)[0] == PARTIAL
    assert state.decide(None, status(50, 0, key=other), 900, KEY, False, False)[0] == FRESH


def test_decide_against_the_budget_now():
    # the done marker wins: a raised budget turns "met" into partial
    assert state.decide({"tokens": 500, "state": "met", **KEY}, None, 400, KEY, False, True)[0] == MET
    assert state.decide({"tokens": 500, "state": "met", **KEY}, None, 900, KEY, False, True)[0] == PARTIAL
    assert state.decide({"tokens": 500, "state": "exhausted", **KEY}, None, 900, KEY, False, True)[0] == EXHAUSTED
    assert state.decide(None, None, 900, KEY, False, False)[0] == FRESH
    assert state.decide(None, None, 900, KEY, False, True)[0] == PARTIAL
    assert state.decide(None, status(0, 10), 900, KEY, False, False)[0] == FRESH
    assert state.decide(None, status(950, 10), 900, KEY, False, True)[0] == MET
    assert state.decide(None, status(50, 0), 900, KEY, False, True)[0] == EXHAUSTED
    assert state.decide(None, status(50, 0), 900, KEY, True, True)[0] == PARTIAL  # prompts added since
    assert state.decide(None, status(50, 2, errored=2), 900, KEY, False, True)[0] == EXHAUSTED
    assert state.decide(None, status(50, 2, errored=1), 900, KEY, False, True)[0] == PARTIAL
    assert state.decide(None, status(950, 0, refused="dataset D: ..."), 900, KEY, False, True)[0] == REFUSED


def test_finalize_reads_the_journal_only_when_the_checkpoint_says_met_or_exhausted(tmp_path):
    f = files(tmp_path)
    assert not state.finalize_from_journal(f, 100, KEY, status(0, 5))  # no journal: inference first
    write(f.journal, "")
    write(f.prompts, "", mtime=time.time() - 100)
    write(f.status, status(150, 5))
    assert state.finalize_from_journal(f, 100, KEY, status(150, 5))
    assert not state.finalize_from_journal(f, 200, KEY, status(150, 5))  # budget raised
    assert state.finalize_from_journal(f, 200, KEY, status(150, 0))  # no prompt left
    write(f.prompts, "", mtime=time.time() + 100)
    assert not state.finalize_from_journal(f, 200, KEY, status(150, 0))  # ... until prompts are added
    write(f.done, {"tokens": 150, "state": "met", **KEY})
    assert not state.finalize_from_journal(f, 100, KEY, status(150, 5))  # a finished job: through its marker


def counted(tokens, records, by_identity=None):
    """scan_journal for status_row: a JournalState of that many tokens and records."""
    return lambda path, policy: JournalState(path=path, tokens=tokens, records=records, by_identity=by_identity or {})


def test_status_row_counts_the_journal_when_the_status_is_older(tmp_path):
    f = files(tmp_path)
    write(f.prompts, "")
    pol = Policy(Identity("{}", "p"))
    assert state.status_row("D", f, 100, pol, None)[1:] == (0, 100, 100, 0, FRESH, False)
    write(f.journal, "x" * 10)
    write(f.status, status(0, 5, journal_bytes=10))
    assert state.status_row("D", f, 100, pol, None)[1:] == (0, 100, 100, 0, PARTIAL, False)  # up to date
    write(f.journal, "x" * 30)  # a run since (killed): the status says 0, the journal holds 120
    row = state.status_row("D", f, 100, pol, counted(120, 12))
    assert row == ("D", 120, 100, 0, 12, "met (journal; not finalized)", True)
    table = state.format_status_table([row, ("E", 5, 10, 5, 1, PARTIAL, False)])
    assert table.splitlines()[1].split() == ["budgetgen:", "D", "120", "100", "0", "12", "met", "(journal;",
                                             "not", "finalized)"]
    assert table.splitlines()[-1].endswith("later run wrote to it: D)")


def test_looks_local():
    assert state.looks_local("/models/x") and state.looks_local("./tok") and state.looks_local("a/b/c")
    assert not state.looks_local("Qwen/Qwen3-8B")


def test_status_row_shows_a_settings_change_the_job_would_refuse(tmp_path):
    """`-n` says why a dataset will not run: its journal was made under other settings (a status written
    under the old ones is not trusted; the journal is read now under the current identity)."""
    f = files(tmp_path)
    write(f.prompts, "")
    write(f.journal, "x" * 10)
    write(f.status, status(150, 0, journal_bytes=10, key={"identity": "old", "on_settings_change": "refuse"}))
    write(f.done, {"tokens": 150, "state": "met", "identity": "old", "on_settings_change": "refuse"})
    now = Identity.of({"temperature": 0.7, "turns": "last", "samples_per_prompt": 1})
    old = IdentityCount(records=15, tokens=150, settings={"temperature": 0.6, "turns": "last", "samples_per_prompt": 1})
    row = state.status_row("D", f, 100, Policy(now), counted(0, 0, {"old": old}))
    assert row[1] == 0 and row[5] == ("refused: settings changed (temperature 0.6 -> 0.7); "
                                      "see generation.on_settings_change") and row[6]
    row = state.status_row("D", f, 100, Policy(now, "regenerate"), counted(0, 0, {"old": old}))
    assert row[1] == 0 and row[5] == PARTIAL


def test_a_dataset_whose_total_is_met_reads_met_naming_its_short_lanes():
    """issue 42: 100.3 % of the total with the validation lane out of prompts at 91.9 % of its line is met,
    not exhausted; the short lane is named with its share, and is exhausted on its own row."""
    from budgetgen.state import lanes_state, short_lanes

    lanes = {"default": {"tokens": 32_290, "budget": 31_500, "exhausted": False},
             "default/validation": {"tokens": 3_217, "budget": 3_500, "exhausted": True}}
    assert lanes_state(lanes) == MET
    assert short_lanes(lanes) == " (short: default/validation at 91.9 % of its line)"
    assert lanes_state({"default/validation": lanes["default/validation"]}) == EXHAUSTED
    lanes["default"].update(tokens=31_000, exhausted=True)  # the total short too: exhausted
    assert lanes_state(lanes) == EXHAUSTED
    assert short_lanes({"a": {"tokens": 5, "budget": 5, "exhausted": False}}) == ""
