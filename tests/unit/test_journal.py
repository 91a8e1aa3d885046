import json
import multiprocessing
import os

import pytest

from budgetgen import journal
from budgetgen.errors import UserError
from budgetgen_testkit.records import stamped


def rec(i, tokens=10, content="text"):
    return stamped({"id": f"r{i}", "messages": [{"role": "user", "content": "q"},
                                                {"role": "assistant", "content": content}],
                    "finish_reason": "stop", "usage": {"prompt_tokens": 3, "completion_tokens": tokens,
                                                       "total_tokens": tokens + 3}})


def write(path, records):
    w = journal.JournalWriter(path)
    for r in records:
        w.append(r)
    w.close()


def test_encode_puts_id_first_and_usage_last():
    line = journal.encode_record({"usage": {"completion_tokens": 1}, "x": 1, "id": "a"})
    assert list(json.loads(line)) == ["id", "x", "usage"]
    assert line.endswith("\n") and line.count("\n") == 1


def test_fast_parse_agrees_with_full_parse_even_with_tricky_content(tmp_path):
    tricky = 'he said "usage": {"completion_tokens": 999} \\ \n and "id": "x"'
    line = journal.encode_record(rec('we"ird\\id', tokens=7, content=tricky))
    fast = journal.parse_line_fast(line)
    full = journal.parse_line(line, "x:1")
    assert fast == (full[0], full[2]["identity"], full[1]) == ('rwe"ird\\id', rec(0)["identity"], 7)
    legacy = journal.encode_record({k: v for k, v in rec("x").items() if k != "identity"})
    assert journal.parse_line_fast(legacy)[1] is None  # no identity: written before them


def test_scan_counts_tokens_and_ids(tmp_path):
    p = tmp_path / "j.jsonl"
    write(p, [rec(i, tokens=i) for i in range(1, 11)])
    st = journal.scan(p)
    assert st.records == 10 and st.tokens == 55 and st.ids == {f"r{i}" for i in range(1, 11)}
    assert st.lengths == list(range(1, 11))


def test_torn_tail_is_repaired_and_whole_records_kept(tmp_path):
    p = tmp_path / "j.jsonl"
    write(p, [rec(i) for i in range(3)])
    with open(p, "ab") as f:
        f.write(journal.encode_record(rec(99)).encode()[:25])  # a crash mid-record
    before = journal.scan(p)
    assert before.records == 3  # the torn record is never counted
    st = journal.scan(p, repair=True)
    assert st.repaired_bytes == 25 and st.records == 3
    assert p.read_bytes().endswith(b"\n")
    write(p, [rec(99)])  # appending after the repair yields whole lines only
    assert [json.loads(x)["id"] for x in p.read_text().splitlines()] == ["r0", "r1", "r2", "r99"]


def test_repair_of_a_file_that_is_one_torn_line(tmp_path):
    p = tmp_path / "j.jsonl"
    p.write_bytes(b'{"id": "half')
    assert journal.repair_tail(p) == 12 and p.read_bytes() == b""


def test_duplicate_ids_are_counted_once(tmp_path):
    p = tmp_path / "j.jsonl"
    write(p, [rec(1, 10), rec(2, 20), rec(1, 10)])
    st = journal.scan(p)
    assert st.records == 2 and st.tokens == 30 and st.duplicates == 1
    assert [r["id"] for _, r in journal.iter_records(p)] == ["r1", "r2"]


def test_corrupt_whole_line_is_an_error_naming_file_and_line(tmp_path):
    p = tmp_path / "j.jsonl"
    write(p, [rec(1)])
    with open(p, "a") as f:
        f.write("not json at all\n")
    with pytest.raises(UserError, match=rf"{p}:2: corrupt journal record"):
        journal.scan(p)


def test_missing_journal_is_empty(tmp_path):
    st = journal.scan(tmp_path / "none.jsonl")
    assert st.records == 0 and st.tokens == 0
    assert list(journal.iter_records(tmp_path / "none.jsonl")) == []


