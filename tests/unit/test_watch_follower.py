"""budgetgen.journal_follow.JournalFollower: a journal read incrementally and read-only, through a torn tail, a
file replaced or cut under it, records of other generation identities; rates from the records; the plain-text \
table (format_plain) for a pipe."""

import os
import re

from budgetgen import journal, state
from budgetgen.journal_follow import JournalFollower
from budgetgen.watch import DatasetView, format_plain, total


def rec(i, tokens, done_at, identity="a"):
    return {"id": f"r{i}", "identity": identity, "messages": [], "created": done_at - 2.0, "latency_s": 2.0,
            "usage": {"completion_tokens": tokens}}


def append(path, *records, torn=b""):
    with open(path, "ab") as f:
        for r in records:
            f.write(journal.encode_record(r).encode())
        f.write(torn)


def test_follower_reads_only_what_was_appended_and_waits_for_a_torn_tail(tmp_path):
    p = tmp_path / "journal.jsonl"
    f = JournalFollower(str(p), accepts=lambda sha: sha == "a")
    assert f.refresh().tokens == 0  # no journal yet
    append(p, rec(0, 10, 100.0), rec(1, 20, 101.0, identity="b"))
    line = journal.encode_record(rec(2, 30, 102.0)).encode()
    append(p, torn=line[:15])  # a record being written (or cut by a crash)
    f.refresh()
    assert (f.tokens, f.records, f.ids) == (10, 1, {"r0"})  # the other identity's record is not counted
    assert {sha: c.records for sha, c in f.by_identity.items()} == {"a": 1, "b": 1}
    offset = f.offset
    append(p, torn=line[15:])  # the record is whole now
    assert f.refresh().tokens == 40 and f.offset > offset
    assert f.refresh().tokens == 40  # nothing new: nothing counted twice


def test_follower_starts_over_when_the_journal_is_replaced_or_cut(tmp_path):
    p = tmp_path / "journal.jsonl"
    append(p, rec(0, 10, 100.0), rec(1, 20, 101.0))
    f = JournalFollower(str(p))
    assert f.refresh().tokens == 30
    q = tmp_path / "new.jsonl"
    append(q, rec(5, 7, 100.0))
    os.replace(q, p)  # replaced under it (another inode)
    assert f.refresh().tokens == 7 and f.ids == {"r5"}
    with open(p, "r+b") as fh:
        fh.truncate(0)  # cut
    assert f.refresh().tokens == 0


def test_rates_over_the_last_minute_and_the_total():
    f = JournalFollower("unused")
    for t in (10.0, 40.0, 70.0, 90.0):
        f.recent.append((t, 100, 100))
    req_s, tok_s, _ = f.rates(now=100.0)  # the record of t=10 is out of the window
    assert abs(tok_s - 300 / 60) < 1e-9 and abs(req_s - 3 / 60) < 1e-9

    class V:
        def __init__(self, tokens, budget, tok_s, finished):
            self.tokens, self.budget, self.tok_s, self.finished = tokens, budget, tok_s, finished
            self.budget_rate = tok_s  # nothing dropped: the kept rate is the rate

    tokens, budget, left, tps, eta = total([V(50, 100, 5.0, False), V(300, 200, 0.0, True)])
    assert (tokens, budget, left, tps, eta) == (350, 300, 50, 5.0, 10.0)


def test_plain_table_has_every_dataset_its_state_and_no_escape_sequences():
    views = [DatasetView("A", 50, 100, 5, 5, 10, state.PARTIAL, 0.5, 5.0, 10.0, 1),
             DatasetView("B_long_name", 300, 200, 9, 9, 9, state.MET, 0.0, 0.0, 0.0, 0),
             DatasetView("C", 40, 1000, 4, 4, 4, state.EXHAUSTED, 0.0, 0.0, 0.0, 0)]
    text = format_plain(views, "budgetgen /w")
    lines = text.splitlines()
    assert text.isascii() and "\x1b" not in text and lines[0] == "budgetgen /w"
    assert lines[1].split()[:2] == ["dataset", "progress"]
    rows = {line.split()[0]: line for line in lines[2:]}
    assert "[##########----------]" in rows["A"] and " partial " in rows["A"]  # half the budget
    assert "[####################]" in rows["B_long_name"] and " met " in rows["B_long_name"]
    # exhausted at 4 % of its budget: drawn at its real share (was: a full bar, every generation asked)
    assert "[--------------------]" in rows["C"] and " exhausted " in rows["C"]
    assert set(lines[-2]) == {"-"} and lines[-1].startswith("total")
    assert "50 tokens left to run, 960 short in exhausted datasets" in lines[-1]  # no job will run C's 960
    assert len({re.search(r"[\d,]+ / [\d,]+", line).end() for line in lines[2:] if " / " in line}) == 1  # aligned
