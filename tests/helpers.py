"""Helpers the tests share: running a coroutine, waiting for a condition, and asserting errors."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

import pytest
import requests

from modelhost.errors import ErrorKind, ModelhostError


def run(coroutine: Coroutine[Any, Any, Any], timeout: float = 10.0) -> Any:
    """Run a test's coroutine on a fresh event loop, failing it after `timeout` seconds."""
    return asyncio.run(asyncio.wait_for(coroutine, timeout))


async def until(predicate: Callable[[], bool], what: str = "", timeout: float = 5.0) -> None:
    """Poll `predicate` every millisecond until it holds; AssertionError naming `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what or predicate}")
        await asyncio.sleep(0.001)


def rejected(call: Callable[[], Any], match: str = "", kind: ErrorKind = ErrorKind.INVALID_INPUT) -> ModelhostError:
    """The ModelhostError `call()` raises, of `kind`, its message matching the regex `match`."""
    with pytest.raises(ModelhostError, match=match) as info:
        call()
    assert info.value.kind is kind, info.value
    return info.value


async def rejected_async(awaitable: Awaitable[Any], kind: ErrorKind) -> ModelhostError:
    """The ModelhostError awaiting `awaitable` raises, of `kind`."""
    with pytest.raises(ModelhostError) as info:
        await awaitable
    assert info.value.kind is kind, info.value
    return info.value


def assert_error(response: requests.Response, status: int, *fragments: str) -> str:
    """An HTTP error answer: the status, a JSON body that is exactly {"error": str}, every fragment in the message."""
    assert response.status_code == status, response.text
    return error_message(response.headers["content-type"], response.json(), *fragments)


def error_message(content_type: str | None, document: Any, *fragments: str) -> str:
    """The message of a JSON error body that is exactly {"error": str}, with every fragment in it."""
    assert content_type == "application/json"
    assert isinstance(document, dict) and list(document) == ["error"], document
    message = document["error"]
    assert isinstance(message, str) and message
    for fragment in fragments:
        assert fragment in message, f"{fragment!r} not in {message!r}"
    return message
