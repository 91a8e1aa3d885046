"""The endpoints behind one client: the pool (least-loaded healthy endpoint, failover, conversation
affinity), the watchdog that times out silent streams, and the check that each serves the model.

Timeouts (budgetgen.client's docstring): silence after a stream's first byte for timeout_s cancels it;
before its first byte a stream waits while its endpoint is alive (a byte on any of its streams within
timeout_s, else GET /models answers).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING

import httpx

from .errors import UserError

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

log = logging.getLogger(__name__)


class ServerUnreachable(UserError):
    """No answer from a server (as opposed to an answer that is wrong: bad key, unknown model)."""


class _Stream:
    """One request in flight, for the watchdog: its task, endpoint, and when it last received a line."""

    __slots__ = ("task", "ep", "last", "got_first", "timed_out")

    def __init__(self, task, ep, now):
        self.task, self.ep, self.last = task, ep, now
        self.got_first = False
        self.timed_out = None  # the reason, once the watchdog cancelled it


class StreamWatchdog:
    """Times out streams (see the module docstring): silence after the first byte for timeout_s
    cancels a stream; before its first byte a stream waits while its endpoint is alive (a byte on any
    of its streams within timeout_s, else GET /models answers: `probe(ep)`). One task per client,
    about a tick a second; per line a stream only notes the time (_Stream.last)."""

    def __init__(self, timeout_s, probe):
        self.timeout_s = timeout_s
        self.probe = probe
        self.streams = set()
        self.task = None

    def watch(self, ep: Endpoint) -> _Stream:
        """Register the current task's stream on ep; starts the watchdog on first use."""
        if self.task is None:
            self.task = asyncio.create_task(self._run())
        st = _Stream(asyncio.current_task(), ep, time.monotonic())
        self.streams.add(st)
        return st

    def forget(self, st: _Stream) -> None:
        self.streams.discard(st)

    def close(self) -> None:
        if self.task:
            self.task.cancel()

    async def _run(self):
        tick = max(0.05, min(1.0, self.timeout_s / 4))
        while True:
            await asyncio.sleep(tick)
            now = time.monotonic()
            for st in list(self.streams):
                if st.timed_out or now - st.last <= self.timeout_s:
                    continue
                if st.got_first:
                    self._time_out(st, f"no data for {self.timeout_s:g} s")
                    continue
                ep = st.ep
                if now - ep.last_byte <= self.timeout_s:
                    continue  # queued in a server that is streaming to others: keep waiting
                if ep.probing is None:
                    ep.probing = asyncio.create_task(self._probe_alive(ep))

    async def _probe_alive(self, ep):
        try:
            await self.probe(ep)
            ep.last_byte = time.monotonic()  # it answers: alive, its queued requests keep waiting
        except UserError as exc:
            for st in list(self.streams):
                if st.ep is ep and not st.got_first and not st.timed_out:
                    self._time_out(st, f"no first byte in {self.timeout_s:g} s and the server does not answer ({exc})")
        finally:
            ep.probing = None

    @staticmethod
    def _time_out(st, reason):
        st.timed_out = reason
        st.task.cancel()


class Endpoint:
    """One server of the pool: its URL, this job's requests in flight there, and its health."""

    def __init__(self, base_url, max_inflight=0):
        self.base_url = base_url.rstrip("/")
        self.max_inflight = max_inflight  # 0 = no cap of its own
        self.inflight = 0
        self.healthy = True
        self.retired = None  # why the breaker cut it off (budgetgen.breaker): no request goes there again
        self.requests = 0
        self.last_byte = time.monotonic()  # when a stream of this endpoint last received a line
        self.probing = None  # a liveness probe in progress (the watchdog's)

    def has_room(self) -> bool:
        return not self.max_inflight or self.inflight < self.max_inflight


