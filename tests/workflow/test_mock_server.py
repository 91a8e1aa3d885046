"""budgetgen_testkit.mock_server, run as a real subprocess and driven with httpx."""

import asyncio
import json
import os
import signal
import subprocess
import sys
import time

import httpx
import pytest

from budgetgen_testkit import mock_server
from budgetgen_testkit.mock_server import VOCAB, spawn, stop

MSGS = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Say something nice please"}]
PROMPT_TOKENS = 3 + 4 + 4 + 4  # words + 4 per message


@pytest.fixture
def server(tmp_path):
    """Factory: server(*args, env=None) -> base_url; every server is stopped at teardown."""
    procs = []

    def start(*args, env=None):
        proc, base = spawn(list(args), tmp_path, env=env)
        procs.append(proc)
        return base

    yield start
    for proc in procs:
        stop(proc)


@pytest.fixture(scope="module")
def default_server(tmp_path_factory):
    proc, base = spawn([], tmp_path_factory.mktemp("mock"))
    yield base
    stop(proc)


def chat(base, messages=MSGS, timeout=60, headers=None, **kw):
    return httpx.post(f"{base}/chat/completions", json={"model": "mock-model", "messages": messages, **kw},
                      timeout=timeout, headers=headers)


def stream_chat(base, messages=MSGS, **kw):
    """Return (content, reasoning by field, finish_reason, usage, chunks, saw_done)."""
    body = {"model": "mock-model", "messages": messages, "stream": True, **kw}
    content, reasoning, finish, usage, chunks, done = "", {}, None, None, [], False
    with httpx.stream("POST", f"{base}/chat/completions", json=body, timeout=60) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        for line in r.iter_lines():
            if not line:
                continue
            assert line.startswith("data: ")
            assert not done, "nothing may follow [DONE]"
            if line == "data: [DONE]":
                done = True
                continue
            ch = json.loads(line[6:])
            chunks.append(ch)
            for choice in ch["choices"]:
                delta = choice["delta"]
                content += delta.get("content") or ""
                for field in ("reasoning_content", "reasoning"):
                    if field in delta:
                        reasoning[field] = reasoning.get(field, "") + delta[field]
                finish = choice["finish_reason"] or finish
            usage = ch.get("usage") or usage
    return content, reasoning, finish, usage, chunks, done


def stats(base):
    return httpx.get(base.removesuffix("/v1") + "/stats", timeout=5).json()


def wait_for(pred, timeout=3.0):
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def test_vocabulary_and_help():
    assert len(VOCAB) == len(set(VOCAB)) == 200 and all(w.isalpha() for w in VOCAB)
    r = subprocess.run([sys.executable, str(mock_server.ENTRY), "--help"], capture_output=True, text=True,
                       timeout=10)
    assert r.returncode == 0 and "--tokens-per-s" in r.stdout and "--outage-at" in r.stdout


def test_health_models_and_start_line(tmp_path):
    proc, base = spawn(["--model", "a", "--model", "b"], tmp_path)
    try:
        assert base.startswith("http://127.0.0.1:") and base.endswith("/v1")
        assert httpx.get(base.removesuffix("/v1") + "/health").json() == {"status": "ok"}
        models = httpx.get(f"{base}/models").json()
        assert models["object"] == "list"
        assert [(m["id"], m["object"], m["owned_by"]) for m in models["data"]] == [
            ("a", "model", "mock"), ("b", "model", "mock")]
        assert chat(base, model="b").status_code == 200
    finally:
        assert stop(proc) == 0
    assert f"mock_server listening on {base} model=a,b" in proc.log_path.read_text()


def test_non_stream_content_and_usage(default_server):
    r = chat(default_server)
    assert r.status_code == 200
    data = r.json()
    assert data["object"] == "chat.completion" and data["model"] == "mock-model"
    choice = data["choices"][0]
    assert choice["finish_reason"] == "stop"
    msg = choice["message"]
    assert msg["role"] == "assistant" and "reasoning_content" not in msg
    words = msg["content"].split(" ")
    assert len(words) == 64 and all(w in VOCAB for w in words)
    assert data["usage"] == {"prompt_tokens": PROMPT_TOKENS, "completion_tokens": 64,
                             "total_tokens": PROMPT_TOKENS + 64}
    assert chat(default_server).json()["choices"][0]["message"]["content"] == msg["content"]  # deterministic
    other = chat(default_server, messages=[{"role": "user", "content": "something else"}]).json()
    assert other["choices"][0]["message"]["content"] != msg["content"]


