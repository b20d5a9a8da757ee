"""What the sync and async clients share, with no I/O: addresses, per-attempt parameters, and the model
configs that splitting reads (cached for a while: a tuner may change them under the client)."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

import numpy as np

from modelhost.client import split as splitting
from modelhost.client.errors import ClientError
from modelhost.client.retry import RetryPolicy
from modelhost.client.split import BatchShape

DEFAULT_PORTS = {"http": 8000, "grpc": 8001}
CONFIG_TTL_S = 30.0
# HTTP bodies this large first ask the server whether it takes them (Expect: 100-continue, as curl does above
# 1 MiB): a server refusing a request at its head (overload, a latency target) is spared the body.
EXPECT_CONTINUE_BYTES = 1 << 20
UNSPLITTABLE = BatchShape(0, 1)


def parse_address(url: str, protocol: str | None = None) -> tuple[str, str, int]:
    """("http" | "grpc", host, port) from "host:port", "http://host:port" or "grpc://host:port"; `protocol`
    names it when the URL has no scheme."""
    if "://" not in url:
        url = f"{protocol or 'http'}://{url}"
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme not in DEFAULT_PORTS:
        raise ValueError(f"the client speaks http and grpc, not {scheme!r} ({url})")
    if protocol is not None and protocol != scheme:
        raise ValueError(f"the URL {url} says {scheme}, but protocol={protocol!r}")
    if parts.path not in ("", "/"):
        raise ValueError(f"the server address {url} has a path; give host:port")
    host = parts.hostname or "127.0.0.1"
    return scheme, host, parts.port or DEFAULT_PORTS[scheme]


def attempt_parameters(parameters: Mapping[str, Any] | None, deadline: float | None) -> dict[str, Any]:
    """The request's parameters for one attempt: with a deadline, V2's `timeout` (µs left), so that a server
    whose queue policy allows it drops the request once it is late."""
    params = dict(parameters or {})
    if deadline is not None:
        params["timeout"] = max(int((deadline - time.monotonic()) * 1e6), 1)
    return params


def deadline_of(timeout: float | None) -> float | None:
    if timeout is None:
        return None
    if timeout <= 0:
        raise ValueError(f"timeout must be positive seconds, got {timeout}")
    return time.monotonic() + timeout


class ConfigCache:
    """(model, version) -> BatchShape, each kept CONFIG_TTL_S seconds. Not locked: a race only fetches twice."""

    def __init__(self, ttl_s: float = CONFIG_TTL_S) -> None:
        self._ttl = ttl_s
        self._entries: dict[tuple[str, str], tuple[float, BatchShape]] = {}

    def get(self, model: str, version: str) -> BatchShape | None:
        entry = self._entries.get((model, version))
        if entry is None or entry[0] < time.monotonic():
            return None
        return entry[1]

    def put(self, model: str, version: str, shape: BatchShape) -> None:
        self._entries[(model, version)] = (time.monotonic() + self._ttl, shape)

    def forget(self, model: str) -> None:
        for key in [key for key in self._entries if key[0] == model]:
            del self._entries[key]


def rows_to_split(inputs: Mapping[str, np.ndarray], split: int | None) -> int:
    """The request's rows when its part count depends on the model's config; 0 when it is sent whole."""
    if split == 1 or not inputs:
        return 0
    rows = splitting.rows_of(inputs)
    return rows if rows > 1 else 0


def retry_wait(policy: RetryPolicy, error: ClientError, retry: int, deadline: float | None,
               idempotent: bool) -> float | None:
    """Seconds to wait before retry number `retry` of a call that failed with `error`; None: give up."""
    if retry + 1 >= policy.attempts or not error.retryable(idempotent):
        return None
    wait = policy.wait(retry, error.retry_after)
    if deadline is not None and time.monotonic() + wait >= deadline:
        return None
    return wait
