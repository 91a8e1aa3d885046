"""Async OpenAI chat-completions client: streaming, retry classes, server check.

Wire tolerance, observed on real engines: SGLang/vLLM send `data: [DONE]` and a `choices: []`
usage chunk; `transformers serve` sends neither (usage rides on the finish chunk). Reasoning is
`reasoning_content` (SGLang, transformers) or `reasoning` (vLLM); both are read. With thinking
switched off, transformers serve streams the template's "\n\n" separator as reasoning; reasoning that
is only whitespace is treated as none, so no empty think block is rendered at tokenize time.
"""

import asyncio
import json
import random
import time
from dataclasses import dataclass, field

import httpx

from .errors import UserError

# 408 Request Timeout, 409 Conflict, 425 Too Early, 429 Too Many Requests, and any 5xx.
TRANSIENT_STATUS = frozenset({408, 409, 425, 429})


class TransientError(Exception):
    """A failure worth retrying: connection trouble, timeouts, 408/409/425/429, 5xx."""

    def __init__(self, message, retry_after=None, connection=False):
        super().__init__(message)
        self.retry_after = retry_after
        self.connection = connection  # the server was not reached or went away


class PermanentError(Exception):
    """A non-transient 4xx (e.g. context too long): recorded once in errors.jsonl, not retried."""

    def __init__(self, status, message):
        super().__init__(f"HTTP {status}: {message}")
        self.status = status
        self.message = message


def is_transient_status(status):
    return status in TRANSIENT_STATUS or 500 <= status <= 599


def parse_retry_after(value):
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        return None  # HTTP-date form: fall back to our own backoff


def backoff_delay(attempt, base=0.5, cap=30.0, retry_after=None, rng=random):
    """Exponential backoff with full jitter; a server's Retry-After is honoured as a floor."""
    delay = rng.uniform(0, min(cap, base * (2 ** attempt)))
    if retry_after is not None:
        delay = max(delay, min(retry_after, 300.0))
    return delay


@dataclass
class ChatResult:
    content: str
    reasoning: str
    finish_reason: str
    usage: dict
    streamed_tokens: int
    model: str = ""
    extra: dict = field(default_factory=dict)
    token_ids: list | None = None  # the generated ids, when asked for and the server sent them


def _error_message(body):
    try:
        obj = json.loads(body)
        err = obj.get("error", obj)
        if isinstance(err, dict):
            return str(err.get("message") or err.get("detail") or obj)[:300]
        return str(err)[:300]
    except (ValueError, AttributeError):
        return body[:300].decode(errors="replace") if isinstance(body, bytes) else str(body)[:300]


class ServerUnreachable(UserError):
    """No answer from a server (as opposed to an answer that is wrong: bad key, unknown model)."""


class Endpoint:
    """One server of the pool: its URL, this job's requests in flight there, and its health."""

    def __init__(self, base_url, max_inflight=0):
        self.base_url = base_url.rstrip("/")
        self.max_inflight = max_inflight  # 0 = no cap of its own
        self.inflight = 0
        self.healthy = True
        self.requests = 0

    def has_room(self):
        return not self.max_inflight or self.inflight < self.max_inflight


