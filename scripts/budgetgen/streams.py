"""One chat completion streamed over HTTP: the POST, its lines, its chunks (StreamedResponse), the result
(ChatResult) or the error class it ends in, for ChatClient in the job's process and for the stream
workers (budgetgen.stream_workers) in theirs.

Wire tolerance, observed on real engines: SGLang/vLLM send `data: [DONE]` and a `choices: []`
usage chunk; `transformers serve` sends neither (usage rides on the finish chunk). What differs by
engine (the reasoning field, the token ids, per-chunk usage, error objects) the client asks its
dialect (budgetgen.engines). Reasoning is journaled as streamed, whitespace included (an empty think
block's "\n\n" is part of what the model generated;
tokenize decides what it means under the template, budgetgen.turn_format.TurnFormat).

Tokens in flight: servers send several tokens per SSE event (stream intervals, speculative decoding),
so `on_token(n)` gets tokens, not events: a chunk's `usage.completion_tokens` when the server sends
usage on every chunk (`stream_options.continuous_usage_stats`, vLLM and SGLang), else the length of the
chunk's `token_ids` when returned, else an estimate from the text at the characters-per-token ratio
of the responses finished so far (TokenRate).

Errors: an error object inside a stream is classified like an HTTP status (its `code`), so a 400-class
error delivered mid-stream is permanent, not retried. A server-wide failure is a ServerRefused (one
line, the job fails): the key refused on chat (401/403), or responses without usage. A finish_reason
other than stop/length/tool_calls (e.g. `abort`: the engine dropped the request) is retried: the
response is not what the model would have generated.
"""

from __future__ import annotations

import json
import random
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import httpx

from .errors import UserError

if TYPE_CHECKING:
    from collections.abc import Callable
    from types import ModuleType
    from typing import Any

    from .engines import Dialect


# 408 Request Timeout, 409 Conflict, 425 Too Early, 429 Too Many Requests, and any 5xx.
TRANSIENT_STATUS = frozenset({408, 409, 425, 429})


class TransientError(Exception):
    """A failure worth retrying: connection trouble, timeouts, 408/409/425/429, 5xx."""

    def __init__(self, message, retry_after=None, connection=False):
        super().__init__(message)
        self.retry_after = retry_after
        self.connection = connection  # the server was not reached or went away


class ServerRefused(UserError):
    """The server fails every request the same way (a refused key, no usage): the job fails in one line."""


# A response ended for one of these reasons is complete; anything else (`abort`, `error`, ...) is retried.
COMPLETE_FINISH_REASONS = frozenset({"stop", "length", "tool_calls", "function_call", "content_filter"})


class PermanentError(Exception):
    """A non-transient 4xx (e.g. context too long): recorded once in errors.jsonl, not retried."""

    def __init__(self, status, message):
        super().__init__(f"HTTP {status}: {message}")
        self.status = status
        self.message = message


def is_transient_status(status: int) -> bool:
    return status in TRANSIENT_STATUS or 500 <= status <= 599


def parse_retry_after(value: str | None) -> float | None:
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        return None  # HTTP-date form: fall back to our own backoff


def backoff_delay(attempt: int, base: float = 0.5, cap: float = 30.0, retry_after: float | None = None,
                  rng: random.Random | ModuleType = random) -> float:
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
    prompt_token_ids: list | None = None  # the prompt's ids as the server fed them to the model
    endpoint: str = ""  # the base URL of the endpoint that answered (ChatClient.chat)