class EndpointPool:
    """Several servers behind one job: each request goes to the least-loaded healthy endpoint with room.

    An endpoint whose connection fails is taken out and probed (GET /models) every `recheck_s` until
    it answers again. When every endpoint is out, requests still go to them (least loaded first), so
    the job's own unreachable deadline decides when to give up, exactly as with one server.
    """

    def __init__(self, urls, per_endpoint=0, recheck_s=10.0):
        self.endpoints = [Endpoint(u, per_endpoint) for u in urls]
        self.recheck_s = recheck_s
        self.room = asyncio.Condition()
        self.probes = {}  # endpoint -> probe task
        self.affinity = {}  # affinity key (a conversation) -> the endpoint its requests went to

    def pick(self, key: str | None = None) -> Endpoint | None:
        """The endpoint the next request goes to, or None if every one is at its cap (or, for an
        affinity key, its own endpoint is: the request waits for room there)."""
        own = self.affinity.get(key) if key is not None else None
        if own is not None and own.healthy and own.retired is None:
            return own if own.has_room() else None
        ready = [e for e in self.endpoints if e.has_room() and e.retired is None]
        healthy = [e for e in ready if e.healthy]
        pool = healthy or ready
        return min(pool, key=lambda e: e.inflight) if pool else None  # min() keeps config order on ties

    async def acquire(self, key: str | None = None) -> Endpoint:
        """An endpoint for one request. Requests with the same affinity `key` (the turns of one
        conversation) go to the endpoint the first one went to, whose prefix cache holds their
        history, while it is healthy; when it is out, to another, which they then stay with."""
        async with self.room:
            while (ep := self.pick(key)) is None:
                if not self.serving:  # every endpoint cut off by the breaker: no room will ever come
                    raise UserError("every endpoint was cut off by the breaker (quality.breaker)")
                await self.room.wait()
            ep.inflight += 1
            ep.requests += 1
            if key is not None and len(self.endpoints) > 1:
                self.affinity[key] = ep
            return ep

    @property
    def serving(self) -> list[Endpoint]:
        """The endpoints not retired."""
        return [e for e in self.endpoints if e.retired is None]

    def retire(self, url: str, why: str) -> None:
        """The breaker cut `url` off: no request goes there again in this job (a request waiting for room
        there goes elsewhere)."""
        for e in self.endpoints:
            if e.base_url == url and e.retired is None:
                e.retired = why
                log.info(f"endpoint {url} cut off: {why}; no more requests go there")
                task = self.probes.pop(e, None)
                if task is not None:
                    task.cancel()

    def forget(self, key: str) -> None:
        """The conversation `key` is finished: no endpoint to keep for it."""
        self.affinity.pop(key, None)

    async def release(self, ep: Endpoint) -> None:
        async with self.room:
            ep.inflight -= 1
            # every waiter: one waiting for its own conversation's endpoint may not be able to use this one
            self.room.notify_all()

    def take_out(self, ep: Endpoint, reason: str, probe: Callable[[Endpoint], Awaitable[object]]) -> None:
        """Mark ep unhealthy and start probing it with `probe(ep)` (an async check) until it answers."""
        if not ep.healthy or len(self.endpoints) == 1:
            return  # one server: nothing to fail over to; the retry loop handles it
        ep.healthy = False
        log.info(f"endpoint {ep.base_url} taken out ({reason}); probing it every {self.recheck_s:g} s")
        self.probes[ep] = asyncio.create_task(self._probe_until_back(ep, probe))

    async def _probe_until_back(self, ep, probe):
        while True:
            await asyncio.sleep(self.recheck_s)
            try:
                await probe(ep)
            except UserError:
                continue
            ep.healthy = ep.retired is None
            self.probes.pop(ep, None)
            log.info(f"endpoint {ep.base_url} back in service")
            async with self.room:
                self.room.notify_all()
            return

    def close(self) -> None:
        for task in self.probes.values():
            task.cancel()
        self.probes.clear()


class ServerCheck:
    """GET /models of the endpoints, on the client's probe pool: each must serve the model."""

    def __init__(self, http, model, engine):
        self.http, self.model, self.engine = http, model, engine

    async def all(self, pool: EndpointPool, wait_s: float = 0.0) -> list[str] | None:
        """Check every endpoint: each must serve the model. Unreachable ones are taken out (probed later)
        as long as one answers; if none does within wait_s, one line naming the URL(s)."""
        deadline = time.monotonic() + wait_s
        while True:
            served, unreachable = None, []
            for ep in pool.endpoints:
                try:
                    served = await self.endpoint(ep)
                except ServerUnreachable as exc:
                    unreachable.append((ep, exc))
            if len(unreachable) < len(pool.endpoints):
                break
            if time.monotonic() >= deadline:
                if len(unreachable) == 1:
                    raise unreachable[0][1]
                raise ServerUnreachable("no server reachable: " + "; ".join(
                    f"{ep.base_url}/models ({str(exc).split(' (', 1)[-1].rstrip(')')})" for ep, exc in unreachable))
            await asyncio.sleep(1.0)
        for ep, exc in unreachable:
            pool.take_out(ep, str(exc), self.endpoint)
        return served

    async def endpoint(self, ep: Endpoint) -> list[str] | None:
        """GET /models of one endpoint: the served model list, or None for a server without that route."""
        url = f"{ep.base_url}/models"
        try:
            resp = await self.http.get(url)
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
            raise UserError(f"server at {url} answered HTTP {resp.status_code}: "
                            f"{self.engine.error_message(resp.content)}")
        try:
            served = [m.get("id") for m in resp.json().get("data", [])]
        except (ValueError, AttributeError):
            raise UserError(f"server at {url} did not return a model list") from None
        if self.model not in served:
            raise UserError(
                f"model {self.model!r} is not served at {url} (served: {', '.join(map(str, served)) or 'none'})"
            )
        return served
