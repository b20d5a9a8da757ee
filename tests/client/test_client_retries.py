"""Retries against scripted servers on real sockets: refusals are retried (after Retry-After), a request the
server may have run is retried only when idempotent, stale pooled connections are replaced."""

from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest

from modelhost.client import AsyncClient, Client, ClientError, RetryPolicy
from tests.client.fake_servers import grpc_server, http_server
from tests.server import free_port

X = {"x": np.ones((1, 1), np.float32)}
FAST = RetryPolicy(attempts=3, base_s=0.01, cap_s=0.02)


def test_503_then_200_is_retried() -> None:
    with http_server(["503:0", "503", "ok"]) as (url, script), Client(url, retry=FAST) as client:
        assert client.infer("m", X)["y"].tolist() == [7.0]
        assert script.requests == 3


def test_retry_after_is_waited_for() -> None:
    with http_server(["503:1", "ok"]) as (url, script), Client(url, retry=FAST) as client:
        started = time.monotonic()
        client.infer("m", X)
        assert time.monotonic() - started >= 0.95 and script.requests == 2


def test_a_retry_after_past_the_deadline_is_not_waited_for() -> None:
    with http_server(["503:30", "ok"]) as (url, script), Client(url, retry=FAST) as client:
        started = time.monotonic()
        with pytest.raises(ClientError) as refused:
            client.infer("m", X, timeout=2.0)
        assert refused.value.status == 503 and refused.value.message == "queue full"
        assert time.monotonic() - started < 1.0 and script.requests == 1


def test_retries_stop_after_the_policys_attempts() -> None:
    with http_server(["503"]) as (url, script), Client(url, retry=FAST) as client:
        with pytest.raises(ClientError, match="queue full"):
            client.infer("m", X)
        assert script.requests == 3


def test_a_dropped_connection_is_retried_only_for_idempotent_calls() -> None:
    with http_server(["drop", "ok"]) as (url, script), Client(url, retry=FAST) as client:
        with pytest.raises(ClientError, match="closed the connection") as dropped:
            client.infer("m", X)
        assert dropped.value.sent and script.requests == 1  # it may have run: not sent again
        assert client.infer("m", X)["y"].tolist() == [7.0]
    with http_server(["drop", "ok"]) as (url, script), Client(url, retry=FAST) as client:
        assert client.infer("m", X, idempotent=True)["y"].tolist() == [7.0]
        assert script.requests == 2


def test_nothing_listening_is_retried_then_reported() -> None:
    with Client(f"127.0.0.1:{free_port()}", retry=FAST) as client:
        with pytest.raises(ClientError, match="cannot connect") as refused:
            client.infer("m", X)
        assert not refused.value.sent


def test_connections_are_kept_and_stale_ones_replaced() -> None:
    with http_server(["ok"]) as (url, script), Client(url, retry=FAST) as client:
        for _ in range(10):
            client.infer("m", X)
        assert script.connections == 1
    with http_server(["close-after"]) as (url, script), Client(url, retry=RetryPolicy(attempts=1)) as client:
        for count in range(1, 4):
            client.infer("m", X)  # no retries: the closed connection is found idle, before it is used
            deadline = time.monotonic() + 5
            while script.closed < count and time.monotonic() < deadline:
                time.sleep(0.005)
            time.sleep(0.01)  # its FIN on the client's side too
        assert script.requests == 3 and script.connections == 3


def test_async_client_retries_refusals_and_dropped_idempotent_calls() -> None:
    async def calls(url: str, idempotent: bool) -> list[float]:
        async with AsyncClient(url, retry=FAST) as client:
            return (await client.infer("m", X, idempotent=idempotent))["y"].tolist()  # type: ignore[no-any-return]

    with http_server(["503:0", "ok"]) as (url, script):
        assert asyncio.run(calls(url, False)) == [7.0] and script.requests == 2
    with http_server(["drop", "ok"]) as (url, script):
        with pytest.raises(ClientError, match="closed the connection"):
            asyncio.run(calls(url, False))
        assert script.requests == 1
    with http_server(["drop", "ok"]) as (url, script):
        assert asyncio.run(calls(url, True)) == [7.0] and script.requests == 2


@pytest.mark.parametrize("use_async", [False, True])
def test_grpc_unavailable_with_retry_after_is_retried(use_async: bool) -> None:
    async def call(url: str) -> list[float]:
        async with AsyncClient(url, retry=FAST) as client:
            return (await client.infer("m", X))["y"].tolist()  # type: ignore[no-any-return]

    with grpc_server(["unavailable:0", "ok"]) as (url, script):
        if use_async:
            assert asyncio.run(call(url)) == [7.0]
        else:
            with Client(url, retry=FAST) as client:
                assert client.infer("m", X)["y"].tolist() == [7.0]
        assert script.requests == 2


def test_grpc_unavailable_without_retry_after_may_have_run() -> None:
    with grpc_server(["unavailable", "ok"]) as (url, script), Client(url, retry=FAST) as client:
        with pytest.raises(ClientError) as failed:
            client.infer("m", X)
        assert failed.value.status == "UNAVAILABLE" and script.requests == 1
        assert client.infer("m", X, idempotent=True)["y"].tolist() == [7.0]


LARGE = {"x": np.ones((300_000, 1), np.float32)}  # 1.2 MB: asks Expect: 100-continue


def one_body(received: int) -> bool:
    """The server read one request's body (its tensor and JSON header), not two."""
    return LARGE["x"].nbytes <= received < 2 * LARGE["x"].nbytes


def test_a_large_request_refused_at_its_head_never_sends_its_body() -> None:
    with http_server(["head-503", "ok"]) as (url, script), Client(url, retry=FAST) as client:
        assert client.infer("m", LARGE, split=1)["y"].tolist() == [7.0]
        assert script.requests == 2 and one_body(script.body_bytes)  # only the retry's body
        assert script.connections == 2  # a connection refused at the head is not kept
    with http_server(["head-503"]) as (url, script), Client(url, retry=RetryPolicy(attempts=1)) as client:
        with pytest.raises(ClientError, match="refused at the head") as refused:
            client.infer("m", LARGE, split=1)
        assert refused.value.status == 503 and not refused.value.sent and script.body_bytes == 0


def test_async_large_request_refused_at_its_head() -> None:
    async def call(url: str) -> list[float]:
        async with AsyncClient(url, retry=FAST) as client:
            return (await client.infer("m", LARGE, split=1))["y"].tolist()  # type: ignore[no-any-return]

    with http_server(["head-503", "ok"]) as (url, script):
        assert asyncio.run(call(url)) == [7.0]
        assert script.requests == 2 and one_body(script.body_bytes)


@pytest.mark.parametrize("use_async", [False, True])
def test_a_server_ignoring_expect_gets_the_body_after_a_wait(use_async: bool,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    from modelhost.client import aio_http_connection, http_connection

    monkeypatch.setattr(http_connection, "CONTINUE_WAIT_S", 0.2)
    monkeypatch.setattr(aio_http_connection, "CONTINUE_WAIT_S", 0.2)

    async def call(url: str) -> list[float]:
        async with AsyncClient(url, retry=FAST) as client:
            return (await client.infer("m", LARGE, split=1))["y"].tolist()  # type: ignore[no-any-return]

    with http_server(["no-continue"]) as (url, script):
        started = time.monotonic()
        if use_async:
            assert asyncio.run(call(url)) == [7.0]
        else:
            with Client(url, retry=FAST) as client:
                assert client.infer("m", LARGE, split=1)["y"].tolist() == [7.0]
        assert time.monotonic() - started >= 0.2 and one_body(script.body_bytes)
