"""On-policy multi-turn generation (generation.turns: all) against real mock servers on loopback: every
assistant turn is the target's own, one journal record and one training row per turn; the history
sent back under history_reasoning drop/keep; resume inside a conversation after kill -9; a budget cut
mid-conversation; endpoint affinity with two servers; samples_per_prompt; permanent errors on a later
turn; `snakemake -n` counts."""

import json
import signal
import subprocess
from collections import Counter
from types import SimpleNamespace

import pytest
from datasets import Dataset

from budgetgen import conversations, prompts
from budgetgen_testkit import mock_server
from support.jobs import JobFiles, job_cmd
from support.workflow import Workflow, base_config, planned_inference, wait_for, write_conversations

pytestmark = pytest.mark.slow

MAX_TOKENS = 64


def conversation_workflow(tmp_path, srv, tokenizer, n, **generation):
    """A workflow with one dataset M of n 3-turn conversations (work/conv.jsonl) against srv."""
    wf_dir = tmp_path / "work"
    wf_dir.mkdir()
    write_conversations(wf_dir / "conv.jsonl", n)
    generation = {"token_budget": 10**6, "max_tokens": MAX_TOKENS, **generation}
    return Workflow(wf_dir, base_config(srv.base_url, tokenizer, {"M": {"prompts": "conv.jsonl"}}, **generation))


def user_turns(path):
    """{conversation id: [user text of turn 1, 2, ...]} of a prompts file."""
    return {p.id: [m["content"] for m in p.messages if m["role"] == "user"]
            for p in prompts.load_prompts(path).prompts}


def mock_answer(cfg, messages):
    """The assistant message the mock server answers `messages` with (deterministic per messages)."""
    reasoning, content = mock_server.Plan(cfg, messages, MAX_TOKENS).texts()
    return {"role": "assistant", "content": content, **({"reasoning_content": reasoning} if reasoning.strip() else {})}


def expected_conversation(cfg, users, policy="drop"):
    """The requests and answers of every turn, as the target itself would continue the conversation."""
    sent, history = [], []
    for text in users:
        request = history + [{"role": "user", "content": text}]
        answer = mock_answer(cfg, request)
        sent.append((request, answer))
        back = {"role": "assistant", "content": answer["content"]}
        if policy == "keep" and "reasoning_content" in answer:
            back["reasoning_content"] = answer["reasoning_content"]
        history = request + [back]
    return sent


def request_log(path):
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def by_id(records):
    return {r["id"]: r for r in records}


def journaled(files):
    """The whole records of a journal another process is appending to (a torn last line is left out)."""
    if not files.journal.exists():
        return []
    text = files.journal.read_text()
    return [json.loads(line) for line in text.splitlines(keepends=True) if line.endswith("\n")]


SERVER_ARGS = ["--mean-tokens", "24", "--reasoning-share", "0.3"]  # every answer has reasoning and content


def test_three_user_turns_make_three_rows_holding_the_targets_own_answers(tmp_path, server, tiny_tokenizer):
    srv = server(*SERVER_ARGS)
    cfg = mock_server.parse_args(SERVER_ARGS)
    wf = conversation_workflow(tmp_path, srv, tiny_tokenizer, 4, turns="all")
    wf_dir = wf.dir
    wf.run("--cores", "2", "all")
    records = by_id(wf.records("M", "raw_responses.jsonl"))
    assert len(records) == 12
    for cid, users in user_turns(wf_dir / "conv.jsonl").items():
        for k, (request, answer) in enumerate(expected_conversation(cfg, users), 1):
            rec = records[f"{cid}/t{k}"]
            assert rec["conversation_id"] == cid and rec["turn"] == k
            assert rec["messages"][:-1] == request  # the history is the target's own earlier answers
            assert rec["messages"][-1] == answer
            settings = rec["identity_settings"]  # the plan is part of the generation identity
            assert settings["turns"] == "all" and settings["history_reasoning"] == "drop"
        assert "dataset's answer" not in json.dumps(records[f"{cid}/t3"]["messages"])
    ds = Dataset.from_file(str(wf.path("results", "M", "tokenized.arrow")))
    assert ds.num_rows == 12
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tiny_tokenizer))
    rows = {r["id"]: r for r in ds}
    for rid, rec in records.items():
        row = rows[rid]
        assert (row["conversation_id"], row["turn"]) == (rec["conversation_id"], rec["turn"])
        n_prompt = row["loss_mask"].index(1)
        prompt_text = tok.decode(row["input_ids"][:n_prompt])
        completion = tok.decode(row["input_ids"][n_prompt:])
        for m in rec["messages"][:-1]:  # the prompt holds every earlier turn, the completion this turn alone
            assert m["content"] in prompt_text
        assert rec["messages"][-1]["content"] in completion and rec["messages"][-2]["content"] not in completion
    summary = wf.path("results", "summary.tsv").read_text().splitlines()
    row = dict(zip(summary[0].split("\t"), summary[1].split("\t")))
    assert (row["conversations"], row["conversations_finished"], row["responses"], row["tokenized_rows"]) == (
        "4", "4", "12", "12")
    per_turn = {}
    for rec in records.values():
        per_turn[rec["turn"]] = per_turn.get(rec["turn"], 0) + rec["usage"]["completion_tokens"]
    assert row["tokens_per_turn"] == ";".join(f"{t}:{per_turn[t]}" for t in sorted(per_turn))
    assert wf.path("results", "M", "plots", "turns.svg").exists()