def test_stream_matches_non_stream(default_server):
    expected = chat(default_server).json()
    content, reasoning, finish, usage, chunks, done = stream_chat(
        default_server, stream_options={"include_usage": True})
    assert done and not reasoning and finish == "stop"
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert all(ch["object"] == "chat.completion.chunk" for ch in chunks)
    assert len({ch["id"] for ch in chunks}) == 1
    assert len(chunks) == 1 + 64 + 1 + 1  # role, one per token, finish, usage
    assert chunks[-2]["choices"][0]["delta"] == {} and chunks[-2]["choices"][0]["finish_reason"] == "stop"
    assert chunks[-1]["choices"] == [] and usage == expected["usage"]
    assert content == expected["choices"][0]["message"]["content"]
    # without include_usage: no usage chunk
    _, _, _, usage, chunks, done = stream_chat(default_server)
    assert done and usage is None and chunks[-1]["choices"][0]["finish_reason"] == "stop"


def test_max_tokens_clipping(default_server):
    full = chat(default_server).json()["choices"][0]["message"]["content"]
    for key in ("max_tokens", "max_completion_tokens"):
        data = chat(default_server, **{key: 5}).json()
        assert data["choices"][0]["finish_reason"] == "length"
        assert data["usage"]["completion_tokens"] == 5
        assert data["choices"][0]["message"]["content"] == " ".join(full.split()[:5])
    content, _, finish, usage, _, _ = stream_chat(default_server, max_tokens=5,
                                                  stream_options={"include_usage": True})
    assert finish == "length" and usage["completion_tokens"] == 5 and len(content.split()) == 5
    data = chat(default_server, max_tokens=64).json()  # exactly the natural length: not clipped
    assert data["choices"][0]["finish_reason"] == "stop"
    assert chat(default_server, max_tokens=0).status_code == 400


@pytest.mark.parametrize("field", ["reasoning_content", "reasoning"])
def test_reasoning_share(server, field):
    base = server("--mean-tokens", 20, "--reasoning-share", 0.25, "--reasoning-field", field)
    data = chat(base).json()
    msg = data["choices"][0]["message"]
    assert len(msg[field].split()) == 5 and len(msg["content"].split()) == 15
    assert data["usage"]["completion_tokens"] == 20
    assert data["usage"]["completion_tokens_details"] == {"reasoning_tokens": 5}
    content, reasoning, finish, usage, _, _ = stream_chat(base, stream_options={"include_usage": True})
    assert reasoning == {field: msg[field]} and content == msg["content"] and usage == data["usage"]
    clipped = chat(base, max_tokens=3).json()  # clipped inside the reasoning: no content yet
    assert clipped["choices"][0]["message"]["content"] == ""
    assert clipped["usage"]["completion_tokens_details"] == {"reasoning_tokens": 3}


def test_lognormal_mean(server):
    base = server("--length-dist", "lognormal", "--mean-tokens", 64, "--sigma", 0.8, "--seed", 3)

    async def run():  # httpx's CPU per request grows with the pool size; 10 connections keep this fast
        limits = httpx.Limits(max_connections=10, max_keepalive_connections=10)
        async with httpx.AsyncClient(base_url=base, timeout=30, limits=limits) as client:
            async def one(i):
                body = {"model": "mock-model", "messages": [{"role": "user", "content": f"prompt {i}"}]}
                if i % 2:
                    body.update(stream=True, stream_options={"include_usage": True})
                    usage = None
                    async with client.stream("POST", "/chat/completions", json=body) as r:
                        async for line in r.aiter_lines():
                            if line.startswith("data: {"):
                                usage = json.loads(line[6:]).get("usage") or usage
                    return usage["completion_tokens"]
                r = await client.post("/chat/completions", json=body)
                return r.json()["usage"]["completion_tokens"]

            return await asyncio.gather(*(one(i) for i in range(400)))

    lengths = asyncio.run(run())
    mean = sum(lengths) / len(lengths)
    assert abs(mean - 64) < 0.15 * 64, mean
    assert min(lengths) >= 1 and len(set(lengths)) > 50
    st = stats(base)
    assert st["requests"] == st["completed"] == 400 and st["by_status"] == {"200": 400}
    assert st["tokens_delivered"] == st["tokens_generated"] == sum(lengths) and st["tokens_abandoned"] == 0


