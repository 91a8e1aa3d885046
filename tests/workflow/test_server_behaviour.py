"""What real servers do that the mock does not simulate, against small hand-made servers on loopback
(tests/support/scripted_server.py) and the real client and inference job: an error object inside a stream,
401 on chat only, no usage, an engine's `abort`, several tokens per SSE event, a request queued inside
the server longer than request_timeout_s, streams still delivering while other requests fail, a
streak of identical permanent errors, permanent errors tied to the settings that produced them."""

import asyncio
import json
import os
import subprocess
import time

import pytest

from budgetgen.client import ChatClient
from budgetgen.streams import PermanentError, ServerRefused, TransientError
from support.jobs import JobFiles, job_cmd, write_job_config
from support.scripted_server import ScriptedServer, answer_words, delta, finish, json_reply, sse, usage
from support.workflow import write_prompts


def chat(base_url, timeout_s=5, on_token=None, client_hook=None, **kw):
    async def go():
        c = ChatClient(base_url, "mock-model", timeout_s=timeout_s, concurrency=4, **kw)
        if client_hook:
            client_hook(c)
        try:
            return await c.chat([{"role": "user", "content": "hi"}], {"max_tokens": 50}, on_token=on_token)
        finally:
            await c.aclose()

    return asyncio.run(go())


# -- classification --------------------------------------------------------------------------------
def test_error_inside_a_stream_is_classified_by_its_code():
    """Item 7: SGLang answers an over-long prompt with an error object inside a 200 stream."""
    def answer(body, n):
        code = 400 if n == 1 else 503
        return sse([delta("a"), {"error": {"message": "The input is too long", "type": "BadRequestError",
                                           "code": code}}])

    with ScriptedServer(answer) as srv:
        with pytest.raises(PermanentError) as e:
            chat(srv.base_url)
        assert e.value.status == 400 and "too long" in e.value.message
        with pytest.raises(TransientError):  # a 5xx inside the stream stays transient
            chat(srv.base_url)


def test_finish_reason_abort_is_retried_not_kept():
    """Item 14: `abort` (the engine dropped the request) is not a complete response."""
    with ScriptedServer(lambda body, n: sse([delta("half an ans"), finish("abort"), usage(3)])) as srv:
        with pytest.raises(TransientError, match="finish_reason abort"):
            chat(srv.base_url)


def test_key_refused_on_chat_and_no_usage_are_server_wide_failures():
    with ScriptedServer(lambda body, n: json_reply(401, {"error": {"message": "invalid api key"}})) as srv:
        with pytest.raises(ServerRefused, match="refused the API key"):
            chat(srv.base_url)
    with ScriptedServer(lambda body, n: sse([delta("fine"), finish("stop"), "data: [DONE]"])) as srv:
        with pytest.raises(ServerRefused, match="no usage.completion_tokens"):
            chat(srv.base_url)


@pytest.mark.parametrize("line", ["data: []", "data: null", 'data: {"choices": ["x"]}'])
def test_a_stream_line_that_is_not_a_chunk_object_is_a_retry_not_a_crash(tmp_path, line):
    """Issue 24 item 5: `data: []`, `data: null` or choices that are not objects are a broken stream
    (retried, like malformed JSON), never an AttributeError that kills the job."""
    def answer(body, n):
        return sse([line] + answer_words(3)) if n == 1 else sse(answer_words(3))

    with ScriptedServer(answer) as srv:
        with pytest.raises(TransientError, match="malformed stream chunk"):
            chat(srv.base_url)
    with ScriptedServer(answer) as srv:
        p = job(tmp_path, srv.base_url, 1, max_retries=2)
    assert p.returncode == 0, p.output[-3000:]
    assert "Traceback" not in p.output and len(p.records) == 1 and p.records[0]["attempts"] == 2


def test_the_liveness_probe_gets_a_connection_while_every_request_connection_waits(tmp_path):
    """Issue 24 item 4: concurrency 3, three requests each held 12 s before their first byte (queued in
    a busy server), request_timeout_s 1: the liveness probe (GET /models) must not wait for one of the
    three connections (the pool is sized to the concurrency), fail, and cancel the streams as if the
    server were down. Each request completes on its first attempt."""
    with ScriptedServer(lambda body, n: sse([12.0] + answer_words(3))) as srv:
        async def go():
            c = ChatClient(srv.base_url, "mock-model", timeout_s=1, concurrency=3)
            try:
                return await asyncio.gather(*(c.chat([{"role": "user", "content": f"q{i}"}], {"max_tokens": 5})
                                              for i in range(3)), return_exceptions=True)
            finally:
                await c.aclose()

        t0 = time.monotonic()
        results = asyncio.run(go())
        assert [type(r).__name__ for r in results] == ["ChatResult"] * 3, results
        assert len(srv.bodies) == 3 and time.monotonic() - t0 >= 12  # no retry; the premise: they waited