class EndpointPool:
    """Several servers behind one job: each request goes to the least-loaded healthy endpoint with room.

    An endpoint whose connection fails is taken out and probed (GET /models) every `recheck_s` until
    it answers again. When every endpoint is out, requests still go to them (least loaded first), so
    the job's own unreachable deadline decides when to give up, exactly as with one server.
    """

    def __init__(self, urls, per_endpoint=0, recheck_s=10.0, log=None):
        self.endpoints = [Endpoint(u, per_endpoint) for u in urls]
        self.recheck_s = recheck_s
        self.log = log or (lambda msg: None)
        self.room = asyncio.Condition()
        self.probes = {}  # endpoint -> probe task

    def pick(self):
        """The endpoint the next request goes to, or None if every one is at its cap."""
        ready = [e for e in self.endpoints if e.has_room()]
        healthy = [e for e in ready if e.healthy]
        pool = healthy or ready
        return min(pool, key=lambda e: e.inflight) if pool else None  # min() keeps config order on ties

    async def acquire(self):
        async with self.room:
            while (ep := self.pick()) is None:
                await self.room.wait()
            ep.inflight += 1
            ep.requests += 1
            return ep

    async def release(self, ep):
        async with self.room:
            ep.inflight -= 1
            self.room.notify()

    def take_out(self, ep, reason, probe):
        """Mark ep unhealthy and start probing it with `probe(ep)` (an async check) until it answers."""
        if not ep.healthy or len(self.endpoints) == 1:
            return  # one server: nothing to fail over to; the retry loop handles it
        ep.healthy = False
        self.log(f"endpoint {ep.base_url} taken out ({reason}); probing it every {self.recheck_s:g} s")
        self.probes[ep] = asyncio.create_task(self._probe_until_back(ep, probe))

    async def _probe_until_back(self, ep, probe):
        while True:
            await asyncio.sleep(self.recheck_s)
            try:
                await probe(ep)
            except UserError:
                continue
            ep.healthy = True
            self.probes.pop(ep, None)
            self.log(f"endpoint {ep.base_url} back in service")
            async with self.room:
                self.room.notify_all()
            return

    def close(self):
        for task in self.probes.values():
            task.cancel()
        self.probes.clear()


