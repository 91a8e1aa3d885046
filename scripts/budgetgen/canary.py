"""The canary: a few questions with known answers, asked before the bulk run (server.canary, issue 42).

A server can pass its health check and its model check and still answer garbage (a wrong chat template,
a quantization gone wrong, a driver fault above some concurrency). Before any dataset dispatches, each
line of `server.canary.prompts` is asked once at temperature 0 of every endpoint:

    {"messages": [{"role": "user", "content": "What is 12 * 7? Answer with the number only."}],
     "expect": "\\b84\\b"}

(`prompt` instead of `messages` for one user turn). A line passes where its answer (the content, else the
reasoning) matches `expect` (re.search) and is none of the server faults the quality gate sees
(budgetgen.quality.SERVER_FAULTS: empty, a loop, U+FFFD, leaked template tokens). An endpoint whose share
of passed lines is below `min_pass` refuses the run before any request of a dataset, naming the lines that
failed and what came back.

Where it runs: the Snakefile's onstart (once per run, before any job, only when a dataset has work left;
never in a dry run), or, with server.launch (no server exists before the job starts one), the inference
job itself once its server is ready.
"""

from __future__ import annotations

import asyncio
import json
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from . import engines
from .errors import UserError
from .quality import SERVER_FAULTS, observe
from .turn_format import special_tokens

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence
    from typing import Any

SHOWN_CHARS = 60


@dataclass(frozen=True)
class Line:
    where: str  # FILE:LINE
    messages: list
    expect: re.Pattern


def load(path: str) -> list[Line]:
    """The canary file's lines; a bad one is `FILE:LINE: reason`."""
    lines = []
    try:
        f = open(path, encoding="utf-8")
    except OSError as exc:
        raise UserError(f"server.canary.prompts: {path}: {exc.strerror}") from None
    with f:
        for n, raw in enumerate(f, 1):
            if not raw.strip():
                continue
            where = f"{path}:{n}"
            try:
                rec = json.loads(raw)
            except ValueError as exc:
                raise UserError(f"{where}: malformed JSON ({exc})") from None
            if not isinstance(rec, dict) or not isinstance(rec.get("expect"), str):
                raise UserError(f"{where}: a canary line is an object with `expect` (a regular expression)")
            messages = rec.get("messages")
            if messages is None and isinstance(rec.get("prompt"), str):
                messages = [{"role": "user", "content": rec["prompt"]}]
            if not isinstance(messages, list) or not messages:
                raise UserError(f"{where}: a canary line needs `messages` (a list) or `prompt` (a string)")
            try:
                expect = re.compile(rec["expect"])
            except re.error as exc:
                raise UserError(f"{where}: expect is not a regular expression ({exc})") from None
            lines.append(Line(where, messages, expect))
    if not lines:
        raise UserError(f"server.canary.prompts: {path} holds no line")
    return lines


def verdict(line: Line, content: str, reasoning: str, finish_reason: str | None,
            specials: Sequence[str] = ()) -> str | None:
    """Why an answer fails its line, or None where it passes."""
    faults = [f for f in observe(content, reasoning, finish_reason, specials=tuple(specials)) if f in SERVER_FAULTS]
    answer = content if content.strip() else reasoning
    shown = json.dumps(answer[:SHOWN_CHARS] + ("…" if len(answer) > SHOWN_CHARS else ""), ensure_ascii=False)
    if faults:
        return f"{line.where}: {', '.join(faults)}: {shown}"
    if not line.expect.search(answer):
        return f"{line.where}: expected /{line.expect.pattern}/, got {shown}"
    return None


@dataclass(frozen=True)
class Canary:
    """server.canary of a validated config, with what its requests need."""

    prompts: str
    min_pass: float
    model: str
    engine: str
    timeout_s: float
    startup_wait_s: float
    params: dict  # max_tokens, temperature 0, generation.extra_body

    @classmethod
    def of(cls, config: Mapping[str, Any]) -> Canary | None:
        server, canary = config["server"], config["server"].get("canary")
        if not canary:
            return None
        params = {"max_tokens": int(canary.get("max_tokens") or config["generation"]["max_tokens"]),
                  "temperature": 0, "extra_body": dict(config["generation"].get("extra_body") or {})}
        return cls(canary["prompts"], float(canary["min_pass"]), server["model"], engines.resolve(server)[0],
                   float(server["request_timeout_s"]), float(server["startup_wait_s"]), params)

    async def failures(self, url: str, lines: Sequence[Line], api_key: str | None,
                       specials: Sequence[str]) -> list[str]:
        """Every line asked of one endpoint (at once): the failures."""
        from .client import ChatClient  # here: building the settings (Canary.of) loads no HTTP client
        from .streams import PermanentError, TransientError

        client = ChatClient([url], self.model, api_key=api_key, timeout_s=self.timeout_s,
                            concurrency=max(1, len(lines)), engine=self.engine, continuous_usage_stats=False)

        async def one(line):
            try:
                res = await client.chat(line.messages, self.params)
            except (UserError, TransientError, PermanentError) as exc:  # a failed line, said with the rest
                return f"{line.where}: {exc}"
            return verdict(line, res.content, res.reasoning, res.finish_reason, specials)

        try:
            await client.check_server(wait_s=self.startup_wait_s)  # up and serving the model, as a job waits
            return [f for f in await asyncio.gather(*(one(line) for line in lines)) if f]
        finally:
            await client.aclose()

    async def check(self, urls: Sequence[str], api_key: str | None = None, specials: Sequence[str] = ()) -> str:
        """Ask every line of every endpoint: the line saying it passed, or UserError naming each endpoint
        below min_pass and its failed lines."""
        lines = load(self.prompts)
        failed = {url: await self.failures(url, lines, api_key, specials) for url in urls}
        n, need = len(lines), self.min_pass
        bad = {u: f for u, f in failed.items() if (n - len(f)) / n < need}
        if bad:
            raise UserError("server.canary: nothing was dispatched: " + " | ".join(
                f"{u}: {n - len(f)} of {n} passed (min_pass {need:g}); failed: " + "; ".join(f)
                for u, f in bad.items()))
        return "server.canary: " + ", ".join(f"{u} {n - len(f)} of {n}" for u, f in failed.items()) + \
            f" passed (min_pass {need:g})"


def check_before_jobs(config: Mapping[str, Any], environ: Mapping[str, str]) -> str | None:
    """The Snakefile's onstart: the canary of every server.base_url (None without server.canary or with
    server.launch, whose job asks it of the server it starts)."""
    canary = Canary.of(config)
    server = config["server"]
    if canary is None or server.get("launch"):
        return None
    urls = server["base_url"] if isinstance(server["base_url"], list) else [server["base_url"]]
    api_key = environ.get(server["api_key_env"]) if server.get("api_key_env") else None
    return asyncio.run(canary.check([u.rstrip("/") for u in urls], api_key,
                                    special_tokens(config["tokenizer"]["path"])))