def test_150_concurrent_streams(server):
    # streams last ~2.7 s after a 3 s wait for the first token: all 150 are open at once even when a loaded
    # machine takes seconds to open them
    base = server("--mean-tokens", 20, "--tokens-per-s", 7, "--ttft-s", 3, "--sample-interval", 0.1)

    async def run():
        limits = httpx.Limits(max_connections=150, max_keepalive_connections=150)
        async with httpx.AsyncClient(base_url=base, timeout=30, limits=limits) as client:
            async def one(i):
                n = 0
                body = {"model": "mock-model", "messages": [{"role": "user", "content": f"p{i}"}], "stream": True}
                async with client.stream("POST", "/chat/completions", json=body) as r:
                    async for line in r.aiter_lines():
                        n += line.startswith('data: {') and '"content":"' in line and '"role"' not in line
                return n

            results = await asyncio.gather(*(one(i) for i in range(150)))
            st = (await client.get(base.removesuffix("/v1") + "/stats")).json()  # on a kept-alive connection
            return results, st["connections"]

    results, connections = asyncio.run(run())
    assert results == [20] * 150 and connections == 150
    st = stats(base)
    assert st["completed"] == 150 and st["tokens_delivered"] == 3000
    assert st["max_active"] == 150, st["timeline"]


def test_unknown_model_and_bad_requests(default_server):
    r = chat(default_server, model="nope")
    assert r.status_code == 404
    assert r.json() == {"error": {"message": "The model 'nope' does not exist", "type": "NotFoundError",
                                  "code": 404}}
    r = httpx.post(f"{default_server}/chat/completions", content=b"{not json",
                   headers={"content-type": "application/json"})
    assert r.status_code == 400 and r.json()["error"]["code"] == 400
    assert chat(default_server, messages=[]).status_code == 400
    assert httpx.get(default_server.removesuffix("/v1") + "/nowhere").status_code == 404
    assert httpx.get(f"{default_server}/chat/completions").status_code == 405


def test_context_limit(server):
    base = server("--context-limit", 100)
    r = chat(base, max_tokens=100 - PROMPT_TOKENS + 1)
    assert r.status_code == 400
    err = r.json()["error"]
    assert err["type"] == "BadRequestError" and err["code"] == 400
    assert err["message"].startswith("This model's maximum context length is 100 tokens")
    assert chat(base, max_tokens=100 - PROMPT_TOKENS).status_code == 200
    # without max_tokens the completion is clipped to what fits
    data = chat(base, messages=[{"role": "user", "content": "word " * 50}]).json()
    assert data["usage"]["completion_tokens"] == 100 - 54 and data["choices"][0]["finish_reason"] == "length"


def test_fail_429_and_500(server):
    base = server("--fail-429", 1, "--retry-after", 3)
    r = chat(base)
    assert r.status_code == 429 and r.headers["retry-after"] == "3"
    assert r.json()["error"]["type"] == "RateLimitError"
    base = server("--fail-500", 1)
    r = chat(base)
    assert r.status_code == 500 and r.json()["error"]["code"] == 500
    assert httpx.get(base.removesuffix("/v1") + "/health").status_code == 200  # faults: chat only
    st = stats(base)
    assert st["faults"]["500"] == 1 and st["by_status"] == {"500": 1}


def test_fault_mix_is_reproducible(server):
    args = ("--fail-500", 0.3, "--fail-429", 0.3, "--fault-seed", 11)
    runs = []
    for _ in range(2):
        base = server(*args)
        with httpx.Client(timeout=5) as c:
            runs.append([c.post(f"{base}/chat/completions",
                                json={"model": "mock-model", "messages": MSGS}).status_code for _ in range(30)])
    assert runs[0] == runs[1] and {200, 429, 500} <= set(runs[0])
    st = stats(base)
    assert st["faults"]["500"] == runs[0].count(500) and st["faults"]["429"] == runs[0].count(429)


