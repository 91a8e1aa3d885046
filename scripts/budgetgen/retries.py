"""Retries and errors of an inference job: one request's attempts (RequestRetries) and the permanent
errors held until a success proves them the prompts' (PermanentErrors); the proof that the server works
when every request of a run failed is budgetgen.outcome's prove_server.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from . import journal
from .errors import UserError
from .streams import PermanentError, TransientError, backoff_delay

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping
    from typing import Any

    from .identity import Identity

log = logging.getLogger(__name__)


class ServerDown(Exception):
    pass


class RequestRetries:
    """One prompt's attempts. Failures of the HTTP class (5xx, 429, a stall, a cut stream) count toward
    max_retries; connection errors (an outage) do not, they retry until the unreachable deadline, which
    runs from the last sign of life of the server (a response completed or any byte received).
    Backoff is exponential with jitter; its exponent counts failures of the kind at hand, so after an
    outage's connection errors a 500 from the server that is back waits like a first retry."""

    def __init__(self, max_retries, deadline_s):
        self.max_retries = max_retries
        self.deadline_s = deadline_s
        self.attempts = 0
        self.http_failures = 0

    def delay_after(self, exc: TransientError, last_alive: float, urls: Iterable[str]) -> float | None:
        """Seconds to wait before the next attempt, or None to give up for this run (raises ServerDown
        when the server has shown no sign of life for the deadline)."""
        down_for = time.monotonic() - last_alive
        if down_for > self.deadline_s:
            raise ServerDown(f"server at {', '.join(urls)} failing for {down_for:.0f} s "
                             f"(deadline {self.deadline_s:g} s; last error: {exc})")
        self.attempts += 1
        self.http_failures += not exc.connection
        if self.http_failures > self.max_retries:
            return None
        step = self.attempts if exc.connection else self.http_failures
        return backoff_delay(min(step, 6), retry_after=exc.retry_after)


class PermanentErrors:
    """This run's permanent errors (a 4xx that is the prompt's, e.g. context too long).

    Each is held until a later request succeeds, which proves the server works and the error the
    prompt's: then it goes to errors.jsonl, with the request params that produced it. A kill loses the
    held ones; their prompts are asked again. FAILURE_STREAK of them in a row with the same status and
    no success between is a server-wide failure (a broken deployment, a setting every request trips
    on): UserError, and none is recorded.
    """

    FAILURE_STREAK = 20

    def __init__(self, path):
        self.path = path
        self.pending = []
        self.streak_status, self.streak = None, 0

    def add(self, gen_id: str, messages: list[dict[str, Any]], exc: PermanentError, identity: Identity,
            params: dict[str, Any], where: Mapping[str, Any] | None = None) -> None:
        """`identity`, `params`: those of the lane (mixture cell) that made the request."""
        self.pending.append({"id": gen_id, "identity": identity.sha, **(where or {}), "messages": messages,
                             "status": exc.status, "error": exc.message, "identity_settings": identity.settings,
                             "params": params, "created": round(time.time(), 3), "usage": {}})
        self.streak = self.streak + 1 if self.streak_status == exc.status else 1
        self.streak_status = exc.status
        if self.streak >= self.FAILURE_STREAK:
            raise UserError(f"every request fails the same way: {self.streak} in a row with {exc} (last prompt "
                            f"{gen_id}); none recorded as the prompts' errors; fix the server or settings "
                            "and rerun")

    def success(self) -> None:
        self.streak_status, self.streak = None, 0
        self.flush()

    def flush(self) -> None:
        for rec in self.pending:
            journal.append_error(self.path, rec)
        self.pending.clear()

    def first(self) -> dict[str, Any] | None:
        return self.pending[0] if self.pending else None