class StreamedResponse:
    """One streamed chat completion as its chunks arrive: text, reasoning, ids, usage, finish reason,
    and the tokens reported to on_token (see the module docstring); result() checks it is whole."""

    def __init__(self, url, engine: Dialect, want_ids, token_rate, on_token):
        self.url, self.engine, self.want_ids = url, engine, want_ids
        self.token_rate, self.on_token = token_rate, on_token
        self.content, self.reasoning, self.token_ids = [], [], []
        self.prompt_ids = self.whole_ids = None
        self.finish, self.usage, self.model = None, None, ""
        self.events = self.counted = self.chars = 0

    def feed(self, chunk: dict[str, Any], data: str) -> None:
        engine = self.engine
        if engine.is_error_chunk(chunk):
            self._error(chunk, data)
        self.model = chunk.get("model") or self.model
        if self.want_ids:
            prompt_ids, whole = engine.chunk_ids(chunk)
            self.prompt_ids = prompt_ids or self.prompt_ids
            self.whole_ids = whole or self.whole_ids
        chunk_usage = chunk.get("usage")
        if chunk_usage:
            self.usage = chunk_usage
        n_ids = n_chars = 0
        choice_ids = engine.ids_in_choices
        for choice in chunk.get("choices") or ():
            delta = choice.get("delta") or {}
            piece = delta.get("content")
            think = engine.reasoning(delta)
            if piece:
                self.content.append(piece)
                n_chars += len(piece)
            if think:
                self.reasoning.append(think)
                n_chars += len(think)
            if choice_ids:
                prompt_ids, ids = engine.choice_ids(choice)
                if self.want_ids and prompt_ids:
                    self.prompt_ids = prompt_ids
                if ids:
                    self.token_ids.extend(ids)
                    n_ids += len(ids)
            if choice.get("finish_reason"):
                self.finish = choice["finish_reason"]
        if n_chars or n_ids:
            self.events += 1
            self.chars += n_chars
        if self.on_token is not None:
            # tokens so far: the server's own count, else the ids, else the text's estimate
            if chunk_usage and chunk_usage.get("completion_tokens") is not None:
                n = int(chunk_usage["completion_tokens"]) - self.counted
            elif n_ids:
                n = n_ids
            else:
                n = self.token_rate.tokens_in(n_chars) if n_chars else 0
            if n > 0:
                self.counted += n
                self.on_token(n)

    def _error(self, chunk, data):
        """An error object inside the stream, classified by its code like an HTTP status."""
        status, msg = self.engine.error_status(chunk), self.engine.error_message(data)
        if status in (401, 403):
            raise ServerRefused(f"server at {self.url} refused the API key (HTTP {status}: {msg})")
        if status is not None and not is_transient_status(status) and 400 <= status < 500:
            raise PermanentError(status, msg)
        raise TransientError(f"server error mid-stream: {msg}")

    def result(self) -> ChatResult:
        if self.finish is None:
            raise TransientError("stream ended without finish_reason")
        if self.finish not in COMPLETE_FINISH_REASONS:
            raise TransientError(f"finish_reason {self.finish}: the server ended the response early")
        if not self.usage or "completion_tokens" not in self.usage:
            # A server that omits usage would make the budget a guess: every request would fail the same way.
            raise ServerRefused(f"server at {self.url} sent no usage.completion_tokens in its stream (budgetgen "
                                "needs stream_options.include_usage, as SGLang and vLLM send it)")
        completion_tokens = int(self.usage.get("completion_tokens") or 0)
        self.token_rate.observe(self.chars, completion_tokens)
        token_ids = prompt_ids = None
        if self.want_ids:
            token_ids, prompt_ids = self.whole_ids or self.token_ids or None, self.prompt_ids
            self._check_ids(token_ids, prompt_ids, completion_tokens)
        return ChatResult(content="".join(self.content), reasoning="".join(self.reasoning),
                          finish_reason=self.finish, usage=self.usage, streamed_tokens=self.events, model=self.model,
                          token_ids=token_ids, prompt_token_ids=prompt_ids)

    def _check_ids(self, token_ids, prompt_ids, completion_tokens):
        """Ids were asked for: a response with completion tokens must bring the prompt's and the
        generated ids, as many generated ids as usage.completion_tokens; else the server (or a setting)
        withholds them from every response, and rows would silently be re-tokenized text."""
        setting = f"server.return_token_ids: {self.engine.name}"
        if completion_tokens and (not token_ids or not prompt_ids):
            missing = " and ".join(n for n, v in (("prompt", prompt_ids), ("generated", token_ids)) if not v)
            raise ServerRefused(f"server at {self.url} sent no {missing} token ids for a response of "
                                f"{completion_tokens} tokens, though {setting} asked for them; "
                                + self.engine.ids_hint)
        if token_ids and len(token_ids) != completion_tokens:
            raise ServerRefused(f"server at {self.url} sent {len(token_ids)} generated token ids for a response "
                                f"of usage.completion_tokens {completion_tokens} ({setting}): the ids are not "
                                "the response's; rows cannot be exact")