def test_fail_400_is_per_prompt_reproducible_and_carries_a_large_message(server):
    """--fail-400 P: a share P of prompts answered 400 on every attempt (decided by the messages and
    --fault-seed, not by arrival order), with an error message of --error-bytes bytes."""
    prompts = [[{"role": "user", "content": f"prompt number {i}"}] for i in range(200)]
    args = ("--fail-400", 0.25, "--error-bytes", 200_000, "--fault-seed", 5)
    base = server(*args)
    with httpx.Client(timeout=10) as c:
        def statuses(base, order):
            return {i: c.post(f"{base}/chat/completions", json={"model": "mock-model", "messages": prompts[i]})
                    for i in order}

        first = statuses(base, range(200))
        again = statuses(base, reversed(range(200)))  # other arrival order: the same prompts fail
        refused = sorted(i for i, r in first.items() if r.status_code == 400)
        assert sorted(i for i, r in again.items() if r.status_code == 400) == refused
        assert {r.status_code for r in first.values()} == {200, 400}
        assert 30 <= len(refused) <= 70  # about 25 % of 200
        err = first[refused[0]].json()["error"]
        assert err["type"] == "BadRequestError" and err["code"] == 400
        assert len(err["message"].encode()) == 200_000 and "--fail-400" in err["message"]
        st = stats(base)
        assert st["faults"]["400"] == 2 * len(refused) and st["by_status"]["400"] == 2 * len(refused)
        other = statuses(server(*args[:-1], 6), range(200))  # another --fault-seed: another set
        assert sorted(i for i, r in other.items() if r.status_code == 400) != refused
        plain = server("--fail-400", 1)
        assert len(chat(plain).json()["error"]["message"]) < 200  # no --error-bytes: a short message
    assert subprocess.run([sys.executable, str(mock_server.ENTRY), "--error-bytes", "-1"],
                          capture_output=True).returncode == 2


def test_drop_aborts_the_response(server):
    base = server("--drop", 1, "--mean-tokens", 50)
    with pytest.raises((httpx.RemoteProtocolError, httpx.ReadError)):
        stream_chat(base)
    with pytest.raises((httpx.RemoteProtocolError, httpx.ReadError)):
        chat(base)
    st = stats(base)
    assert st["faults"]["drop"] == 2 and st["completed"] == 0 and st["tokens_delivered"] == 0
    assert st["tokens_abandoned"] == st["tokens_generated"] < 100


def test_hang_until_client_gives_up(server):
    base = server("--hang", 1)
    t = time.monotonic()
    with pytest.raises(httpx.ReadTimeout):
        chat(base, timeout=0.3)
    assert time.monotonic() - t < 10  # ended by the client's timeout, not by the server
    st = stats(base)
    assert st["faults"]["hang"] == 1 and st["requests"] == 1 and st["by_status"] == {}
    assert wait_for(lambda: stats(base)["connections"] == 1)  # only the /stats connection is left


def test_stats_delivered_and_abandoned(server):
    # 100 tokens at 20/s: a whole stream takes 5 s, so one closed after 5 lines is cut well before its end
    # even when the server notices the close late on a loaded machine
    base = server("--mean-tokens", 100, "--tokens-per-s", 20, "--sample-interval", 0.05)
    stream_chat(base, max_tokens=10)
    st = stats(base)
    assert st["tokens_delivered"] == st["tokens_generated"] == 10 and st["completed"] == 1
    # close a stream early
    with httpx.Client(timeout=10) as client:
        body = {"model": "mock-model", "messages": MSGS, "stream": True}
        with client.stream("POST", f"{base}/chat/completions", json=body) as r:
            lines = r.iter_lines()
            for _ in range(5):
                next(lines)
    assert wait_for(lambda: stats(base)["active"] == 0, timeout=30)
    st = stats(base)
    assert st["completed"] == 1 and st["tokens_delivered"] == 10
    assert 10 < st["tokens_generated"] < 10 + 100
    assert st["tokens_abandoned"] == st["tokens_generated"] - 10
    assert st["max_active"] == 1 and 0.05 < st["busy_slot_seconds"] < 0.5 + 5.0
    assert st["timeline"] and all(len(s) == 2 for s in st["timeline"])
    assert max(a for _, a in st["timeline"]) <= 1 and st["elapsed_s"] > 0
    assert httpx.post(base.removesuffix("/v1") + "/stats/reset").status_code == 200
    st = stats(base)
    assert st["requests"] == st["tokens_generated"] == st["completed"] == 0
    assert all(t < 10 for t, _ in st["timeline"])  # samples since the reset only


