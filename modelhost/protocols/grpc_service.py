"""What a protocol module hands the gRPC server: `Service`s of `Unary`, `ServerStream` and `Stream` RPCs over
protobuf messages, as HTTP ones hand in Routes. Services are registered by name, so a protocol's method paths are
whatever its `Service.name` says, whatever package its messages were generated in.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import grpc
from google.protobuf.message import Message

from modelhost.access import Api
from modelhost.errors import ModelhostError


class RpcError(Exception):
    """An answer with a status code a protocol chooses itself (one whose codes follow its own rules, not the
    ErrorKind table's), raised by an RPC's call or returned by a Service's guard."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass(frozen=True, slots=True)
class Unary:
    """One request, one response; `call` raises ModelhostError for the client."""

    name: str
    request_type: type[Message]
    call: Callable[..., Awaitable[Message]]
    api: Api  # the group access control restricts it by
    with_context: bool = False  # `call` also gets the call's grpc context (its invocation metadata: trace context)


@dataclass(frozen=True, slots=True)
class Stream:
    """A bidirectional stream answered request by request: each request is `answer`ed as its own task
    (several in flight at once), answers are written as they complete, and a failed request is answered
    with `error(request, exc)` while the stream goes on. `answer` may return an async iterator of messages
    instead of one (a request answered several times, a decoupled model's): they are written as they come, and an
    error among them is answered with `error` in their place."""

    name: str
    request_type: type[Message]
    answer: Callable[..., Awaitable[Message | AsyncIterator[Message]]]  # (request) or (request, context)
    error: Callable[[Any, ModelhostError], Message]
    api: Api
    in_order: bool = False  # one request at a time, answered in the order they came (a sequence's requests)
    with_context: bool = False  # `answer` also gets the stream's grpc context (its invocation metadata)
    # In order only: a request answered by several messages, which `answers` yields (`answer` is not called); an
    # error after some is answered with `error` in their place, and the stream goes on.
    answers: Callable[[Any], AsyncIterator[Message]] | None = None


@dataclass(frozen=True, slots=True)
class ServerStream:
    """One request, a stream of responses: `answer` yields them; an error ends the stream with its status."""

    name: str
    request_type: type[Message]
    answer: Callable[[Any], AsyncIterator[Message]]
    api: Api


# Checks a call's invocation metadata (names lower case) before anything else: the RpcError to end it with, or None.
Guard = Callable[[dict[str, str]], "RpcError | None"]


@dataclass(frozen=True, slots=True)
class Service:
    name: str  # the method paths are /<name>/<rpc name>
    rpcs: Sequence[Unary | Stream | ServerStream]
    guard: Guard | None = None
