"""When the server is wrong (issue 42): real `snakemake` runs against a real mock server on 127.0.0.1 that
answers HTTP 200 with garbage (budgetgen_testkit.mock_server --garbage: empty, loop, mojibake,
template_leak; from the first request or after N good ones), or with responses the quality gate drops.

Each run must end non-zero with the cause as its last line, never `met`/`exhausted` with garbage; the
breaker (quality.breaker) cuts the endpoint off after at most window + concurrency requests; the responses
it blames stay in the journal (evidence) but count nowhere, and the rerun against a good server asks
their prompts again and meets the budget, nothing counted twice."""

import json
import signal

import pytest

from budgetgen_testkit import mock_server
from support.workflow import Workflow, base_config, server_stats, wait_for, write_conversations, write_prompts

pytestmark = pytest.mark.slow

WINDOW, CONCURRENCY = 10, 4
FACT_WORDS = {"empty": "were empty", "loop": "were loops (repetition)", "mojibake": "were mojibake (replacement_chars)",
              "template_leak": "were leaked template tokens (template_leak)"}


def make(tmp_path, base_url, tokenizer, n=60, budget=1200, **quality):
    wf_dir = tmp_path / "work"
    write_prompts(wf_dir / "prompts" / "F.jsonl", n, prefix="F")
    q = {"breaker": {"window": WINDOW, "share": 0.5}, **quality}
    return Workflow(wf_dir, base_config(base_url, tokenizer, {"F": {"prompts": "prompts/F.jsonl"}},
                                        token_budget=budget, concurrency=CONCURRENCY, quality=q))


def blamed(wf):
    return wf.records("F", "journal.blamed.jsonl")


def counted_ids(wf):
    """The ids the journal counts: its records less the blamed ones (by id and created)."""
    gone = {(b["id"], b["created"]) for b in blamed(wf)}
    return [r["id"] for r in wf.records("F") if (r["id"], r["created"]) not in gone]


def rerun_on_a_good_server(wf, server):
    good = server("--mean-tokens", "20")
    wf.config["server"]["base_url"] = good.base_url
    wf.write_config()
    proc = wf.run("--cores", "2", "all")
    return proc, good


@pytest.mark.parametrize("kind", ["empty", "loop", "mojibake", "template_leak"])
def test_a_server_bad_from_its_first_request_is_cut_off_and_the_rerun_asks_its_prompts_again(
        tmp_path, server, tiny_tokenizer, kind):
    bad = server("--mean-tokens", "20", "--garbage", kind)
    # a budget the loops (240 tokens each) cannot meet before the window trips
    wf = make(tmp_path, bad.base_url, tiny_tokenizer, n=300, budget=3000)
    proc = wf.run("--cores", "2", "all", check=False)
    assert proc.returncode != 0, proc.output[-3000:]
    requests = server_stats(bad)["requests"]
    assert WINDOW // 2 < requests <= WINDOW + CONCURRENCY, requests  # tripped above share 0.5 of the window
    line = [x for x in proc.output.splitlines() if "cut off by the breaker" in x]
    assert line and f"from {bad.base_url} {FACT_WORDS[kind]}" in line[-1], proc.output[-3000:]
    records, blame = wf.records("F"), blamed(wf)
    assert records and len(blame) == len(records)  # every response kept as evidence, every one blamed
    assert not counted_ids(wf) and not wf.path("results", "F", "inference.done").exists()
    assert not wf.path("results", "F", "tokenized.arrow").exists()
    status = json.loads(wf.path("results", "F", "budget_status.json").read_text())
    assert status["tokens"] == status["responses"] == 0 and status["remaining_prompts"] == 300

    proc, _ = rerun_on_a_good_server(wf, server)
    ids = counted_ids(wf)
    assert len(ids) == len(set(ids))  # nothing counted twice
    assert {b["id"] for b in blame} <= set(ids)  # the blamed prompts asked again, first in the dispatch order
    done = json.loads(wf.path("results", "F", "inference.done").read_text())
    assert done["state"] == "met" and done["tokens"] >= 3000 and done["dropped"] == {}
    assert wf.path("results", "F", "tokenized.arrow").exists()


def test_a_server_that_turns_bad_after_n_keeps_those_n(tmp_path, server, tiny_tokenizer):
    n_good = 30
    bad = server("--mean-tokens", "20", "--garbage", "loop", "--garbage-after", n_good)
    wf = make(tmp_path, bad.base_url, tiny_tokenizer, budget=5000)
    proc = wf.run("--cores", "2", "all", check=False)
    assert proc.returncode != 0 and "were loops (repetition)" in proc.output, proc.output[-3000:]
    records = wf.records("F")
    good = [r for r in records if "repetition" not in r["flags"]]
    assert len(good) == n_good and set(counted_ids(wf)) == {r["id"] for r in good}
    assert server_stats(bad)["requests"] <= n_good + WINDOW + CONCURRENCY
    status = json.loads(wf.path("results", "F", "budget_status.json").read_text())
    assert status["tokens"] == sum(r["usage"]["completion_tokens"] for r in good)