def test_outage_window(tmp_path):
    """SIGUSR1 starts an outage at a moment the test chose (a stream in flight): the stream is cut, the
    listener refuses, and it listens again no earlier than --outage-for later."""
    import threading

    proc, base = spawn(["--outage-for", 3.0, "--mean-tokens", 1000, "--tokens-per-s", 50], tmp_path)
    try:
        health = base.removesuffix("/v1") + "/health"
        assert httpx.get(health, timeout=5).status_code == 200
        cut = []

        def streaming():
            try:
                stream_chat(base)  # 20 s long; cut off by the outage
            except (httpx.RemoteProtocolError, httpx.ReadError) as exc:
                cut.append(exc)

        t = threading.Thread(target=streaming)
        t.start()
        assert wait_for(lambda: stats(base)["tokens_generated"] > 0, timeout=30)
        started = time.monotonic()
        mock_server.outage(proc)  # returns once the listener is closed
        t.join(timeout=30)
        assert cut and not t.is_alive()
        with pytest.raises(httpx.ConnectError):
            httpx.get(health, timeout=2)

        def up():
            try:
                return httpx.get(health, timeout=1).status_code == 200
            except httpx.TransportError:
                return False

        assert wait_for(up, timeout=30)
        assert time.monotonic() - started >= 3.0
        assert chat(base, max_tokens=3).status_code == 200
    finally:
        stop(proc)


def test_slots_limit_concurrency(server):
    base = server("--slots", 3, "--mean-tokens", 10, "--tokens-per-s", 100, "--sample-interval", 0.02)

    async def run():
        async with httpx.AsyncClient(base_url=base, timeout=30) as client:
            async def one(i):
                body = {"model": "mock-model", "messages": [{"role": "user", "content": f"p{i}"}]}
                return (await client.post("/chat/completions", json=body)).status_code

            return await asyncio.gather(*(one(i) for i in range(12)))

    t = time.monotonic()
    assert asyncio.run(run()) == [200] * 12
    assert time.monotonic() - t > 3 * 0.09  # 4 waves of ~0.09 s
    st = stats(base)
    assert st["max_active"] == 3 and st["completed"] == 12 and st["slots"] == 3
    assert max(a for _, a in st["timeline"]) <= 3
    assert st["busy_slot_seconds"] >= 0.5 * 12 * 0.09  # a starved server is late, never early


def test_api_key(server):
    base = server("--api-key-env", "MOCK_TEST_KEY", env={"MOCK_TEST_KEY": "s3cret"})
    assert chat(base).status_code == 401
    assert chat(base, headers={"Authorization": "Bearer wrong"}).status_code == 401
    assert chat(base, headers={"Authorization": "Bearer s3cret"}).status_code == 200
    assert httpx.get(f"{base}/models").status_code == 401
    assert httpx.get(base.removesuffix("/v1") + "/health").status_code == 200
    r = subprocess.run([sys.executable, str(mock_server.ENTRY), "--api-key-env", "MOCK_UNSET_KEY_XYZ"],
                       capture_output=True, text=True, timeout=10,
                       env={k: v for k, v in os.environ.items() if k != "MOCK_UNSET_KEY_XYZ"})
    assert r.returncode == 2 and "MOCK_UNSET_KEY_XYZ" in r.stderr


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signal_writes_stats_file(tmp_path, sig):
    stats_file = tmp_path / "stats.json"
    proc, base = spawn(["--stats-file", stats_file, "--mean-tokens", 7], tmp_path)
    try:
        assert chat(base).status_code == 200
        assert chat(base, model="x").status_code == 404
    finally:
        proc.send_signal(sig)
        assert proc.wait(10) == 0
    st = json.loads(stats_file.read_text())
    assert st["requests"] == 2 and st["by_status"] == {"200": 1, "404": 1}
    assert st["tokens_delivered"] == 7 and st["completed"] == 1 and st["active"] == 0