class TokenRate:
    """Characters per token of the responses finished so far, to count tokens from text when a
    server sends neither per-chunk usage nor token ids. Until enough is seen, a low prior (more
    tokens per character: the in-flight estimate errs high, so dispatch errs early, never late)."""

    PRIOR_CHARS_PER_TOKEN = 2.0
    MIN_TOKENS = 2000

    def __init__(self):
        self.chars = 0
        self.tokens = 0

    def observe(self, chars: int, tokens: int) -> None:
        if tokens > 0:
            self.chars += chars
            self.tokens += tokens

    def tokens_in(self, chars: int) -> int:
        if self.tokens < self.MIN_TOKENS:
            return max(1, round(chars / self.PRIOR_CHARS_PER_TOKEN))
        return max(1, round(chars * self.tokens / max(1, self.chars)))


CONNECT_TIMEOUT_S = 10.0  # a chat request's TCP connect (the job's and its stream workers')


def chat_http(api_key: str | None, concurrency: int, connect_timeout_s: float = CONNECT_TIMEOUT_S) -> httpx.AsyncClient:
    """The HTTP client chat streams go through: a pool sized to the concurrency; no read timeout in httpx
    (the watchdog times out silence after the first byte, and waits for the first byte as long as the
    server is alive: see the module docstring)."""
    headers = {"Accept": "text/event-stream, application/json"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    return httpx.AsyncClient(headers=headers, limits=limits, timeout=httpx.Timeout(None, connect=connect_timeout_s,
                                                                                   pool=None))


async def stream_chat(http: httpx.AsyncClient, engine: Dialect, token_rate: TokenRate, url: str, body: dict, ep: Any,
                      st: Any, on_token: Callable[[int], object] | None = None, want_ids: bool = False) -> ChatResult:
    """POST `body` to `url` on `http` and stream it; call on_token(n) with the tokens of each chunk as
    it arrives (see the module docstring); note each line's time in st.last and ep.last_byte (the
    watchdog's); return ChatResult.

    want_ids asks the server for the prompt's and the generated token ids in the fields of the
    dialect `engine` (budgetgen.engines); they come back in ChatResult.prompt_token_ids and .token_ids.
    A response without them, or with another number of generated ids than usage.completion_tokens,
    or a 4xx naming the field, is a ServerRefused: rows are never silently re-tokenized text.

    Raises TransientError, PermanentError or ServerRefused; anything else is a bug.
    """
    out = StreamedResponse(url, engine, want_ids, token_rate, on_token)
    try:
        async with http.stream("POST", url, json=body) as resp:
            if resp.status_code != 200:
                _refusal(engine, url, resp.status_code, await resp.aread(), resp.headers, want_ids)
            await _read(resp, ep, st, out, url)
    except (httpx.TimeoutException, httpx.TransportError) as exc:
        connection = isinstance(exc, (httpx.ConnectError, httpx.ConnectTimeout))
        raise TransientError(f"{type(exc).__name__}: {exc or 'connection lost'}", connection=connection) from None
    return out.result()


def _refusal(engine, url, status, raw, headers, want_ids):
    """Raise what a non-200 answer is: a refused key, a transient status, a refused ids field, else the
    prompt's permanent error."""
    msg = engine.error_message(raw)
    if status in (401, 403):
        raise ServerRefused(f"server at {url} refused the API key (HTTP {status}: {msg})")
    if is_transient_status(status):
        raise TransientError(f"HTTP {status}: {msg}", retry_after=parse_retry_after(headers.get("retry-after")))
    refused_field = engine.refused_field(msg) if want_ids else None
    if refused_field:  # e.g. SGLang: "return_token_ids is not supported with streaming"
        raise ServerRefused(f"server at {url} refused {refused_field} (server.return_token_ids: "
                            f"{engine.name}) with HTTP {status}: {msg}; {engine.ids_hint}")
    raise PermanentError(status, msg)


async def _read(resp, ep, st, out, url):
    """Feed every `data:` line of the stream to `out` until `[DONE]` or its end."""
    monotonic, loads = time.monotonic, json.loads
    async for line in resp.aiter_lines():
        st.last = ep.last_byte = monotonic()
        st.got_first = True
        if not line.startswith("data:"):
            continue
        data = line[5:].strip()
        if data == "[DONE]":
            break
        if not data:
            continue
        try:
            chunk = loads(data)
            if not isinstance(chunk, dict):
                raise TypeError("not a JSON object")
            out.feed(chunk, data)
        except (ValueError, TypeError, AttributeError, IndexError, KeyError) as exc:
            # a line that is not JSON, or JSON of another shape (`data: []`, `data: null`,
            # choices that are not objects): the stream is broken, the request retried
            raise TransientError(f"malformed stream chunk from {url} ({type(exc).__name__}: "
                                 f"{exc}): {data[:200]}") from None
