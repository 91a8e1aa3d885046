"""The client's retry classes and backoff (the client against a real server: \
tests/workflow/test_client_streaming.py)."""

import random

import pytest

from budgetgen.streams import backoff_delay, is_transient_status, parse_retry_after


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