def test_ttft_and_token_rate(server):
    base = server("--ttft-s", 0.3, "--tokens-per-s", 100, "--mean-tokens", 31)
    t = time.monotonic()
    first = None
    with httpx.stream("POST", f"{base}/chat/completions", timeout=10,
                      json={"model": "mock-model", "messages": MSGS, "stream": True}) as r:
        for line in r.iter_lines():
            if first is None and '"content":"' in line and '"role"' not in line:
                first = time.monotonic() - t
    total = time.monotonic() - t
    assert 0.3 <= first < 5  # lower bounds: a server on a loaded machine can be late, never early
    assert 0.3 + 0.3 <= total < 10  # 30 more tokens at 100/s
    data = chat(base, max_tokens=11).json()  # non-streaming waits for the whole generation too
    assert data["usage"]["completion_tokens"] == 11


def test_mock_mean_tokens_per_request(server):
    base = server("--length-dist", "lognormal", "--mean-tokens", 10, "--sigma", 0.5, "--seed", 1)

    def mean_length(**kw):
        lengths = [chat(base, messages=[{"role": "user", "content": f"p {i}"}], **kw).json()["usage"]
                   ["completion_tokens"] for i in range(60)]
        return sum(lengths) / len(lengths)

    assert mean_length() < 15
    assert 150 < mean_length(mock_mean_tokens=200) < 250
    assert 150 < mean_length(mock_mean_tokens=200.0, stream=False) < 250
    fixed = server("--mean-tokens", 10)
    assert chat(fixed, mock_mean_tokens=33).json()["usage"]["completion_tokens"] == 33
    for bad in (0, -1, "5", True, None):
        r = chat(fixed, mock_mean_tokens=bad)
        assert r.status_code == (200 if bad is None else 400), bad


def test_chunk_interval_batches_tokens(server):
    def reads(base):
        t, pieces = time.monotonic(), 0
        with httpx.stream("POST", f"{base}/chat/completions", timeout=10,
                          json={"model": "mock-model", "messages": MSGS, "stream": True}) as r:
            for _ in r.iter_raw():
                pieces += 1
        return pieces, time.monotonic() - t

    fine, fine_s = reads(server("--tokens-per-s", 100, "--mean-tokens", 40))
    coarse, coarse_s = reads(server("--tokens-per-s", 100, "--mean-tokens", 40, "--chunk-interval-s", 0.15))
    # ~40 writes 10 ms apart against ~4 writes 150 ms apart (a starved client may merge a few reads)
    assert fine >= 15 and coarse <= 10, (fine, coarse)
    assert 0.35 <= fine_s < 10 and 0.35 <= coarse_s < 10  # the same rate: 39 tokens after the first at 100/s


def _words(delta):
    return [len((delta.get(f) or "").split()) for f in ("reasoning", "content")]  # vLLM's reasoning field


def test_tokens_per_event_puts_several_tokens_in_one_sse_event(server):
    # --chunk-interval-s packs several one-token events into one write; --tokens-per-event puts
    # several tokens into one event (a stream interval, speculative decoding), the last one fewer.
    base = server("--mean-tokens", 10, "--tokens-per-event", 4, "--reasoning-share", 0.3)
    expected = chat(base).json()
    content, reasoning, finish, usage, chunks, done = stream_chat(base, stream_options={"include_usage": True})
    assert done and finish == "stop" and usage == expected["usage"]
    msg = expected["choices"][0]["message"]
    assert content == msg["content"] and reasoning == {"reasoning": msg["reasoning"]}  # --engine vllm's field
    events = [ch["choices"][0]["delta"] for ch in chunks[1:-2]]  # between the role chunk and finish, usage
    # 3 reasoning + 7 content tokens in events of 4, 4, 2: the first carries both fields
    assert [_words(d) for d in events] == [[3, 1], [0, 4], [0, 2]]
    assert all("usage" not in ch for ch in chunks[:-1])  # include_usage alone: only the last chunk
    # clipped by max_tokens: 5 = 4 + 1
    _, _, finish, usage, chunks, _ = stream_chat(base, max_tokens=5, stream_options={"include_usage": True})
    assert finish == "length" and usage["completion_tokens"] == 5
    assert [sum(_words(ch["choices"][0]["delta"])) for ch in chunks[1:-2]] == [4, 1]
    with pytest.raises(SystemExit):
        mock_server.parse_args(["--tokens-per-event", "0"])