def test_a_loop_below_the_breaker_is_flagged_in_the_rows_and_counted(tmp_path, server, tiny_tokenizer):
    """The breaker trips only above its share: a server with a few loops is a server with a few loops;
    they are rows flagged `repetition` (quality.repetition: flag, the default)."""
    bad = server("--mean-tokens", "20", "--garbage", "loop", "--garbage-share", "0.1", "--fault-seed", "3")
    wf = make(tmp_path, bad.base_url, tiny_tokenizer)
    wf.run("--cores", "2", "all")
    records = wf.records("F")
    loops = [r for r in records if "repetition" in r["flags"]]
    assert loops and not blamed(wf) and len(loops) == server_stats(bad)["faults"]["garbage"]
    rows = [json.loads(x) for x in wf.path("results", "F", "raw_responses.jsonl").read_text().splitlines()]
    assert {r["id"] for r in rows if "repetition" in r["flags"]} == {r["id"] for r in loops}


def test_max_tokens_too_small_is_a_failure_naming_it_not_exhausted(tmp_path, server, tiny_tokenizer):
    srv = server("--mean-tokens", "20", "--truncate-share", "1.0")
    wf = make(tmp_path, srv.base_url, tiny_tokenizer, n=20, truncated="drop")
    proc = wf.run("--cores", "2", "all", check=False)
    assert proc.returncode != 0, proc.output[-3000:]
    assert "kept 0 of 20 responses (0%, quality.min_keep_share 0.1): max_tokens 256 cut 20 of 20 responses" \
        in proc.output, proc.output[-3000:]
    assert not wf.path("results", "F", "inference.done").exists()


def test_a_low_keep_share_stops_the_run_once_enough_responses_are_in(tmp_path, server, tiny_tokenizer):
    srv = server("--mean-tokens", "20", "--truncate-share", "0.95", "--fault-seed", "1")
    wf = make(tmp_path, srv.base_url, tiny_tokenizer, n=400, budget=100_000, truncated="drop")
    proc = wf.run("--cores", "2", "all", check=False)
    assert proc.returncode != 0 and "quality.min_keep_share 0.1): max_tokens 256 cut" in proc.output
    # stopped near the 50th response, not after asking all 400 prompts
    assert len(wf.records("F")) < 50 + CONCURRENCY + 1 and server_stats(srv)["requests"] < 100


def test_a_kill_during_a_trip_loses_nothing(tmp_path, server, tiny_tokenizer):
    """kill -9 once the first blame line is written (the trip in progress): the rerun on a good server
    meets the budget; every response journaled before the kill is counted once or blamed, none twice."""
    bad = server("--mean-tokens", "20", "--garbage", "empty", "--tokens-per-s", "50")
    wf = make(tmp_path, bad.base_url, tiny_tokenizer)
    proc = wf.start("--cores", "2", "all")
    try:
        wait_for(lambda: wf.path("results", "F", "journal.blamed.jsonl").exists(), timeout=120,
                 what="the first blame line")
        wf.killpg(proc, signal.SIGKILL)
    finally:
        if proc.poll() is None:
            wf.killpg(proc, signal.SIGKILL)
    before = {(r["id"], r["created"]) for r in wf.records("F")}
    wf.run("--unlock")
    mock_server.stop(bad)
    rerun_on_a_good_server(wf, server)
    after = wf.records("F")
    assert before <= {(r["id"], r["created"]) for r in after}  # nothing journaled was lost
    ids = counted_ids(wf)
    assert len(ids) == len(set(ids))
    done = json.loads(wf.path("results", "F", "inference.done").read_text())
    assert done["state"] == "met" and done["tokens"] >= 1200


def canary_file(path, n=4):
    with open(path, "w") as f:
        for i in range(n):
            f.write(json.dumps({"prompt": f"canary question {i}", "expect": r"\w+"}) + "\n")
    return path