@pytest.mark.parametrize("first", ["watchdog", "shutdown"])
def test_a_shutdown_cancel_in_the_same_loop_turn_as_a_watchdog_timeout_is_honoured(first):
    """Issue 24 item 8: the watchdog times a stream out (cancel + note) and the run's shutdown cancels the
    same task before it runs again: two cancels, one CancelledError. The task must end cancelled at once,
    not turn the watchdog's cancel into a retry and swallow the shutdown's."""
    with ScriptedServer(lambda body, n: sse([delta("a"), 30.0] + answer_words(3))) as srv:
        async def go():
            c = ChatClient(srv.base_url, "mock-model", timeout_s=30, concurrency=2)
            try:
                task = asyncio.create_task(c.chat([{"role": "user", "content": "hi"}], {"max_tokens": 5}))
                deadline = time.monotonic() + 10
                while not any(st.got_first for st in c.watchdog.streams):  # the stream has its first byte
                    assert time.monotonic() < deadline
                    await asyncio.sleep(0.01)
                (st,) = c.watchdog.streams
                if first == "watchdog":
                    c.watchdog._time_out(st, "no data for 30 s")
                    task.cancel()
                else:
                    task.cancel()
                    c.watchdog._time_out(st, "no data for 30 s")
                done, _ = await asyncio.wait([task], timeout=5)
                assert done, "the cancelled request is still running"
                assert task.cancelled(), task.exception()
            finally:
                await c.aclose()

        asyncio.run(go())


# -- tokens in flight --------------------------------------------------------------------------------
def test_several_tokens_per_event_are_counted_as_tokens():
    """Item 10: 4 tokens per SSE event. With per-chunk usage (continuous_usage_stats) the count is the
    server's; with ids it is their number; with text only it is estimated at the learned ratio."""
    def answer(body, n):
        assert body["stream_options"] == {"include_usage": True, "continuous_usage_stats": True}
        if n == 1:  # per-chunk usage
            return sse([delta(" w w w w", usage_so_far=4 * (i + 1)) for i in range(5)]
                       + [finish(), usage(20)])
        if n == 2:  # token ids
            return sse([delta(" w w w w", token_ids=[7, 7, 7, 7]) for _ in range(5)] + [finish(), usage(20)])
        return sse(answer_words(20, words_per_event=4))

    with ScriptedServer(answer) as srv:
        for _ in range(2):
            got = []
            r = chat(srv.base_url, on_token=got.append)
            assert got == [4] * 5 and r.usage["completion_tokens"] == 20
        got = []

        def learned(c):  # as after earlier responses of " w" per token: 2 characters a token
            c.token_rate.observe(2 * c.token_rate.MIN_TOKENS, c.token_rate.MIN_TOKENS)

        chat(srv.base_url, on_token=got.append, client_hook=learned)
        assert got[:5] == [4] * 5 and sum(got) == 20  # the last top-up comes from the final usage


# -- timeouts and liveness ---------------------------------------------------------------------------
def job(tmp_path, base_url, n_prompts, **kw):
    write_prompts(tmp_path / "prompts.jsonl", n_prompts)
    p = subprocess.run(job_cmd(tmp_path, base_url, **kw), capture_output=True, text=True, timeout=180)
    p.output = p.stdout + p.stderr
    files = JobFiles(tmp_path)
    p.records, p.errors = files.records("journal"), files.records("errors")
    return p


def prompt_number(body):
    return int(body["messages"][-1]["content"].split("number ")[1].split(":")[0])