def test_tokens_per_event_with_a_token_rate_sends_an_event_when_its_last_token_is_due(server):
    base = server("--mean-tokens", 40, "--tokens-per-event", 16, "--tokens-per-s", 100)
    t, arrivals = time.monotonic(), []
    with httpx.stream("POST", f"{base}/chat/completions", timeout=10,
                      json={"model": "mock-model", "messages": MSGS, "stream": True}) as r:
        for line in r.iter_lines():
            if line.startswith("data: {"):
                delta = json.loads(line[6:])["choices"][0]["delta"]
                if delta.get("content"):
                    arrivals.append((len(delta["content"].split()), time.monotonic() - t))
    assert [n for n, _ in arrivals] == [16, 16, 8]
    # token k is due at k / 100 s: the events at 0.15, 0.31 and 0.39 s
    assert 0.13 <= arrivals[0][1] and 0.29 <= arrivals[1][1] and 0.37 <= arrivals[2][1] < 10  # never early
    assert arrivals[0][1] < arrivals[1][1] < arrivals[2][1]


def test_hidden_tokens_are_counted_by_usage_but_never_streamed(server):
    """--hidden-tokens 7: usage counts 7 tokens more than the stream shows (a reasoning parser's consumed tags,
    the stop token, as vLLM and SGLang count them); per-chunk usage has 6 of them from the first chunk on,
    the last with the last words."""
    base = server("--mean-tokens", 10, "--hidden-tokens", 7)
    content, _, _, usage, _, _ = stream_chat(base, stream_options={"include_usage": True})
    assert len(content.split()) == 10 and usage["completion_tokens"] == 17
    assert chat(base).json()["usage"]["completion_tokens"] == 17
    _, _, _, _, chunks, _ = stream_chat(base, stream_options={"include_usage": True, "continuous_usage_stats": True})
    counts = [ch["usage"]["completion_tokens"] for ch in chunks]
    assert counts[0] == 0 and counts[1] == 1 + 6 and counts[-3] == 10 + 7 and counts[-1] == 17, counts


@pytest.mark.parametrize("per_event", [1, 3])
def test_continuous_usage_stats_put_the_usage_so_far_on_every_chunk(server, per_event):
    base = server("--mean-tokens", 10, "--tokens-per-event", per_event)
    opts = {"include_usage": True, "continuous_usage_stats": True}
    content, _, finish, usage, chunks, done = stream_chat(base, stream_options=opts)
    assert done and finish == "stop" and usage["completion_tokens"] == 10
    assert all(set(ch["usage"]) >= {"prompt_tokens", "completion_tokens", "total_tokens"} for ch in chunks)
    assert all(ch["usage"]["prompt_tokens"] == PROMPT_TOKENS for ch in chunks)
    assert all(ch["usage"]["total_tokens"] == PROMPT_TOKENS + ch["usage"]["completion_tokens"] for ch in chunks)
    counts = [ch["usage"]["completion_tokens"] for ch in chunks]
    # role chunk 0, then the tokens so far after each event, the finish chunk and the usage chunk
    steps = list(range(per_event, 10, per_event)) + [10]
    assert counts == [0] + steps + [10, 10]
    # the count after each event is the words streamed so far
    seen = 0
    for ch in chunks[1:-2]:
        seen += len(ch["choices"][0]["delta"]["content"].split())
        assert ch["usage"]["completion_tokens"] == seen
    assert content == chat(base).json()["choices"][0]["message"]["content"]
    # as vLLM: continuous_usage_stats without include_usage sends no usage at all
    _, _, _, usage, chunks, _ = stream_chat(base, stream_options={"continuous_usage_stats": True})
    assert usage is None and all("usage" not in ch for ch in chunks)


