"""Generation plans (budgetgen.conversations): turns of a conversation, ids of turns and samples, the
history sent back, what is left when errors end conversations; the endpoint affinity of a
conversation's turns (client.EndpointPool); the state and status under a changed plan."""

import asyncio
import json
import os

import pytest

from budgetgen import conversations, state
from budgetgen.conversations import Plan
from budgetgen.endpoints import EndpointPool
from budgetgen.prompts import Prompt
from budgetgen.status import compute_status
from budgetgen_testkit.records import stamped

U = lambda text: {"role": "user", "content": text}  # noqa: E731
A = lambda text, reasoning=None: {"role": "assistant", "content": text,  # noqa: E731
                                  **({"reasoning_content": reasoning} if reasoning else {})}
S = lambda text: {"role": "system", "content": text}  # noqa: E731


def prompt(pid, *messages):
    return Prompt(id=pid, messages=tuple(messages), line=1)


def test_segments_split_at_the_datasets_answers():
    assert conversations.segments([S("s"), U("u1"), A("a1"), U("u2"), A("a2"), U("u3")]) == [
        [S("s"), U("u1")], [U("u2")], [U("u3")]]
    # consecutive user messages are one turn; a system message between turns opens the next one
    assert conversations.segments([U("u1"), U("u1b"), A("a1"), S("mid"), U("u2")]) == [
        [U("u1"), U("u1b")], [S("mid"), U("u2")]]
    # an assistant greeting before any user turn is context (kept); a second answer in a row is dropped
    assert conversations.segments([A("hi"), U("u1"), A("a1"), A("a1b"), U("u2")]) == [[A("hi"), U("u1")], [U("u2")]]


def test_ids_of_turns_and_samples():
    p = prompt("c", U("u1"), A("x"), U("u2"))
    (last,) = conversations.chains([p], Plan())
    assert last.ids() == ["c"] and last.turn_index(1) == 2  # the prompt's own second turn
    assert last.request(1) == [U("u1"), A("x"), U("u2")]  # the dataset's history, as today
    (every,) = conversations.chains([p], Plan(turns="all"))
    assert every.ids() == ["c/t1", "c/t2"] and every.where(2) == {"conversation_id": "c", "prompt_id": "c", "turn": 2}
    sampled = conversations.chains([p], Plan(turns="all", samples=3))
    assert [c.id for c in sampled] == ["c/s1", "c/s2", "c/s3"]
    assert sampled[2].ids() == ["c/s3/t1", "c/s3/t2"] and sampled[2].where(1)["sample"] == 3
    assert sampled[2].where(1)["prompt_id"] == "c"  # the source prompt, shared by its samples and turns
    rec = {"conversation_id": "c/s3", "sample": 3, "turn": 1, "messages": []}  # written before prompt_id
    assert conversations.record_prompt_id("c/s3/t1", rec) == "c"
    assert conversations.record_prompt_id("c/t1", {"conversation_id": "c", "turn": 1, "messages": []}) == "c"
    only_samples = conversations.chains([p], Plan(samples=2))
    assert [c.ids() for c in only_samples] == [["c/s1"], ["c/s2"]]
    # every id of a prompt set is distinct, whatever its ids look like
    ps = [prompt("a", U("1")), prompt("a/t1", U("2")), prompt("a/s1", U("3"), A("x"), U("4"))]
    for plan in (Plan(), Plan(turns="all"), Plan(samples=2), Plan(turns="all", samples=2)):
        ids = [i for c in conversations.chains(ps, plan) for i in c.ids()]
        assert len(ids) == len(set(ids))


@pytest.mark.parametrize("policy", ["drop", "keep"])
def test_history_is_the_targets_own_answers_under_the_reasoning_policy(policy):
    (c,) = conversations.chains([prompt("c", S("s"), U("u1"), A("dataset"), U("u2"), U("u2b"))],
                                Plan(turns="all", history_reasoning=policy))
    assert c.request(1) == [S("s"), U("u1")]
    t1 = {"messages": [S("s"), U("u1"), A("mine", "thought")]}
    sent = c.request(2, t1)
    answer = A("mine", "thought") if policy == "keep" else A("mine")
    assert sent == [S("s"), U("u1"), answer, U("u2"), U("u2b")]
    with pytest.raises(ValueError):
        c.request(2)