def test_a_request_queued_in_a_busy_server_waits_past_request_timeout_without_a_retry(tmp_path):
    """Item 9: prompt 1 waits 3 s for its first byte (queued behind prompt 0, which streams all the
    while) with request_timeout_s 1: it is not timed out (no retry, one attempt), because the server
    is alive. Silence after a first byte is still timed out: prompt 2 stalls 3 s mid-stream once."""
    state = {"p2_calls": 0}

    def answer(body, n):
        k = prompt_number(body)
        if k == 0:  # streams a token every 0.1 s for 3 s
            return sse(answer_words(30, pause=0.1))
        if k == 1:  # queued: headers at once, no data for 3 s
            return sse([3.0] + answer_words(5))
        state["p2_calls"] += 1
        if state["p2_calls"] == 1:  # started, then stalled for good (well past the timeout)
            return sse([delta(" w"), 30.0] + answer_words(5))
        return sse(answer_words(5))

    with ScriptedServer(answer) as srv:
        p = job(tmp_path, srv.base_url, 3, concurrency=3, request_timeout_s=1, max_retries=1)
    assert p.returncode == 0, p.output[-3000:]
    by_prompt = {prompt_number({"messages": r["messages"][:-1]}): r for r in p.records}
    assert sorted(by_prompt) == [0, 1, 2]
    assert by_prompt[1]["attempts"] == 1 and by_prompt[1]["latency_s"] >= 2.9  # waited, never retried
    assert by_prompt[0]["latency_s"] >= 2.9  # the premise: prompt 0 streamed through prompt 1's wait
    assert by_prompt[2]["attempts"] == 2 and "ReadTimeout" in p.output  # the mid-stream stall


def test_streams_still_delivering_keep_the_server_alive_past_the_unreachable_deadline(tmp_path):
    """Item 8: prompt 0 streams for 4 s while prompt 1 gets HTTP 500 for 3 s; the unreachable deadline
    is 1.5 s. No response completes in that time, but bytes arrive: the job must not fail. The 3 s of 500s
    count from prompt 1's first request (not the test's start, which a loaded machine may leave behind)."""
    state = {"t0": None, "500s": 0}

    def answer(body, n):
        if prompt_number(body) == 0:
            return sse(answer_words(40, pause=0.1))
        state["t0"] = state["t0"] or time.monotonic()
        if time.monotonic() - state["t0"] < 3.0:
            state["500s"] += 1
            return json_reply(500, {"error": {"message": "busy", "code": 500}})
        return sse(answer_words(5))

    with ScriptedServer(answer) as srv:
        p = job(tmp_path, srv.base_url, 2, concurrency=2, unreachable_deadline_s=1.5, max_retries=100)
    assert p.returncode == 0, p.output[-3000:]
    assert len(p.records) == 2 and "failing for" not in p.output
    assert state["500s"] >= 2  # the premise: prompt 1 was refused for longer than the deadline
    assert max(r["latency_s"] for r in p.records) > 1.5 * 2  # the premise: longer than the deadline


# -- server-wide failures and errors tied to settings -------------------------------------------------
def error_lines(output):
    return [line for line in output.splitlines() if line.startswith("error: ")]


def test_key_refused_on_chat_fails_the_job_in_one_line_recording_nothing(tmp_path):
    """Item 2: /models answers, chat says 401 (a rotated key): not 'exhausted', exit 2, one line."""
    with ScriptedServer(lambda body, n: json_reply(401, {"error": {"message": "bad key"}})) as srv:
        p = job(tmp_path, srv.base_url, 10)
    assert p.returncode == 2 and len(error_lines(p.output)) == 1, p.output[-3000:]
    assert "refused the API key (HTTP 401" in error_lines(p.output)[0] and "Traceback" not in p.output
    assert p.errors == [] and not (tmp_path / "results" / "d" / "inference.done").exists()


def test_no_usage_fails_the_job_in_one_line(tmp_path):
    with ScriptedServer(lambda body, n: sse([delta("x"), finish(), "data: [DONE]"])) as srv:
        p = job(tmp_path, srv.base_url, 10)
    assert p.returncode == 2 and "no usage.completion_tokens" in error_lines(p.output)[0], p.output[-3000:]
    assert p.errors == [] and not (tmp_path / "results" / "d" / "inference.done").exists()


def test_every_request_failing_the_same_way_fails_the_job_and_records_none(tmp_path):
    """A streak of identical permanent errors is the server's, not the prompts': one line, nothing
    recorded, so the prompts are asked again once the server is fixed."""
    bad = lambda body, n: json_reply(400, {"error": {"message": "model not loaded", "code": 400}})  # noqa: E731
    with ScriptedServer(bad) as srv:
        p = job(tmp_path, srv.base_url, 60, concurrency=4)
    assert p.returncode == 2 and "every request fails the same way: 20 in a row" in error_lines(p.output)[0]
    assert p.errors == [] and not (tmp_path / "results" / "d" / "inference.done").exists()
    with ScriptedServer(bad) as srv:  # fewer prompts than the streak: still never "exhausted"
        p = job(tmp_path, srv.base_url, 5, concurrency=2)
    assert p.returncode == 2 and "no response from the server for any prompt" in error_lines(p.output)[0]
    assert p.errors == [] and not (tmp_path / "results" / "d" / "inference.done").exists()
    with ScriptedServer(lambda body, n: sse(answer_words(3))) as srv:  # fixed: everything is asked
        p = job(tmp_path, srv.base_url, 5, concurrency=2)
    assert p.returncode == 0 and len(p.records) == 5


