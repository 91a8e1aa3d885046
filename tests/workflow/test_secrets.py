"""Secrets and isolation (docs/reliability.md, "Secrets and isolation"), through real `snakemake`
runs against a real mock server on 127.0.0.1:

- the API key (server.api_key_env) reaches the server and nothing else: no file under the working
  directory holds it after a run, its benchmarks and `snakemake --report` (searched raw, in base64
  at every alignment, inside the report's decoded data URIs and inside compressed files);
- config values never reach a shell: paths, names and the model with shell syntax in them run
  as plain strings, and a name the schema refuses is refused before anything runs.
"""

import base64
import gzip
import json
import re
import secrets
import shutil
import zipfile

import httpx
import pytest

from support import REPO
from support.workflow import Workflow, base_config, write_prompts

pytestmark = pytest.mark.slow

KEY_ENV = "BG_SECRETS_TEST_KEY"


def encodings(value: bytes):
    """value as it may sit in a file: raw, and in standard/url-safe base64 at each of the three
    byte alignments (the middle of the encoding, which does not depend on the bytes around it)."""
    yield value
    for offset in range(3):
        for enc in (base64.b64encode, base64.urlsafe_b64encode):
            full = enc(b"\0" * offset + value)
            yield full[4 if offset else 0: -4]


def contents(path):
    """The bytes of a file and of what it wraps: gzip and zip members, base64 data URIs."""
    data = path.read_bytes()
    yield data
    if data[:2] == b"\x1f\x8b":
        yield gzip.decompress(data)
    if data[:4] == b"PK\x03\x04":
        with zipfile.ZipFile(path) as z:
            for name in z.namelist():
                yield z.read(name)
    for m in re.finditer(rb"data:[\w.+/-]*;base64,([A-Za-z0-9+/=]+)", data):
        yield base64.b64decode(m.group(1))


def files_holding(root, value: bytes):
    found, scanned = [], 0
    for path in sorted(root.rglob("*")):
        if value in str(path).encode():
            found.append(f"{path} (its name)")
        if not path.is_file() or path.is_symlink():
            continue
        scanned += 1
        if any(form in blob for blob in contents(path) for form in encodings(value)):
            found.append(str(path))
    return found, scanned


def test_api_key_is_never_written_anywhere(tmp_path, server, tiny_tokenizer):
    key = "sk-bg-" + secrets.token_hex(20)
    srv = server("--api-key-env", KEY_ENV, "--mean-tokens", "8", "--context-limit", "300",
                 env={KEY_ENV: key})
    # the server really requires the key
    assert httpx.get(srv.base_url + "/models", timeout=5).status_code == 401
    wf_dir = tmp_path / "work"
    write_prompts(wf_dir / "prompts" / "S.jsonl", 12, prefix="S")
    with open(wf_dir / "prompts" / "S.jsonl", "a") as f:  # one refused request: errors.jsonl too
        f.write(json.dumps({"id": "long", "prompt": "long " * 400}) + "\n")
    cfg = base_config(srv.base_url, tiny_tokenizer, {"S": {"prompts": "prompts/S.jsonl"}}, token_budget=10**6)
    cfg["server"]["api_key_env"] = KEY_ENV
    wf = Workflow(wf_dir, cfg)
    env = {KEY_ENV: key}
    run = wf.run("--cores", "2", "all", env=env)
    assert len(wf.records("S", "raw_responses.jsonl")) == 12 and len(wf.records("S", "errors.jsonl")) == 1
    report = wf.run("--report", "report.html", env=env)
    # where it went: relative to -d, not to the folder snakemake ran in
    assert "Report created." in report.output
    assert f"budgetgen: report written to {wf.path('report.html')}" in report.output
    for rule in ("budget_status", "inference", "finalize", "tokenize", "plots"):
        assert wf.path("benchmarks", rule, "S.tsv").exists()
    html = wf.path("report.html").read_text()
    assert html.count("data:") >= 5  # figures and summary embedded as data URIs, decoded by contents()
    assert list(wf.path(".snakemake", "metadata").iterdir())  # Snakemake's per-output records
    found, scanned = files_holding(wf.dir, key.encode())
    assert found == [] and scanned > 30
    assert key not in run.output + report.output
    # and without the key the same run is refused by the server, so the key was what let it in
    wf.path("prompts", "S.jsonl").write_text(wf.path("prompts", "S.jsonl").read_text()
                                             + json.dumps({"prompt": "one more"}) + "\n")
    p = wf.run("--cores", "1", "all", check=False, env={KEY_ENV: "wrong-key"})
    assert p.returncode != 0 and "401" in wf.path("logs", "inference", "S.log").read_text()
    assert key not in p.output


