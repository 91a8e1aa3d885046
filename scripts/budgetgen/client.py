"""Async OpenAI chat-completions client: streaming, retry classes, server check.

Timeouts: a request is timed out on *silence after its first byte* (request_timeout_s between two
lines of one stream). Before its first byte a request may be queued inside the server (oversubscribed
slots), so it waits as long as the server is alive: some stream of this client received a byte within
request_timeout_s, or the endpoint answers GET /models. A watchdog task checks every stream about once
a second; per line the client only notes the time.

The stream itself (its chunks, tokens in flight, error classes): budgetgen.streams.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

import httpx

from .endpoints import EndpointPool, ServerCheck, StreamWatchdog
from .engines import dialect
from .streams import CONNECT_TIMEOUT_S, TokenRate, TransientError, chat_http, stream_chat

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping
    from typing import Any

    from .streams import ChatResult


class ChatClient:
    """One httpx.AsyncClient per job over one or more endpoints; connection pool sized to the concurrency."""

    def __init__(self, base_url, model, api_key=None, timeout_s=600.0, concurrency=64,
                 connect_timeout_s=CONNECT_TIMEOUT_S, endpoint_concurrency=0, recheck_s=10.0,
                 continuous_usage_stats=True, engine="openai", thinking_processor=None, workers=None):
        """workers: a budgetgen.stream_workers.StreamWorkers that streams the chats in its processes."""
        urls = [base_url] if isinstance(base_url, str) else list(base_url)
        self.pool = EndpointPool(urls, per_endpoint=endpoint_concurrency, recheck_s=recheck_s)
        self.base_url = self.pool.endpoints[0].base_url
        self.model = model
        self.timeout_s = float(timeout_s)
        self.http = chat_http(api_key, concurrency, connect_timeout_s)
        self.workers = workers
        # GET /models (server check, liveness and failover probes) on a pool of its own: with every request
        # connection held by a stream waiting for its first byte, a probe on the shared pool would wait for
        # a connection, time out, and have the waiting streams cancelled as if the server were down
        self.probe_http = httpx.AsyncClient(headers=self.http.headers, timeout=httpx.Timeout(10.0),
                                            limits=httpx.Limits(max_connections=2 * len(urls)))
        self.continuous_usage_stats = continuous_usage_stats
        self.engine = dialect(engine)  # the server's wire format (budgetgen.engines)
        self.thinking_processor = thinking_processor  # server.thinking_processor (SGLang's thinking budget)
        self.token_rate = TokenRate()
        self.checker = ServerCheck(self.probe_http, model, self.engine)
        self.watchdog = StreamWatchdog(self.timeout_s, self.checker.endpoint)

    @property
    def last_byte(self) -> float:
        """When any stream of this client last received a line (monotonic seconds)."""
        return max(e.last_byte for e in self.pool.endpoints)

    async def aclose(self) -> None:
        self.watchdog.close()
        self.pool.close()
        if self.workers is not None:
            await self.workers.close()
        await self.http.aclose()
        await self.probe_http.aclose()

    @property
    def urls(self) -> list[str]:
        return [e.base_url for e in self.pool.endpoints]

    async def check_server(self, wait_s: float = 0.0) -> list[str] | None:
        """Every endpoint serves the model (ServerCheck.all): the served model list."""
        return await self.checker.all(self.pool, wait_s)

    async def chat(self, messages: list[dict[str, Any]], params: Mapping[str, Any],
                   on_token: Callable[..., object] | None = None, want_ids: bool = False,
                   affinity: str | None = None) -> ChatResult:
        """Stream one chat completion on the least-loaded endpoint (or the one of its `affinity` key:
        EndpointPool.acquire); see _chat. on_token(n) gets the tokens of each chunk as it is read here;
        from stream workers on_token(n, chunks, now): n tokens in that many chunks, the last read at `now`."""
        ep = await self.pool.acquire(affinity)
        st = self.watchdog.watch(ep)
        try:
            res = await self._chat(ep, st, messages, params, on_token, want_ids)
            res.endpoint = ep.base_url
            return res
        except asyncio.CancelledError:
            # The watchdog's cancel becomes a retry; any other cancel (a signal, the end of the run) is
            # honoured, also when it lands in the same loop turn as the watchdog's (two cancels, one
            # CancelledError: uncancel() leaves the outside one counted).
            if st.timed_out is None or asyncio.current_task().uncancel() > 0:
                raise
            raise TransientError(f"ReadTimeout: {st.timed_out}") from None
        except TransientError as exc:
            if exc.connection:
                self.pool.take_out(ep, str(exc), self.checker.endpoint)
            raise
        finally:
            self.watchdog.forget(st)
            await self.pool.release(ep)

    def request_body(self, messages: list[dict[str, Any]], params: Mapping[str, Any],
                     want_ids: bool = False) -> dict[str, Any]:
        """The chat request: the model, the messages, streaming with usage (the dialect's stream options),
        the sampling parameters, the dialect's fixed fields, extra_body, and the dialect's ids fields when
        ids are wanted."""
        body = {"model": self.model, "messages": messages, "stream": True,
                "stream_options": self.engine.stream_options(self.continuous_usage_stats)}
        for k in ("max_tokens", "temperature", "top_p", "seed"):
            if params.get(k) is not None:
                body[k] = params[k]
        body.update(self.engine.fixed_fields)
        body.update(params.get("extra_body") or {})
        body.update(self.engine.request_fields(want_ids))
        if params.get("thinking_budget") is not None:
            body.update(self.engine.thinking_fields(params["thinking_budget"], self.thinking_processor))
        return body

    async def _chat(self, ep, st, messages, params, on_token=None, want_ids=False):
        """Stream one chat completion from ep (stream_chat), in this process or in a stream worker's
        (budgetgen.stream_workers, server.client_processes)."""
        url, body = f"{ep.base_url}/chat/completions", self.request_body(messages, params, want_ids)
        if self.workers is not None:
            return await self.workers.chat(url, body, want_ids, ep, st, on_token)
        return await stream_chat(self.http, self.engine, self.token_rate, url, body, ep, st, on_token, want_ids)