@pytest.mark.parametrize("policy", ["drop", "keep"])
def test_history_reasoning_sends_what_it_says(tmp_path, server, policy):
    log = tmp_path / "requests.jsonl"
    srv = server(*SERVER_ARGS, "--request-log", log)
    cfg = mock_server.parse_args(SERVER_ARGS)
    write_conversations(tmp_path / "prompts.jsonl", 3)
    p = subprocess.run(job_cmd(tmp_path, srv.base_url, budget=10**6, max_tokens=MAX_TOKENS, concurrency=4,
                               turns="all", history_reasoning=policy), capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    sent = [r["messages"] for r in request_log(log)]
    assert len(sent) == 9
    for users in user_turns(tmp_path / "prompts.jsonl").values():
        for request, _ in expected_conversation(cfg, users, policy):
            assert sent.count(request) == 1  # exactly this history, once
    history = [m for request in sent for m in request if m["role"] == "assistant"]
    assert history and all(("reasoning_content" in m) == (policy == "keep") for m in history)
    recs = JobFiles(tmp_path).records()
    assert {r["identity_settings"]["history_reasoning"] for r in recs} == {policy}


def test_kill_mid_conversation_then_resume_regenerates_no_turn_and_loses_none(tmp_path, server):
    log = tmp_path / "requests.jsonl"
    # 20 tokens at 10 tokens/s: each turn streams for 2 s, so a conversation is under way for 6 s
    args = ["--mean-tokens", "20", "--tokens-per-s", "10", "--reasoning-share", "0.3"]
    srv = server(*args, "--request-log", log)
    write_conversations(tmp_path / "prompts.jsonl", 3)
    files = JobFiles(tmp_path)
    cmd = job_cmd(tmp_path, srv.base_url, budget=10**6, max_tokens=MAX_TOKENS, concurrency=3, turns="all")
    job = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        wait_for(lambda: any(r["turn"] == 1 for r in journaled(files)), timeout=60, what="a first turn journaled")
    finally:
        job.send_signal(signal.SIGKILL)
        job.wait(timeout=30)
    before = by_id(files.records())
    # the premise, after the kill: a conversation has turns journaled and turns still to make
    partial = {r["conversation_id"] for r in before.values()} - {r["conversation_id"] for r in before.values()
                                                                 if r["turn"] == 3}
    assert partial, f"no conversation under way at the kill: {sorted(before)}"
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "Conversations under way:" in p.stdout + p.stderr
    lines = files.records()
    after = by_id(lines)
    assert len(lines) == len(after) == 9  # every turn once: none lost, none twice
    assert all(after[i] == rec for i, rec in before.items())  # nothing rewritten
    sent = [json.dumps(r["messages"], sort_keys=True) for r in request_log(log)]
    for rid, rec in after.items():
        asked = sent.count(json.dumps(rec["messages"][:-1], sort_keys=True))
        assert asked == 1 if rid in before else asked >= 1, rid  # a journaled turn is never asked again
        if rec["turn"] > 1:  # continued from the journaled previous turn, resumed or not
            prev = after[f"{rec['conversation_id']}/t{rec['turn'] - 1}"]
            back = {"role": "assistant", "content": prev["messages"][-1]["content"]}
            assert rec["messages"][: len(prev["messages"])] == prev["messages"][:-1] + [back]


def test_budget_cut_mid_conversation_keeps_the_finished_turns(tmp_path, server, tiny_tokenizer):
    srv = server("--mean-tokens", "20")
    wf = conversation_workflow(tmp_path, srv, tiny_tokenizer, 20, token_budget=150, concurrency=2, turns="all")
    wf_dir = wf.dir
    wf.run("--cores", "1", "all")
    records = wf.records("M", "raw_responses.jsonl")
    tokens = sum(r["usage"]["completion_tokens"] for r in records)
    assert 150 <= tokens < 150 + 2 * MAX_TOKENS
    done = json.loads(wf.path("results", "M", "inference.done").read_text())
    assert done["state"] == "met"
    turns = {}
    for r in records:
        turns.setdefault(r["conversation_id"], set()).add(r["turn"])
    assert any(t != {1, 2, 3} for t in turns.values())  # cut mid-conversation
    assert all(t == set(range(1, max(t) + 1)) for t in turns.values())  # each kept from turn 1 on
    # conversations are started in the seeded order (a uniform sample of conversations)
    chain_ids = [c.id for c in conversations.chains(prompts.load_prompts(wf_dir / "conv.jsonl").prompts,
                                                    conversations.Plan(turns="all"))]
    order = prompts.dispatch_order(chain_ids, 1)
    assert set(turns) == set(order[: len(turns)])
    assert Dataset.from_file(str(wf.path("results", "M", "tokenized.arrow"))).num_rows == len(records)
    # the status table counts turns: as many responses as journaled turns
    dry = wf.run("-n", "all")
    line = next(ln for ln in dry.output.splitlines() if ln.startswith("budgetgen: M "))
    assert line.split()[5] == str(len(records)) and line.split()[-1] == "met"


def test_turns_of_a_conversation_stay_on_one_endpoint(tmp_path, server):
    logs = [tmp_path / "a.jsonl", tmp_path / "b.jsonl"]
    servers = [server("--mean-tokens", "20", "--tokens-per-s", "400", "--request-log", log) for log in logs]
    write_conversations(tmp_path / "prompts.jsonl", 8)
    p = subprocess.run(job_cmd(tmp_path, [s.base_url for s in servers], budget=10**6, max_tokens=MAX_TOKENS,
                               concurrency=4, turns="all"), capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    where = {}
    for n, log in enumerate(logs):
        for r in request_log(log):
            where.setdefault(r["messages"][0]["content"].split()[0], set()).add(n)
    assert len(where) == 8 and all(len(ends) == 1 for ends in where.values())  # one endpoint per conversation
    assert {n for ends in where.values() for n in ends} == {0, 1}  # and both endpoints used
    assert len(JobFiles(tmp_path).records()) == 24


def test_a_conversation_moves_only_when_its_endpoint_is_down(tmp_path, server):
    logs = [tmp_path / "a.jsonl", tmp_path / "b.jsonl"]
    args = ["--mean-tokens", "20", "--tokens-per-s", "20"]
    servers = [server(*args, "--request-log", log) for log in logs]
    write_conversations(tmp_path / "prompts.jsonl", 2)
    files = JobFiles(tmp_path)
    cmd = job_cmd(tmp_path, [s.base_url for s in servers], budget=10**6, max_tokens=MAX_TOKENS, concurrency=2,
                  turns="all", endpoint_recheck_s=60)
    job = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        wait_for(lambda: len(journaled(files)) >= 2, timeout=60, what="two turns journaled")
        servers[0].send_signal(signal.SIGSTOP)  # frozen: its conversation can make no more turns
        # the premise, held however late this test looked: the first endpoint's conversation is not done
        on_first = {r["messages"][0]["content"].split()[0] for r in request_log(logs[0])}
        turns = Counter(r["messages"][0]["content"].split()[0] for r in journaled(files))
        assert on_first and all(turns[c] < 3 for c in on_first), (on_first, turns)
        servers[0].terminate()  # the first endpoint goes down mid-run (SIGTERM, handled once continued)
        servers[0].send_signal(signal.SIGCONT)
        mock_server.stop(servers[0])
        out, _ = job.communicate(timeout=120)
    finally:
        if job.poll() is None:
            job.kill()
    assert job.returncode == 0, out
    assert len(files.records()) == 6
    first = {r["messages"][0]["content"].split()[0] for r in request_log(logs[0])}
    moved = {r["messages"][0]["content"].split()[0] for r in request_log(logs[1]) if len(r["messages"]) > 1}
    assert first and first <= moved  # its conversation went on at the endpoint still up


def test_samples_per_prompt_make_distinct_ids_and_rows(tmp_path, server, tiny_tokenizer):
    srv = server(*SERVER_ARGS)
    wf_dir = tmp_path / "work"
    wf_dir.mkdir()
    (wf_dir / "p.jsonl").write_text("".join(json.dumps({"id": f"q{i}", "prompt": f"question {i}"}) + "\n"
                                            for i in range(4)))
    config = base_config(srv.base_url, tiny_tokenizer, {"S": {"prompts": "p.jsonl"}}, token_budget=10**6,
                         max_tokens=MAX_TOKENS, samples_per_prompt=3)
    wf = Workflow(wf_dir, config)
    wf.run("--cores", "2", "all")
    records = wf.records("S", "raw_responses.jsonl")
    assert sorted(r["id"] for r in records) == sorted(f"q{i}/s{s}" for i in range(4) for s in (1, 2, 3))
    assert {r["sample"] for r in records} == {1, 2, 3}
    ds = Dataset.from_file(str(wf.path("results", "S", "tokenized.arrow")))
    assert ds.num_rows == 12 and len(set(ds["id"])) == 12
    summary = wf.path("results", "summary.tsv").read_text().splitlines()
    row = dict(zip(summary[0].split("\t"), summary[1].split("\t")))
    assert row["status"] == "exhausted" and row["conversations"] == "12" and row["prompts"] == "4"


def test_a_permanent_error_on_a_later_turn_ends_that_conversation_only(tmp_path, server, tiny_tokenizer):
    args = ["--mean-tokens", "20", "--fail-400", "0.25", "--fault-seed", "3"]
    srv = server(*args)
    cfg = mock_server.parse_args(args)
    wf = conversation_workflow(tmp_path, srv, tiny_tokenizer, 12, turns="all")
    wf_dir = wf.dir
    refuses = lambda messages: mock_server.MockServer.fails_400(SimpleNamespace(cfg=cfg), messages)  # noqa: E731
    ended_at = {}  # conversation -> the turn whose request the server refuses (by its deterministic rule)
    for cid, users in user_turns(wf_dir / "conv.jsonl").items():
        for k, (request, _) in enumerate(expected_conversation(cfg, users), 1):
            if refuses(request):
                ended_at[cid] = k
                break
    assert any(k > 1 for k in ended_at.values()), ended_at  # the premise: a later turn fails
    wf.run("--cores", "1", "all")
    records = wf.records("M", "raw_responses.jsonl")
    got = {}
    for r in records:
        got.setdefault(r["conversation_id"], set()).add(r["turn"])
    for cid in user_turns(wf_dir / "conv.jsonl"):
        want = set(range(1, ended_at.get(cid, 4)))
        assert got.get(cid, set()) == want, cid  # earlier turns kept, none after the error
    errors = wf.records("M", "errors.jsonl")
    assert {(e["conversation_id"], e["turn"]) for e in errors} == set(ended_at.items())
    summary = wf.path("results", "summary.tsv").read_text().splitlines()
    row = dict(zip(summary[0].split("\t"), summary[1].split("\t")))
    assert row["status"] == "exhausted"
    assert row["conversations_ended_by_error"] == str(len(ended_at))
    dry = wf.run("-n", "all")
    assert "Nothing to be done" in dry.output and not planned_inference(dry.output)


def test_switching_turns_to_all_plans_the_work_it_adds(tmp_path, server, tiny_tokenizer):
    srv = server("--mean-tokens", "20")
    wf = conversation_workflow(tmp_path, srv, tiny_tokenizer, 3)
    wf.run("--cores", "1", "all")
    assert len(wf.records("M")) == 3  # turns: last: one generation per conversation, exhausted
    wf.config["generation"]["turns"] = "all"
    wf.write_config()
    # the status counted under turns: last says nothing under turns: all: -n plans inference and says why
    # it will not run (the journal holds records of other generation settings)
    dry = wf.run("-n", "all")
    assert planned_inference(dry.output) == {"M"} and 'refused: settings changed (' in dry.output
    failed = wf.run("--cores", "1", "all", check=False)
    assert failed.returncode != 0 and 'turns "last" -> "all"' in failed.output and len(wf.records("M")) == 3
    wf.config["generation"]["on_settings_change"] = "regenerate"
    wf.write_config()
    wf.run("--cores", "1", "all")
    assert len(wf.records("M")) == 3 + 9  # every turn generated; the old records kept in the journal
    rows = Dataset.from_file(str(wf.path("results", "M", "tokenized.arrow")))
    assert sorted(rows["id"]) == sorted(f"c{i}/t{t}" for i in range(3) for t in (1, 2, 3))  # the new ones only
