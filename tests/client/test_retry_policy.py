"""Backoff waits and what counts as safe to retry (no server)."""

from __future__ import annotations

import random

import pytest

from modelhost.client.errors import ClientError, http_error
from modelhost.client.retry import RetryPolicy


def test_waits_are_jittered_below_a_doubling_cap() -> None:
    policy = RetryPolicy(attempts=6, base_s=0.1, cap_s=0.5)
    rng = random.Random(7)
    for retry, ceiling in enumerate([0.1, 0.2, 0.4, 0.5, 0.5]):
        waits = [policy.wait(retry, None, rng) for _ in range(200)]
        assert all(0.0 <= w <= ceiling for w in waits)
        assert max(waits) > ceiling * 0.8 and min(waits) < ceiling * 0.2  # spread: full jitter


def test_retry_after_is_a_floor() -> None:
    policy = RetryPolicy(base_s=0.01, cap_s=0.02)
    assert policy.wait(0, 1.5) == 1.5


def test_a_policy_needs_one_attempt() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        RetryPolicy(attempts=0)


@pytest.mark.parametrize(("error", "plain", "idempotent"), [
    (http_error(503, "busy", 1.0), True, True),        # refused: never ran
    (http_error(429, "slow down", None), True, True),
    (http_error(500, "boom", None), False, False),     # ran and failed: not transient
    (http_error(400, "bad", None), False, False),
    (ClientError(0, "reset", transient=True), False, True),   # fate unknown: only if idempotent
    (ClientError(0, "refused", sent=False, transient=True), True, True),
])
def test_which_failures_are_retried(error: ClientError, plain: bool, idempotent: bool) -> None:
    assert error.retryable(idempotent=False) is plain
    assert error.retryable(idempotent=True) is idempotent