def _hold_lock(path, ready, release):
    lock = journal.JournalLock(path).acquire()
    ready.set()
    release.wait(10)
    lock.release()


def test_lock_refuses_a_second_writer_with_a_clear_error(tmp_path):
    p = tmp_path / "j.jsonl"
    ctx = multiprocessing.get_context("spawn")
    ready, release = ctx.Event(), ctx.Event()
    holder = ctx.Process(target=_hold_lock, args=(str(p), ready, release))
    holder.start()
    try:
        assert ready.wait(20)
        with pytest.raises(UserError, match=rf"another inference process \(pid {holder.pid}\)"):
            journal.JournalLock(p).acquire()
    finally:
        release.set()
        holder.join(10)
    journal.JournalLock(p).acquire().release()  # free again once the holder is gone


def test_append_is_one_whole_line_per_record(tmp_path):
    p = tmp_path / "j.jsonl"
    big = "x" * 3_000_000
    write(p, [rec(1, content=big), rec(2)])
    lines = p.read_text().splitlines()
    assert len(lines) == 2 and json.loads(lines[0])["messages"][1]["content"] == big
    assert os.path.getsize(p) > 3_000_000


def error_rec(i, size):
    """An errors.jsonl record as inference.py writes it, with a large prompt (size bytes)."""
    return stamped({"id": f"e{i}", "messages": [{"role": "user", "content": "w " * (size // 2)}], "status": 400,
                    "error": "This model's maximum context length is 4096 tokens.", "params": {"max_tokens": 256},
                    "created": 1.0, "usage": {}})


@pytest.mark.parametrize("opener", ["append_error", "JournalWriter"])
def test_a_writer_never_appends_behind_a_torn_large_record(tmp_path, opener):
    """A kill during the append of a large record leaves its head at the tail (errors.jsonl,
    issue 12 item 6): the next record must start a line of its own, not be glued onto the head,
    whoever appends it and whether or not the file was scanned with repair=True first."""
    p = tmp_path / "errors.jsonl"
    journal.append_error(p, error_rec(0, 3000))
    whole = p.read_bytes()
    torn = journal.encode_record(error_rec(1, 2_000_000)).encode()[:1_500_000]  # cut mid-record
    with open(p, "ab") as f:
        f.write(torn)
    assert journal.scan(p).ids == {"e0"}  # a reader stops before the torn tail
    if opener == "append_error":
        dropped = journal.append_error(p, error_rec(2, 3000))
    else:
        w = journal.JournalWriter(p)
        w.append(error_rec(2, 3000))
        w.close()
        dropped = w.repaired_bytes
    data = p.read_bytes()
    assert data.startswith(whole) and data.endswith(b"\n") and b'"e1"' not in data
    assert [json.loads(x)["id"] for x in data.splitlines()] == ["e0", "e2"]
    assert journal.scan(p, repair=True).ids == {"e0", "e2"}  # and the next run reads it
    assert dropped == len(torn)


def test_opening_a_writer_on_a_whole_file_changes_nothing(tmp_path):
    p = tmp_path / "j.jsonl"
    write(p, [rec(1), rec(2)])
    before = p.read_bytes()
    w = journal.JournalWriter(p)
    assert w.repaired_bytes == 0
    w.close()
    assert p.read_bytes() == before
    w = journal.JournalWriter(tmp_path / "new" / "j.jsonl")  # a missing file is created, nothing to repair
    assert w.repaired_bytes == 0
    w.close()


# -- generation identities (budgetgen.identity) and the one reader ------------------------------------
def under(i, identity, tokens=10):
    return {**rec(i, tokens), "identity": identity.sha, "identity_settings": identity.settings}


def test_scan_counts_only_the_identities_that_count_and_every_identity_apart(tmp_path):
    """A regenerate run journals the same ids again under a new identity: each identity is counted apart,
    the accepted ones alone make the ids, tokens and lengths; the fast path reads the identity from the
    line's head (identity right after id)."""
    from budgetgen.identity import Identity, legacy_identity

    old = Identity.of({"model": "m", "temperature": 0.6, "turns": "last", "samples_per_prompt": 1})
    new = Identity.of({"model": "m", "temperature": 0.7, "turns": "last", "samples_per_prompt": 1})
    p = tmp_path / "j.jsonl"
    write(p, [under(i, old, 10) for i in range(3)] + [under(i, new, 20) for i in range(2)])
    line = p.read_text().splitlines()[0]
    assert list(json.loads(line))[:2] == ["id", "identity"] and journal.parse_line_fast(line)[1] == old.sha
    st = journal.scan(p, accepts=lambda sha: sha == new.sha)
    assert (st.records, st.tokens, st.ids, st.duplicates) == (2, 40, {"r0", "r1"}, 0)
    assert {sha: (c.records, c.tokens) for sha, c in st.by_identity.items()} == {old.sha: (3, 30), new.sha: (2, 40)}
    assert st.by_identity[old.sha].settings == old.settings  # readable, for the refusal line
    everything = journal.scan(p)  # every identity counts (extend): the first record of an id wins
    assert (everything.records, everything.tokens, everything.duplicates) == (3, 30, 2)
    assert [r["id"] for _, r in journal.iter_records(p, accepts=lambda sha: sha == new.sha)] == ["r0", "r1"]
    assert journal.records_by_id(p, ["r1"],
                                 accepts=lambda sha: sha == new.sha)["r1"]["usage"]["completion_tokens"] == 20
    # a record written before identities: every reader refuses it in one line naming the migration, which
    # stamps it with the identity its params imply
    legacy = {k: v for k, v in rec(9).items() if k not in ("identity", "identity_settings")}
    legacy["params"] = {"model": "m", "max_tokens": 8, "temperature": 1}
    q = tmp_path / "D" / "journal.jsonl"
    write(q, [rec(8), legacy])
    for read in (journal.scan, lambda path: list(journal.iter_records(path, accepts=lambda sha: True)),
                 journal.errors_by_identity):
        with pytest.raises(UserError, match=r"journal.jsonl:2: a record written before generation identities .*"
                           r"`python scripts/migrate_journal.py --config CONFIG --dataset D`"):
            read(q)
    from budgetgen.migration import migrate_file

    assert migrate_file(q, samples=1) == (1, 2)
    (_, sha_8), (_, sha) = (journal.parse_line_fast(line)[:2] for line in q.read_text().splitlines())
    assert sha_8 == rec(8)["identity"]  # a stamped record is copied as it was
    assert sha == legacy_identity(legacy).sha == Identity.of(
        {"model": "m", "max_tokens": 8, "temperature": 1.0, "turns": "last", "samples_per_prompt": 1}).sha
    before = q.read_bytes()
    assert migrate_file(q, samples=1) == (0, 2) and q.read_bytes() == before  # idempotent


def test_one_reader_one_tolerance_policy(tmp_path):
    """Every reader of an append-only file (scan, iter_records, records_by_id, errors_by_identity) skips
    a torn tail and refuses a bad whole line as FILE:LINE: reason."""
    p = tmp_path / "j.jsonl"
    write(p, [rec(0), rec(1)])
    with open(p, "ab") as f:
        f.write(b'{"id": "torn", "mess')
    assert journal.scan(p).records == 2 and [r["id"] for _, r in journal.iter_records(p)] == ["r0", "r1"]
    assert journal.errors_by_identity(p) and journal.records_by_id(p, ["torn"]) == {}
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(journal.encode_record(rec(0)).encode() + b'{"id": "x", "a": "\xff"}\n')
    for read in (lambda: journal.scan(bad), lambda: list(journal.iter_records(bad)),
                 lambda: journal.errors_by_identity(bad), lambda: journal.records_by_id(bad, ["x"])):
        with pytest.raises(UserError, match=rf"^{bad}:2: corrupt journal record \(not UTF-8"):
            read()