def test_a_permanent_error_holds_only_under_the_settings_that_produced_it(tmp_path, server):
    """Item 2: prompts whose max_tokens does not fit the context fail with 400 (recorded: other
    prompts succeed); lowering max_tokens (a settings change: refused, then on_settings_change: extend,
    the explicit way to retry them) makes exactly those prompts eligible again."""
    with open(tmp_path / "prompts.jsonl", "w") as f:
        for i in range(12):
            words = " ".join(["word"] * (40 if i % 3 == 0 else 2))
            f.write(json.dumps({"id": f"p{i}", "prompt": f"{words} {i}"}) + "\n")
    srv = server("--context-limit", "100", "--mean-tokens", "5")
    def run(max_tokens, **kw):
        p = subprocess.run(job_cmd(tmp_path, srv.base_url, max_tokens=max_tokens, **kw), capture_output=True,
                           text=True, timeout=120)
        return p.stdout + p.stderr, p.returncode

    out, rc = run(80)
    assert rc == 0, out[-3000:]
    errors = [json.loads(x) for x in (tmp_path / "results" / "d" / "errors.jsonl").read_text().splitlines()]
    failed = {e["id"] for e in errors}
    assert failed == {f"p{i}" for i in range(0, 12, 3)} and all(e["params"]["max_tokens"] == 80 for e in errors)
    assert json.load(open(tmp_path / "results" / "d" / "inference.done"))["state"] == "exhausted"
    requests = json.loads(__import__("httpx").get(srv.base_url[:-3] + "/stats").text)["requests"]
    out, rc = run(80)  # same settings: nothing asked again
    assert rc == 0 and "4 failed permanently earlier" in out
    assert json.loads(__import__("httpx").get(srv.base_url[:-3] + "/stats").text)["requests"] == requests
    out, rc = run(20)  # lower max_tokens: a settings change on a journal, refused before any request
    assert rc == 2 and "max_tokens 80 -> 20" in out and "on_settings_change" in out, out[-3000:]
    out, rc = run(20, on_settings_change="extend")  # kept, and the four fit now and are asked again
    assert rc == 0 and "4 failed earlier under other settings (asked again)" in out, out[-3000:]
    journaled = {json.loads(x)["id"] for x in (tmp_path / "results" / "d" / "journal.jsonl").read_text().splitlines()}
    assert journaled == {f"p{i}" for i in range(12)}


def test_fsync_failure_fails_the_job_in_one_line(tmp_path, server, monkeypatch):
    """Item 16: the fsync clock runs in a background task; an fsync error there must end the job with
    one line instead of dying unseen. (os.fsync is made to fail: no local filesystem fails on demand.)"""
    import errno

    from budgetgen import inference
    from budgetgen.errors import UserError

    write_prompts(tmp_path / "prompts.jsonl", 4)

    def answer(body, n):  # two quick responses, then two streams of 20 s: a quiet spell for the journal
        return sse(answer_words(3) if prompt_number(body) < 2 else answer_words(200, pause=0.1))

    def failing_fsync(fd):
        raise OSError(errno.EIO, "Input/output error")

    t0 = time.monotonic()
    with ScriptedServer(answer) as srv:
        from budgetgen.configfile import load_config
        from budgetgen.settings import InferenceSettings

        config = load_config(write_job_config(tmp_path, srv.base_url, max_tokens=500, concurrency=4,
                                              progress_interval_s=0.2))
        monkeypatch.chdir(tmp_path)
        s = InferenceSettings.from_config(config, "d")
        monkeypatch.setattr(os, "fsync", failing_fsync)
        with pytest.raises(UserError, match="cannot sync journal"):
            inference.run(s)
    # failed at the first tick after the quick responses, not when the long streams ended (20 s)
    assert time.monotonic() - t0 < 10 and not (tmp_path / "results" / "d" / "inference.done").exists()
