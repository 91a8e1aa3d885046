"""The streaming client against a real mock server on loopback: content, reasoning and usage, the retry
class of each failure, the server check."""

import asyncio

import pytest

from budgetgen.client import ChatClient
from budgetgen.errors import UserError
from budgetgen.streams import PermanentError, TransientError


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
