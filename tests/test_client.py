"""Retry classes and the streaming client against a real loopback server."""

import asyncio
import random

import pytest

from budgetgen.client import (ChatClient, PermanentError, TransientError, backoff_delay, is_transient_status,
                              parse_retry_after)
from budgetgen.errors import UserError


@pytest.mark.parametrize("status", [408, 409, 425, 429, 500, 502, 503, 504])
def test_transient_statuses(status):
    assert is_transient_status(status)


@pytest.mark.parametrize("status", [400, 401, 403, 404, 413, 422])
def test_permanent_statuses(status):
    assert not is_transient_status(status)


def test_backoff_is_jittered_exponential_and_honours_retry_after():
    rng = random.Random(1)
    delays = [backoff_delay(a, base=1.0, cap=8.0, rng=rng) for a in range(6) for _ in range(50)]
    assert all(0 <= d <= 8.0 for d in delays)
    assert max(backoff_delay(0, base=1.0, rng=rng) for _ in range(50)) <= 1.0
    assert backoff_delay(0, base=0.01, retry_after=3.0, rng=rng) == 3.0
    assert parse_retry_after("2.5") == 2.5 and parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT") is None


def chat(base_url, messages, **params):
    async def go():
        c = ChatClient(base_url, "mock-model", timeout_s=5, concurrency=2)
        try:
            return await c.chat(messages, params)
        finally:
            await c.aclose()

    return asyncio.run(go())


def test_stream_collects_content_reasoning_and_usage(server):
    srv = server("--mean-tokens", "20", "--reasoning-share", "0.5", "--reasoning-field", "reasoning")
    r = chat(srv.base_url, [{"role": "user", "content": "hello"}], max_tokens=100)
    assert r.usage["completion_tokens"] == 20 == r.streamed_tokens
    assert r.reasoning and r.content and r.finish_reason == "stop"  # vLLM's `reasoning` field is read


def test_status_classes_from_a_real_server(server):
    srv = server("--context-limit", "10")
    with pytest.raises(PermanentError) as e:
        chat(srv.base_url, [{"role": "user", "content": "a b c d e f g h"}], max_tokens=50)
    assert e.value.status == 400 and "maximum context length" in e.value.message
    srv = server("--fail-429", "1", "--retry-after", "7")
    with pytest.raises(TransientError) as e:
        chat(srv.base_url, [{"role": "user", "content": "x"}], max_tokens=5)
    assert e.value.retry_after == 7.0 and "HTTP 429" in str(e.value)
    srv = server("--drop", "1", "--mean-tokens", "50")
    with pytest.raises(TransientError):
        chat(srv.base_url, [{"role": "user", "content": "x"}], max_tokens=100)


def test_check_server_names_url_and_models(server):
    srv = server()

    async def check(model):
        c = ChatClient(srv.base_url, model)
        try:
            return await c.check_server()
        finally:
            await c.aclose()

    assert asyncio.run(check("mock-model")) == ["mock-model"]
    with pytest.raises(UserError, match=r"model 'nope' is not served at http://127\.0\.0\.1:\d+/v1/models"):
        asyncio.run(check("nope"))
