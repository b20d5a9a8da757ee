"""When and how long to wait before trying a failed call again: capped exponential backoff with full jitter,
and at least what the server's Retry-After asks."""

from __future__ import annotations

import random
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """`attempts` tries in all (1: never retry); waits drawn from [0, min(cap_s, base_s * 2**n)] before the
    n-th retry (full jitter: clients refused together do not come back together)."""

    attempts: int = 4
    base_s: float = 0.05
    cap_s: float = 2.0

    def __post_init__(self) -> None:
        if self.attempts < 1:
            raise ValueError(f"RetryPolicy.attempts must be at least 1, got {self.attempts}")
        if self.base_s < 0 or self.cap_s < 0:
            raise ValueError("RetryPolicy waits must not be negative")

    def wait(self, retry: int, retry_after: float | None, rng: random.Random | None = None) -> float:
        """Seconds to wait before retry number `retry` (0 for the first)."""
        ceiling = min(self.cap_s, self.base_s * 2.0**retry)
        wait = (rng or random).uniform(0.0, ceiling)
        return wait if retry_after is None else max(wait, retry_after)


DEFAULT_RETRY = RetryPolicy()
NO_RETRIES = RetryPolicy(attempts=1)
