"""Bad input catalogue (docs/reliability.md, "Bad input"): one test per row, each through a real
`snakemake` run of the workflow against a real mock server on 127.0.0.1, where the user meets it.

By default (generation.on_bad_line: error) a bad line stops the run with one line
`prompts file FILE:LINE: reason (datasets.D.prompts)` when the Snakefile is parsed, so `snakemake -n`
says it too, before any job runs or request is sent. With on_bad_line: skip every bad line is skipped,
counted and logged with its line number, and the run completes.
"""

import json

import pytest

from support.workflow import Workflow, base_config, server_stats

pytestmark = pytest.mark.slow

GOOD = [json.dumps({"id": "g1", "prompt": "first good question"}).encode(),
        json.dumps({"id": "g2", "prompt": "second good question"}).encode()]
PROMPTS = "prompts/D.jsonl"


def make(tmp_path, srv, tokenizer, lines, **gen):
    """A workflow with one dataset D whose prompts file holds `lines` (bytes, one per line)."""
    wf = Workflow(tmp_path / "work", base_config(srv.base_url, tokenizer, {"D": {"prompts": PROMPTS}}, **gen))
    wf.path("prompts").mkdir()
    wf.path(PROMPTS).write_bytes(b"".join(line + b"\n" for line in lines))
    return wf


def stops_the_run(wf, srv, expected):
    """`expected` is the job's error line (`error: FILE:LINE: reason`, load_prompts'); the workflow
    finds it when the Snakefile is parsed (budgetgen.prompts_check), so `snakemake -n` on a login
    node refuses with it, and so does a run, before any job: one line naming the file, the line and
    the config key; no traceback; no job ran; no request was sent."""
    line = f"prompts file {expected.removeprefix('error: ')} (datasets.D.prompts)"
    for args in (("-n", "all"), ("--cores", "1", "all")):
        p = wf.run(*args, check=False)
        assert p.returncode != 0, p.output[-3000:]
        assert line in p.output.splitlines(), p.output[-3000:]
        assert "Traceback" not in p.output
    for d in ("results", "logs"):
        assert not wf.path(d).exists(), f"{d}/ exists: a job ran"
    assert server_stats(srv)["requests"] == 0
    return p


BAD_LINES = {
    "malformed-json": (b'{"prompt": "unclosed"', "malformed JSON (Expecting ',' delimiter at column 22)"),
    "not-an-object": (b'["a", "list"]', "line is not a JSON object (got list)"),
    "no-prompt-field": (b'{"text": "hello"}',
                        "no recognised prompt field (expected one of messages, conversations, prompt, instruction)"),
    "empty-content": (b'{"messages": [{"role": "user", "content": "  "}]}',
                      "empty content: the last user turn is empty"),
    "unknown-role": (b'{"messages": [{"role": "robot", "content": "hi"}]}', "unknown role 'robot' in messages[0]"),
    "non-utf8": (b'{"prompt": "caf\xe9"}', "not valid UTF-8 (bad byte at offset 15)"),
    "duplicate-id": (b'{"id": "g1", "prompt": "other content"}',
                     "duplicate id 'g1' with different content (first seen on line 1)"),
    # valid JSON, not encodable text (a split emoji in a scraped dump): without an id even the id
    # hash fails, with one every request would
    "lone-surrogate": (rb'{"prompt": "bad \ud800 text"}', "invalid Unicode: lone surrogate \\ud800 in field 'prompt'"),
    "lone-surrogate-sharegpt": (rb'{"id": "s1", "conversations": [{"from": "human", "value": "x \udc00"}]}',
                                "invalid Unicode: lone surrogate \\udc00 in conversations[0].value"),
}


@pytest.mark.parametrize("case", list(BAD_LINES))
def test_bad_line_stops_the_run_naming_file_and_line(tmp_path, server, tiny_tokenizer, case):
    line, reason = BAD_LINES[case]
    srv = server("--mean-tokens", "8")
    wf = make(tmp_path, srv, tiny_tokenizer, [*GOOD, line])
    stops_the_run(wf, srv, f"error: {PROMPTS}:3: {reason}")


def test_bad_lines_skipped_counted_and_logged_with_on_bad_line_skip(tmp_path, server, tiny_tokenizer):
    srv = server("--mean-tokens", "8")
    bad = list(BAD_LINES.values())
    lines = [GOOD[0], *(line for line, _ in bad[:4]), GOOD[1], *(line for line, _ in bad[4:])]
    wf = make(tmp_path, srv, tiny_tokenizer, lines, token_budget=10**6, on_bad_line="skip")
    p = wf.run("--cores", "1", "all")
    log = wf.path("logs", "inference", "D.log").read_text()
    assert f"Prompts: 2 unique in {PROMPTS} (0 duplicates dropped, {len(bad)} bad lines skipped)" in log
    numbers = [2, 3, 4, 5, *range(7, 7 + len(bad) - 4)]  # the bad lines' line numbers
    for n, (_, reason) in zip(numbers, bad):  # log lines: "TIMESTAMP   skipped FILE:LINE: reason"
        assert any(line.endswith(f"  skipped {PROMPTS}:{n}: {reason}") for line in log.splitlines()), log
    assert "Traceback" not in log and "Traceback" not in p.output
    assert sorted(r["id"] for r in wf.records("D", "raw_responses.jsonl")) == ["g1", "g2"]
    assert server_stats(srv)["requests"] == 2
    status = json.loads(wf.path("results", "D", "budget_status.json").read_text())
    assert status["prompts"] == 2
    summary = dict(zip(*[r.split("\t") for r in wf.path("results", "summary.tsv").read_text().splitlines()]))
    assert summary["prompts"] == "2" and summary["status"] == "exhausted"


