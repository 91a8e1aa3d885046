"""budgetgen.prompts_check: the parse-time verdict on a prompts file is the inference job's own
(load_prompts refuses the file with exactly the line the check returns, or loads it when the check
passes), in one process and split among workers, and is remembered by file identity."""

import json
import os
import random

import pytest

from budgetgen import prompts_check
from budgetgen.errors import UserError
from budgetgen.prompts import load_prompts, stable_id

GOOD = [
    {"id": "a", "prompt": "first"},
    {"id": "b", "messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "q"}]},
    {"id": 7, "conversations": [{"from": "human", "value": "hi"}]},
    {"instruction": "do it", "input": "x"},
    {"prompt": "no id at all"},
    {"id": "a", "prompt": "first"},  # the same content again under its id: a dropped duplicate
    {"prompt": "caf\u00e9 \U0001f600"},
]
BAD = [
    b'{"prompt": "a",, }',
    b'{"prompt": "unterminated',
    b"[1, 2]",
    b'{"text": "hello"}',
    b'{"prompt": "   "}',
    b'{"messages": [{"role": "robot", "content": "x"}]}',
    b'{"prompt": "caf\xe9"}',
    b'{"id": "", "prompt": "x"}',
    b'{"id": 1.5, "prompt": "x"}',
    rb'{"prompt": "bad \ud800 text"}',
    b'{"id": "a", "prompt": "other content"}',  # an id seen with other messages (when "a" came first)
    b'{"prompt": "x"} trailing',
]
BLANK = [b"", b"   ", b"\t"]


def encode(line):
    return line if isinstance(line, bytes) else json.dumps(line, ensure_ascii=False).encode()


def the_jobs_verdict(path, on_bad_line):
    """load_prompts' refusal (its message) or None: what the check must match."""
    try:
        load_prompts(path, on_bad_line)
    except UserError as exc:
        return str(exc)
    return None


def the_checks_verdict(path, on_bad_line, workers):
    verdict = prompts_check.check_file(path, on_bad_line, workers=workers)
    return prompts_check.message(path, verdict) if verdict else None


@pytest.mark.parametrize("seed", range(60))
def test_the_verdict_is_the_jobs_on_random_files(tmp_path, seed):
    rng = random.Random(seed)
    n = rng.choice([0, 1, 3, 12, 40])
    bad_weight = rng.choice([0.0, 0.05, 0.3, 1.0])
    lines = []
    for _ in range(n):
        r = rng.random()
        lines.append(rng.choice(BAD) if r < bad_weight else rng.choice(BLANK) if r < bad_weight + 0.1
                     else encode(rng.choice(GOOD)))
    path = tmp_path / "p.jsonl"
    path.write_bytes(b"\n".join(lines) + (b"\n" if rng.random() < 0.7 else b""))
    for on_bad_line in ("error", "skip"):
        expected = the_jobs_verdict(str(path), on_bad_line)
        for workers in (1, 3):
            assert the_checks_verdict(str(path), on_bad_line, workers) == expected, (on_bad_line, workers)


def test_a_duplicate_id_across_worker_ranges_names_both_lines(tmp_path):
    lines = [encode({"id": "k", "prompt": "a"})] + [encode({"id": f"x{i}", "prompt": f"q{i}"}) for i in range(50)]
    lines.append(encode({"id": "k", "prompt": "b"}))
    path = tmp_path / "p.jsonl"
    path.write_bytes(b"\n".join(lines) + b"\n")
    expected = the_jobs_verdict(str(path), "error")
    assert expected == f"{path}:52: duplicate id 'k' with different content (first seen on line 1)"
    assert the_checks_verdict(str(path), "error", 4) == expected


def test_an_own_id_equal_to_a_content_hash_is_checked_as_the_job_does(tmp_path):
    # a line without id takes its content hash as id; a later line giving that hash as its own id with
    # other content is the job's duplicate-id refusal
    hashed = stable_id(({"role": "user", "content": "plain"},))
    lines = [encode({"prompt": "plain"}), encode({"id": "o", "prompt": "other"}),
             encode({"id": hashed, "prompt": "not plain"})]
    path = tmp_path / "p.jsonl"
    path.write_bytes(b"\n".join(lines) + b"\n")
    expected = the_jobs_verdict(str(path), "error")
    assert expected and "duplicate id" in expected and expected.startswith(f"{path}:3: ")
    for workers in (1, 2):
        assert the_checks_verdict(str(path), "error", workers) == expected


def test_the_verdict_is_remembered_by_file_identity(tmp_path, monkeypatch):
    path = tmp_path / "p.jsonl"
    path.write_bytes(encode(GOOD[0]) + b"\n")
    cache = tmp_path / "cache.json"
    assert prompts_check.check_cached(str(path), "error", str(cache)) is None
    assert cache.exists()

    def must_not_read(*args, **kwargs):
        raise AssertionError("the file was read again")

    monkeypatch.setattr(prompts_check, "_verdicts", {})  # a new process: only the cache file remembers
    monkeypatch.setattr(prompts_check, "check_file", must_not_read)
    assert prompts_check.check_cached(str(path), "error", str(cache)) is None
    monkeypatch.undo()

    # the same size, a later mtime: checked again, and refused
    path.write_bytes(b'{"prompt": "a",, }' + b"\n")
    st = os.stat(path)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    monkeypatch.setattr(prompts_check, "_verdicts", {})
    line, reason = prompts_check.check_cached(str(path), "error", str(cache))
    assert line == 1 and reason.startswith("malformed JSON")


def test_prompts_problem_names_the_file_line_and_key(tmp_path):
    good, bad = tmp_path / "good.jsonl", tmp_path / "bad.jsonl"
    good.write_bytes(encode(GOOD[0]) + b"\n")
    bad.write_bytes(encode(GOOD[0]) + b"\n" + b"[1]\n")
    config = {"generation": {"on_bad_line": "error"},
              "datasets": {"A": {"prompts": str(good)}, "B": {"prompts": str(bad)}}}
    assert prompts_check.prompts_problem(config) == (
        f"prompts file {bad}:2: line is not a JSON object (got list) (datasets.B.prompts)")
    config["datasets"]["B"]["on_bad_line"] = "skip"
    assert prompts_check.prompts_problem(config) is None