ODD_PATH = "prompts/odd $(touch PWNED) `touch PWNED` ; touch PWNED 'single' \"double\" & | > x.jsonl"
ODD_NAME = "x..y-1.Z_"  # valid: no slash, does not start with a dot; `..` inside is no traversal
ODD_MODEL = "mock $(touch PWNED) `touch PWNED`"


def pwned(*roots):
    return [str(p) for root in roots for pattern in ("PWNED*", "x.jsonl") for p in root.rglob(pattern)]


def test_config_values_never_reach_a_shell(tmp_path, server, tiny_tokenizer):
    srv = server("--model", ODD_MODEL, "--mean-tokens", "8")
    wf_dir = tmp_path / "work"
    write_prompts(wf_dir / ODD_PATH, 6)
    tokenizer = tmp_path / "tok $(touch PWNED) ;"
    shutil.copytree(tiny_tokenizer, tokenizer)
    cfg = base_config(srv.base_url, tokenizer, {ODD_NAME: {"prompts": ODD_PATH}}, token_budget=10**6,
                      extra_body={"note": "$(touch PWNED)"})
    cfg["server"]["model"] = ODD_MODEL
    wf = Workflow(wf_dir, cfg)
    wf.run("--cores", "2", "all")
    assert "Report created." in wf.run("--report", "report.html").output
    raw = wf.records(ODD_NAME, "raw_responses.jsonl")
    assert len(raw) == 6 and {r["served_model"] for r in raw} == {ODD_MODEL}
    assert wf.path("results", ODD_NAME, "tokenized.arrow").exists()
    assert f"{ODD_PATH}" in wf.path("logs", "inference", f"{ODD_NAME}.log").read_text()
    summary = wf.path("results", "summary.tsv").read_text().splitlines()
    assert summary[1].split("\t")[0] == ODD_NAME
    assert pwned(tmp_path, REPO) == []


@pytest.mark.parametrize("name", ["$(touch PWNED)", "`touch PWNED`", "a;touch PWNED"])
def test_dataset_name_with_shell_syntax_is_refused_before_anything_runs(tmp_path, tiny_tokenizer, name):
    wf_dir = tmp_path / "work"
    write_prompts(wf_dir / "prompts" / "A.jsonl", 3)
    wf = Workflow(wf_dir, base_config("http://127.0.0.1:9/v1", tiny_tokenizer, {name: {"prompts": "prompts/A.jsonl"}}))
    p = wf.run("--cores", "1", "all", check=False)
    assert p.returncode != 0
    assert f"config key datasets: invalid name: {name!r} does not match '^[A-Za-z0-9][A-Za-z0-9_.-]*$'" in (
        p.stderr.splitlines())
    assert not wf.path("results").exists() and not wf.path("logs").exists()
    assert pwned(tmp_path, REPO) == []


def test_prompts_path_with_a_newline_is_refused(tmp_path, tiny_tokenizer):
    wf_dir = tmp_path / "work"
    write_prompts(wf_dir / "prompts" / "A.jsonl", 3)
    bad = "prompts/A.jsonl\ntouch PWNED"
    wf = Workflow(wf_dir, base_config("http://127.0.0.1:9/v1", tiny_tokenizer, {"A": {"prompts": bad}}))
    p = wf.run("--cores", "1", "all", check=False)
    assert p.returncode != 0
    assert (f"config key datasets.A.prompts: {bad!r} does not match '^[^\\\\n\\\\r\\\\x00]+$'"
            in p.stderr.splitlines()), p.output[-2000:]
    assert not wf.path("results").exists() and pwned(tmp_path, REPO) == []


def test_the_scan_finds_a_key_in_every_form_it_searches(tmp_path):
    key = b"sk-bg-" + secrets.token_hex(20).encode()
    for i, (name, data) in enumerate([
        ("raw.log", b"x" + key + b"y"),
        *((f"b64-{o}.html", b"<img src='data:image/svg+xml;base64," + base64.b64encode(b"ab"[:o] + key) + b"'>")
          for o in range(3)),
        ("urlsafe.txt", base64.urlsafe_b64encode(b"\xff\xfe" + key + b"\xff")),
        ("c.gz", gzip.compress(b"k=" + key)),
    ]):
        d = tmp_path / str(i)
        d.mkdir()
        (d / name).write_bytes(data)
        assert files_holding(d, key)[0] == [str(d / name)], name
    clean = tmp_path / "clean"
    clean.mkdir()
    (clean / "f").write_bytes(key[:-1])
    assert files_holding(clean, key)[0] == []