def test_left_counts_turns_and_errors_end_a_conversation():
    ps = [prompt("a", U("1"), A("x"), U("2"), A("y"), U("3")), prompt("b", U("1"), A("x"), U("2")), prompt("c", U("1"))]
    cs = conversations.chains(ps, Plan(turns="all"))
    left = conversations.left(cs, set())
    assert (left.remaining, left.to_ask, left.chains_open) == (6, 6, 3)
    left = conversations.left(cs, {"a/t1", "c/t1"}, {"a/t2"})  # a: an error on turn 2 ends it at turn 1
    assert (left.remaining, left.blocked, left.to_ask, left.chains_open, left.chains_ended_by_error) == (4, 2, 2, 1, 1)
    # an error on a turn that is journaled after all (asked again under other settings) blocks nothing
    left = conversations.left(cs, {"a/t1", "a/t2", "c/t1", "b/t1", "b/t2"}, {"a/t2"})
    assert (left.remaining, left.to_ask, left.chains_ended_by_error) == (1, 1, 0)
    assert conversations.left(cs, {"a/t1", "a/t2", "a/t3", "b/t1", "b/t2", "c/t1"}).remaining == 0


def test_record_place_of_old_and_new_records():
    assert conversations.record_place("x/t2", {"conversation_id": "x", "turn": 2, "messages": []}) == ("x", 2)
    old = {"messages": [U("u1"), A("a"), U("u2"), A("generated")]}  # written before records said
    assert conversations.record_place("x", old) == ("x", 2)


def test_pool_keeps_a_conversation_on_its_endpoint_until_it_is_down():
    async def main():
        pool = EndpointPool(["http://a/v1", "http://b/v1"])
        a, b = pool.endpoints
        first = await pool.acquire("c1")
        other = await pool.acquire("c2")  # least loaded: the other endpoint
        assert {first, other} == {a, b}
        for _ in range(3):  # c1's later turns stay on its endpoint even when it is the busier one
            assert await pool.acquire("c1") is first
        assert await pool.acquire(None) is other  # no affinity: least loaded
        first.healthy = False  # c1's endpoint is down: fall back, and stay with the new one
        assert await pool.acquire("c1") is other
        first.healthy = True
        assert await pool.acquire("c1") is other
        pool.forget("c1")
        assert "c1" not in pool.affinity

    asyncio.run(main())


def test_pool_waits_for_room_on_a_conversations_endpoint():
    async def main():
        pool = EndpointPool(["http://a/v1", "http://b/v1"], per_endpoint=1)
        a = await pool.acquire("c1")
        waiting = asyncio.create_task(pool.acquire("c1"))
        await asyncio.sleep(0.05)
        assert not waiting.done()  # b has room, but c1's history is cached on a
        await pool.release(a)
        assert await asyncio.wait_for(waiting, 5) is a

    asyncio.run(main())


def test_a_status_counted_under_another_plan_never_says_exhausted(tmp_path):
    """The plan is part of the generation identity: a status counted under turns: last says nothing under
    turns: all (whose two turns are journaled under neither id), and its counts are the new plan's."""
    import yaml

    from budgetgen.configfile import load_config
    from budgetgen.settings import InferenceSettings

    (tmp_path / "prompts.jsonl").write_text(json.dumps({"id": "a", "messages": [U("1"), A("x"), U("2")]}) + "\n")
    (tmp_path / "results" / "d").mkdir(parents=True)
    (tmp_path / "results" / "d" / "journal.jsonl").write_text(json.dumps(stamped(
        {"id": "a", "messages": [U("1"), A("x"), U("2"), A("y")], "params": {"model": "m", "max_tokens": 64},
         "usage": {"completion_tokens": 5}})) + "\n")  # a record of turns: last

    def settings(**generation):
        path = tmp_path / "config.yaml"
        path.write_text(yaml.safe_dump({
            "server": {"base_url": "http://127.0.0.1:9/v1", "model": "m"}, "tokenizer": {"path": "tok"},
            "generation": {"token_budget": 100, "max_tokens": 64, **generation},
            "datasets": {"d": {"prompts": str(tmp_path / "prompts.jsonl")}}}))
        return InferenceSettings.from_config(load_config(path), "d")

    os_cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        last = settings()
        st = compute_status(last)
        assert st["remaining_prompts"] == 0 and st["tokens"] == 5  # the old record is this identity's
        assert st["identity"] == last.identity.sha and not st["refused"]
        assert state.decide(None, st, 100, last.policy.key(), False, True)[0] == state.EXHAUSTED
        every = settings(turns="all", samples_per_prompt=2)
        assert state.decide(None, st, 100, every.policy.key(), False, True)[0] == state.PARTIAL
        st_all = compute_status(every)
        assert st_all["remaining_prompts"] == 4 and st_all["conversations"] == 4 // 2 and st_all["tokens"] == 0
        assert st_all["settings_changed"] == ['history_reasoning unset -> "drop"', "samples_per_prompt 1 -> 2",
                                              'turns "last" -> "all"']
        assert st_all["refused"].startswith("dataset d: its journal holds 1 records made under other generation")
    finally:
        os.chdir(os_cwd)