class ChatClient:
    """One httpx.AsyncClient per job over one or more endpoints; connection pool sized to the concurrency."""

    def __init__(self, base_url, model, api_key=None, timeout_s=600.0, concurrency=64, connect_timeout_s=10.0,
                 endpoint_concurrency=0, recheck_s=10.0, log=None):
        urls = [base_url] if isinstance(base_url, str) else list(base_url)
        self.pool = EndpointPool(urls, per_endpoint=endpoint_concurrency, recheck_s=recheck_s, log=log)
        self.base_url = self.pool.endpoints[0].base_url
        self.model = model
        self.log = log or (lambda msg: None)
        headers = {"Accept": "text/event-stream, application/json"}
        if api_key:
            headers["Authorization"] = f"Bearer {api_key}"
        limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
        # read timeout = longest silence tolerated between two chunks of one response
        timeout = httpx.Timeout(timeout_s, connect=connect_timeout_s, pool=None)
        self.http = httpx.AsyncClient(headers=headers, limits=limits, timeout=timeout)

    async def aclose(self):
        self.pool.close()
        await self.http.aclose()

    @property
    def urls(self):
        return [e.base_url for e in self.pool.endpoints]

    async def check_server(self, wait_s=0.0):
        """Check every endpoint: each must serve the model. Unreachable ones are taken out (probed later)
        as long as one answers; if none does within wait_s, one line naming the URL(s)."""
        deadline = time.monotonic() + wait_s
        while True:
            served, unreachable = None, []
            for ep in self.pool.endpoints:
                try:
                    served = await self.check_endpoint(ep)
                except ServerUnreachable as exc:
                    unreachable.append((ep, exc))
            if len(unreachable) < len(self.pool.endpoints):
                break
            if time.monotonic() >= deadline:
                if len(unreachable) == 1:
                    raise unreachable[0][1]
                raise ServerUnreachable("no server reachable: " + "; ".join(
                    f"{ep.base_url}/models ({str(exc).split(' (', 1)[-1].rstrip(')')})" for ep, exc in unreachable))
            await asyncio.sleep(1.0)
        for ep, exc in unreachable:
            self.pool.take_out(ep, str(exc), self.check_endpoint)
        return served

    async def check_endpoint(self, ep):
        """GET /models of one endpoint: the served model list, or None for a server without that route."""
        url = f"{ep.base_url}/models"
        try:
            resp = await self.http.get(url, timeout=10.0)
        except httpx.HTTPError as exc:
            raise ServerUnreachable(
                f"server unreachable at {url} ({type(exc).__name__}: {exc or 'no answer'})"
            ) from None
        if resp.status_code in (401, 403):
            raise UserError(f"server at {url} refused the API key (HTTP {resp.status_code})")
        if resp.status_code == 404:
            return None  # no /models route; /health-only servers are fine
        if resp.status_code in (502, 503, 504):  # a proxy before a server that is not up (yet)
            raise ServerUnreachable(f"server unreachable at {url} (HTTP {resp.status_code})")
        if resp.status_code != 200:
            raise UserError(f"server at {url} answered HTTP {resp.status_code}: {_error_message(resp.content)}")
        try:
            served = [m.get("id") for m in resp.json().get("data", [])]
        except (ValueError, AttributeError):
            raise UserError(f"server at {url} did not return a model list") from None
        if self.model not in served:
            raise UserError(
                f"model {self.model!r} is not served at {url} (served: {', '.join(map(str, served)) or 'none'})"
            )
        return served

    async def chat(self, messages, params, on_token=None, return_token_ids=False):
        """Stream one chat completion on the least-loaded endpoint; see _chat."""
        ep = await self.pool.acquire()
        try:
            return await self._chat(ep, messages, params, on_token, return_token_ids)
        except TransientError as exc:
            if exc.connection:
                self.pool.take_out(ep, str(exc), self.check_endpoint)
            raise
        finally:
            await self.pool.release(ep)

    async def _chat(self, ep, messages, params, on_token=None, return_token_ids=False):
        """Stream one chat completion from ep; call on_token(n) as tokens arrive; return ChatResult.

        return_token_ids asks the server for the generated token ids (vLLM's `return_token_ids`:
        `token_ids` on each choice chunk); they come back in ChatResult.token_ids, else None.

        Raises TransientError or PermanentError; anything else is a bug.
        """
        body = {"model": self.model, "messages": messages, "stream": True,
                "stream_options": {"include_usage": True}}
        for k in ("max_tokens", "temperature", "top_p", "seed"):
            if params.get(k) is not None:
                body[k] = params[k]
        body.update(params.get("extra_body") or {})
        if return_token_ids:
            body["return_token_ids"] = True
        url = f"{ep.base_url}/chat/completions"
        content, reasoning, token_ids = [], [], []
        finish, usage, streamed, model = None, None, 0, ""
        try:
            async with self.http.stream("POST", url, json=body) as resp:
                if resp.status_code != 200:
                    raw = await resp.aread()
                    msg = _error_message(raw)
                    if is_transient_status(resp.status_code):
                        raise TransientError(f"HTTP {resp.status_code}: {msg}",
                                             retry_after=parse_retry_after(resp.headers.get("retry-after")))
                    raise PermanentError(resp.status_code, msg)
                async for line in resp.aiter_lines():
                    if not line.startswith("data:"):
                        continue
                    data = line[5:].strip()
                    if data == "[DONE]":
                        break
                    if not data:
                        continue
                    try:
                        chunk = json.loads(data)
                    except ValueError:
                        raise TransientError(f"malformed stream chunk from {url}") from None
                    if "error" in chunk and not chunk.get("choices"):
                        raise TransientError(f"server error mid-stream: {_error_message(data)}")
                    model = chunk.get("model") or model
                    if chunk.get("usage"):
                        usage = chunk["usage"]
                    for choice in chunk.get("choices") or ():
                        delta = choice.get("delta") or {}
                        piece = delta.get("content")
                        think = delta.get("reasoning_content") or delta.get("reasoning")
                        n = 0
                        if piece:
                            content.append(piece)
                            n = 1
                        if think:
                            reasoning.append(think)
                            n = 1
                        if n:
                            streamed += 1
                            if on_token is not None:
                                on_token(1)
                        if choice.get("token_ids"):
                            token_ids.extend(choice["token_ids"])
                        if choice.get("finish_reason"):
                            finish = choice["finish_reason"]
        except (httpx.TimeoutException, httpx.TransportError) as exc:
            connection = isinstance(exc, (httpx.ConnectError, httpx.ConnectTimeout))
            raise TransientError(f"{type(exc).__name__}: {exc or 'connection lost'}", connection=connection) from None
        if finish is None:
            raise TransientError("stream ended without finish_reason")
        if not usage or "completion_tokens" not in usage:
            # A server that omits usage would make the budget a guess; refuse rather than miscount.
            raise PermanentError(0, f"server at {url} sent no usage.completion_tokens (needs stream_options.include_usage)")
        reasoning_text = "".join(reasoning)
        return ChatResult(content="".join(content), reasoning=reasoning_text if reasoning_text.strip() else "",
                          finish_reason=finish, usage=usage, streamed_tokens=streamed, model=model,
                          token_ids=token_ids if return_token_ids and token_ids else None)