def test_every_line_bad_with_skip_is_an_error(tmp_path, server, tiny_tokenizer):
    srv = server()
    wf = make(tmp_path, srv, tiny_tokenizer, [b"nope", b"[1]"], on_bad_line="skip")
    stops_the_run(wf, srv, f"error: {PROMPTS}: no prompts found (all 2 non-blank lines were bad; first: line 1: "
                           "malformed JSON (Expecting value at column 1))")


def test_prompt_longer_than_the_context_is_recorded_not_retried(tmp_path, server, tiny_tokenizer):
    srv = server("--mean-tokens", "8", "--context-limit", "300")
    long = json.dumps({"id": "long", "prompt": " ".join(["word"] * 400)}).encode()
    wf = make(tmp_path, srv, tiny_tokenizer, [GOOD[0], long, GOOD[1]], token_budget=10**6, max_tokens=32)
    wf.run("--cores", "1", "all")  # the run completes
    errors = wf.records("D", "errors.jsonl")
    assert [(e["id"], e["status"]) for e in errors] == [("long", 400)]
    assert "maximum context length is 300 tokens" in errors[0]["error"]
    assert sorted(r["id"] for r in wf.records("D", "raw_responses.jsonl")) == ["g1", "g2"]
    assert server_stats(srv)["requests"] == 3  # one request each: the 400 was not retried
    log = wf.path("logs", "inference", "D.log").read_text()
    assert " error (not retried) for long: HTTP 400: This model's maximum context length is 300 tokens." in log
    summary = dict(zip(*[r.split("\t") for r in wf.path("results", "summary.tsv").read_text().splitlines()]))
    assert summary["errors"] == "1" and summary["responses"] == "2" and summary["status"] == "exhausted"
    assert "Nothing to be done" in wf.run("--cores", "1", "all").output
    assert server_stats(srv)["requests"] == 3  # nor on the next run


def test_ten_megabyte_line(tmp_path, server, tiny_tokenizer):
    # a valid 10 MB line is an ordinary prompt (no line length limit); this one is past the server's
    # context, so it is the 400 of the row above
    srv = server("--mean-tokens", "8", "--context-limit", "300")
    huge = json.dumps({"id": "huge", "prompt": "word " * (2 * 1024 * 1024)}).encode()
    assert len(huge) > 10 * 1024 * 1024
    wf = make(tmp_path, srv, tiny_tokenizer, [GOOD[0], huge, GOOD[1]], token_budget=10**6, max_tokens=32)
    wf.run("--cores", "1", "all")
    assert [(e["id"], e["status"]) for e in wf.records("D", "errors.jsonl")] == [("huge", 400)]
    assert sorted(r["id"] for r in wf.records("D", "raw_responses.jsonl")) == ["g1", "g2"]
    for log in wf.path("logs").rglob("*.log"):  # the prompt is never copied into a log
        assert log.stat().st_size < 100_000, log
    # a malformed 10 MB line: the same short one-line error as any malformed line
    srv2 = server()
    wf2 = make(tmp_path / "malformed", srv2, tiny_tokenizer, [*GOOD, huge[:-2]])
    stops_the_run(wf2, srv2, f"error: {PROMPTS}:3: malformed JSON (Unterminated string starting at column 26)")


@pytest.mark.parametrize("content, what", [(b"", "the file is empty"), (b"\n  \n\t\n", "only blank lines")],
                         ids=["empty", "blank-lines"])
@pytest.mark.parametrize("on_bad_line", ["error", "skip"])
def test_empty_file(tmp_path, server, tiny_tokenizer, content, what, on_bad_line):
    srv = server()
    wf = make(tmp_path, srv, tiny_tokenizer, [], on_bad_line=on_bad_line)
    wf.path(PROMPTS).write_bytes(content)
    stops_the_run(wf, srv, f"error: {PROMPTS}: no prompts found ({what})")


def test_missing_file(tmp_path, server, tiny_tokenizer):
    srv = server()
    wf = make(tmp_path, srv, tiny_tokenizer, GOOD)
    wf.config["datasets"]["D"]["prompts"] = "prompts/nope.jsonl"
    wf.write_config()
    for args in (("-n", "all"), ("--cores", "1", "all")):
        p = wf.run(*args, check=False)
        assert p.returncode != 0
        assert ("config key datasets.D.prompts: file not found: prompts/nope.jsonl (relative paths in the config "
                f"are read from the working directory {wf.dir}, snakemake -d)") in p.output.splitlines()
        assert "Traceback" not in p.output
    for d in ("results", "logs", "benchmarks"):
        assert not wf.path(d).exists(), f"{d}/ exists: a job ran"
    assert server_stats(srv)["requests"] == 0