def test_a_canary_that_fails_dispatches_nothing_and_names_its_lines(tmp_path, server, tiny_tokenizer):
    bad = server("--mean-tokens", "20", "--garbage", "loop")
    wf = make(tmp_path, bad.base_url, tiny_tokenizer)
    wf.config["server"]["canary"] = {"prompts": str(canary_file(tmp_path / "canary.jsonl")), "min_pass": 0.75}
    wf.write_config()
    proc = wf.run("--cores", "2", "all", check=False)
    assert proc.returncode != 0
    assert f"server.canary: nothing was dispatched: {bad.base_url}: 0 of 4 passed (min_pass 0.75); failed: " \
           f"{tmp_path / 'canary.jsonl'}:1: repetition: " in proc.output, proc.output[-3000:]
    assert server_stats(bad)["requests"] == 4 and not wf.path("results", "F", "journal.jsonl").exists()
    # a dry run asks nothing
    wf.run("-n", "all")
    assert server_stats(bad)["requests"] == 4


def test_a_canary_that_passes_is_said_and_the_run_goes_on(tmp_path, server, tiny_tokenizer):
    good = server("--mean-tokens", "20")
    wf = make(tmp_path, good.base_url, tiny_tokenizer)
    wf.config["server"]["canary"] = {"prompts": str(canary_file(tmp_path / "canary.jsonl")), "min_pass": 1.0}
    wf.write_config()
    proc = wf.run("--cores", "2", "all")
    assert f"server.canary: {good.base_url} 4 of 4 passed (min_pass 1)" in proc.output
    assert json.loads(wf.path("results", "F", "inference.done").read_text())["state"] == "met"
    before = server_stats(good)["requests"]
    wf.run("--cores", "2", "all")  # nothing left to do: no canary asked
    assert server_stats(good)["requests"] == before


def test_conversations_whose_turns_were_blamed_are_asked_again_each_turn_on_a_counted_one(
        tmp_path, server, tiny_tokenizer):
    """turns: all against a server that turns to loops after 12 good responses: turns built on a blamed turn
    are blamed with it or never journaled; the rerun on a good server finishes every conversation, each
    counted turn built on the counted turn before it (its history holds that turn's answer), no id twice."""
    bad = server("--mean-tokens", "20", "--garbage", "loop", "--garbage-after", "12")
    wf_dir = tmp_path / "work"
    write_conversations(wf_dir / "c.jsonl", 30, turns=3)
    wf = Workflow(wf_dir, base_config(bad.base_url, tiny_tokenizer, {"F": {"prompts": "c.jsonl"}},
                                      token_budget=10**6, concurrency=CONCURRENCY, turns="all",
                                      quality={"breaker": {"window": WINDOW, "share": 0.5}}))
    proc = wf.run("--cores", "2", "all", check=False)
    assert proc.returncode != 0 and "were loops (repetition)" in proc.output, proc.output[-3000:]
    rerun_on_a_good_server(wf, server)
    gone = {(b["id"], b["created"]) for b in blamed(wf)}
    counted = {}
    for r in wf.records("F"):
        if (r["id"], r["created"]) not in gone:
            assert r["id"] not in counted  # nothing counted twice
            counted[r["id"]] = r
    assert len(counted) == 90  # 30 conversations x 3 turns, every one finished
    for r in counted.values():
        if r["turn"] > 1:
            before = next(c for c in counted.values()
                          if c["conversation_id"] == r["conversation_id"] and c["turn"] == r["turn"] - 1)
            answered = [m["content"] for m in r["messages"][:-1] if m["role"] == "assistant"]
            assert before["messages"][-1]["content"] in answered  # built on the counted turn before it
            assert not any("repetition" in c["flags"] for c in counted.values()
                           if c["conversation_id"] == r["conversation_id"])


def test_nothing_kept_of_a_server_the_breaker_did_not_cut_off_is_asked_again(tmp_path, server, tiny_tokenizer):
    """quality.breaker.share 1 (never cut off) and a server empty from its first request: the run ends with
    nothing kept, non-zero, and blames this run's empty responses, so the rerun asks their prompts again."""
    bad = server("--mean-tokens", "20", "--garbage", "empty")
    wf = make(tmp_path, bad.base_url, tiny_tokenizer, n=20, budget=400)
    wf.config["generation"]["quality"]["breaker"]["share"] = 1.0
    wf.write_config()
    proc = wf.run("--cores", "2", "all", check=False)
    assert proc.returncode != 0, proc.output[-3000:]
    assert "kept 0 of 20 responses (0%, quality.min_keep_share 0.1): 20 of 20 responses were empty (the server)" \
        in proc.output and "20 responses of this run blamed on the server" in proc.output, proc.output[-3000:]
    rerun_on_a_good_server(wf, server)
    done = json.loads(wf.path("results", "F", "inference.done").read_text())
    assert done["state"] == "met" and len(set(counted_ids(wf))) == len(counted_ids(wf))