# -- engine wire formats (--engine vllm: vLLM 0.33.0, --engine sglang: SGLang 0.5.23) ------------------
def stream_events(base, headers=None, **kw):
    """(status, the stream's JSON events in order, or the error body) of one streamed request."""
    body = {"model": "mock-model", "messages": MSGS, "stream": True, "stream_options": {"include_usage": True}, **kw}
    r = httpx.post(f"{base}/chat/completions", json=body, headers=headers, timeout=120)  # the first loads a tokenizer
    if r.status_code != 200:
        return r.status_code, r.json()
    return 200, [json.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: {")]


def sglext_events(events):
    return [e for e in events if "sglext" in e]


@pytest.mark.parametrize("how", ["fields", "headers", "launch-flags"])
def test_sglang_mode_sends_the_ids_in_one_sglext_chunk_before_the_usage_chunk(server, tiny_tokenizer, how):
    """SGLang 0.5.23 (serving_chat.py): return_input_ids_in_sglext / return_output_ids_in_sglext, the
    x-sglext-return-*-ids headers or the launch flags give one `choices: []` chunk with sglext
    {input_ids, output_ids: [[...]]} right before the usage chunk; output ids number completion_tokens."""
    args = ["--engine", "sglang", "--mean-tokens", 12, "--reasoning-share", 0.25,
            "--token-ids-tokenizer", tiny_tokenizer]
    kw, headers = {}, None
    if how == "fields":
        kw = {"return_input_ids_in_sglext": True, "return_output_ids_in_sglext": True}
    elif how == "headers":
        headers = {"x-sglext-return-input-ids": "1", "x-sglext-return-output-ids": "1"}
    else:
        args.append("--sglang-return-ids")
    status, events = stream_events(server(*args), headers=headers, **kw)
    assert status == 200
    (ext,) = sglext_events(events)
    assert events[-1].get("usage") and events[-2] is ext and ext["choices"] == []
    assert ext["sglext"]["input_ids"] and len(ext["sglext"]["output_ids"]) == 1
    assert len(ext["sglext"]["output_ids"][0]) == events[-1]["usage"]["completion_tokens"]
    assert any("reasoning_content" in c["delta"] for e in events for c in e["choices"])  # SGLang's field
    assert not any("token_ids" in c for e in events for c in e["choices"])  # no vLLM-style ids


def test_sglang_mode_drops_unknown_fields_and_refuses_return_token_ids_while_streaming(server, tiny_tokenizer):
    base = server("--engine", "sglang", "--mean-tokens", 8, "--token-ids-tokenizer", tiny_tokenizer)
    # the names of the unreleased PR are not SGLang's: dropped silently, no ids, HTTP 200
    status, events = stream_events(base, return_input_ids=True, return_output_ids=True)
    assert status == 200 and sglext_events(events) == []
    # usage counts the tokenizer's tokens of the 8 words (a server of that tokenizer's model), ids asked or not
    _, asked = stream_events(base, return_output_ids_in_sglext=True)
    output_ids = sglext_events(asked)[0]["sglext"]["output_ids"][0]
    assert events[-1]["usage"]["completion_tokens"] == len(output_ids) > 8
    status, body = stream_events(base, return_token_ids=True)
    assert status == 400 and body["object"] == "error" and body["code"] == 400
    assert body["message"].startswith("return_token_ids is not supported with streaming")


def test_vllm_mode_ids_per_chunk_and_include_reasoning_false_strips_them(server, tiny_tokenizer):
    """vLLM 0.33.0: return_token_ids puts prompt_token_ids on the first chunk and token_ids on each choice
    chunk (as many as completion_tokens); include_reasoning: false strips them; reasoning is `reasoning`."""
    base = server("--mean-tokens", 10, "--reasoning-share", 0.3, "--token-ids-tokenizer", tiny_tokenizer)
    status, events = stream_events(base, return_token_ids=True)
    assert status == 200 and events[0]["prompt_token_ids"] and sglext_events(events) == []
    ids = [t for e in events for c in e["choices"] for t in c.get("token_ids", [])]
    assert ids and len(ids) == events[-1]["usage"]["completion_tokens"]
    assert any("reasoning" in c["delta"] for e in events for c in e["choices"])
    status, events = stream_events(base, return_token_ids=True, include_reasoning=False)
    assert status == 200 and "prompt_token_ids" not in events[0]
    assert not any("token_ids" in c for e in events for c in e["choices"])
    status, events = stream_events(base, return_input_ids_in_sglext=True, return_output_ids_in_sglext=True)
    assert status == 200 and sglext_events(events) == []  # SGLang's fields mean nothing to vLLM
