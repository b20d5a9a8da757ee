"""gRPC server (grpc.aio, on the process's one event loop): services, ErrorKind -> status codes, limits, stop.

Protocol modules hand in `Service`s of `Unary` and `Stream` RPCs over protobuf messages, as HTTP ones
hand in Routes; this module owns serialization, the ErrorKind -> grpc.StatusCode table, the
per-request load count the schedulers read, message size and keepalive options, and the graceful
stop. Services are registered by name (`method_handlers_generic_handler`), so a protocol's method
paths are whatever its `Service.name` says, whatever package its messages were generated in.

Cancellation: when a client's deadline passes or it cancels, grpc.aio cancels the RPC's task; the
CancelledError reaches the scheduler, which drops the request if it is still queued.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import grpc
from google.protobuf.message import Message

from modelhost.access import AccessPolicy, Api, Denial
from modelhost.client_log import client_log
from modelhost.core.in_flight import InFlight
from modelhost.errors import ErrorKind, ModelhostError, invalid, public_message

log = logging.getLogger("modelhost.grpc")

STATUS = {
    ErrorKind.INVALID_INPUT: grpc.StatusCode.INVALID_ARGUMENT,
    ErrorKind.TOO_LARGE: grpc.StatusCode.RESOURCE_EXHAUSTED,
    ErrorKind.NOT_FOUND: grpc.StatusCode.NOT_FOUND,
    ErrorKind.UNAVAILABLE: grpc.StatusCode.UNAVAILABLE,
    ErrorKind.OVERLOADED: grpc.StatusCode.UNAVAILABLE,
    ErrorKind.TIMEOUT: grpc.StatusCode.DEADLINE_EXCEEDED,
    ErrorKind.UNSUPPORTED: grpc.StatusCode.UNIMPLEMENTED,
    ErrorKind.PRECONDITION: grpc.StatusCode.FAILED_PRECONDITION,
    ErrorKind.ALREADY_EXISTS: grpc.StatusCode.ALREADY_EXISTS,
    ErrorKind.NO_MEMORY: grpc.StatusCode.RESOURCE_EXHAUSTED,
    ErrorKind.INTERNAL: grpc.StatusCode.INTERNAL,
}
_INT32_MAX = 2**31 - 1
# Clients may ping an idle connection this often (gRPC's server default, 5 minutes, answers a client
# that keeps alive every 10 s with GOAWAY "too_many_pings").
MIN_CLIENT_PING_INTERVAL_MS = 5000
MAX_QUEUED_PART_BYTES = 16 * 1024**2  # a stream's messages of several-message answers queued, unwritten


class ListenError(Exception):
    """The gRPC port cannot be bound; the message says which and why."""


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
    answer: Callable[[Any], Awaitable[Message | AsyncIterator[Message]]]
    error: Callable[[Any, ModelhostError], Message]
    api: Api
    in_order: bool = False  # one request at a time, answered in the order they came (a sequence's requests)
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


@dataclass(frozen=True, slots=True)
class GrpcOptions:
    max_message_bytes: int  # received and sent
    keepalive_time_seconds: float
    keepalive_timeout_seconds: float
    reuse_port: bool = False  # several processes share the port (--workers)


def server_options(options: GrpcOptions) -> list[tuple[str, int]]:
    """grpc channel arguments for the server."""
    return [
        ("grpc.max_receive_message_length", options.max_message_bytes),
        ("grpc.max_send_message_length", options.max_message_bytes),
        ("grpc.keepalive_time_ms", _milliseconds(options.keepalive_time_seconds)),
        ("grpc.keepalive_timeout_ms", _milliseconds(options.keepalive_timeout_seconds)),
        ("grpc.keepalive_permit_without_calls", 1),  # idle connections are pinged too: dead peers get closed
        ("grpc.http2.max_pings_without_data", 0),  # no cap on the server's own keepalive pings
        ("grpc.http2.min_ping_interval_without_data_ms", MIN_CLIENT_PING_INTERVAL_MS),
        # gRPC sets SO_REUSEPORT by default: then a second server would share a busy port silently.
        ("grpc.so_reuseport", 1 if options.reuse_port else 0),
    ]


class GrpcServer:
    """Serves `services` on host:port: `bind()`, `start()`, `stop(grace)`, all on one event loop."""

    def __init__(self, services: Sequence[Service], host: str, port: int, options: GrpcOptions,
                 in_flight: InFlight, access: AccessPolicy | None = None,
                 credentials: grpc.ServerCredentials | None = None) -> None:
        self.services = list(services)
        self.access = access or AccessPolicy()
        self.credentials = credentials  # TLS (tls.py); None: plaintext
        self.address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        self.options = options
        self.in_flight = in_flight
        self._server: grpc.aio.Server | None = None
        self._stopping: asyncio.Future[None] | None = None

    def bind(self) -> None:
        """Create the server and bind its port (connections then wait until `start()`); ListenError if busy."""
        server = grpc.aio.server(options=server_options(self.options))
        limit = self.options.max_message_bytes
        server.add_generic_rpc_handlers([_generic_handler(service, self.in_flight, limit, self.access)
                                         for service in self.services])
        try:
            if self.credentials is None:
                server.add_insecure_port(self.address)
            else:
                server.add_secure_port(self.address, self.credentials)
        except RuntimeError:
            raise ListenError(f"cannot listen on {self.address} for gRPC: "
                              "the port is in use or the address is not this machine's") from None
        self._server = server

    async def start(self) -> None:
        """Accept calls (binding first if `bind()` was not called)."""
        if self._server is None:
            self.bind()
        assert self._server is not None
        await self._server.start()
        log.info("gRPC listening on %s", self.address)

    def stop(self, grace: float) -> asyncio.Future[None]:
        """Stop accepting RPCs; those in flight get `grace` seconds, then are cancelled. Idempotent:
        every call returns the one stop in progress, to await."""
        if self._stopping is None:
            self._stopping = asyncio.ensure_future(self._stop(grace))
        return self._stopping

    async def _stop(self, grace: float) -> None:
        if self._server is not None:
            log.info("gRPC: no new calls, finishing those in flight (up to %gs)", grace)
            await self._server.stop(grace)


def _milliseconds(seconds: float) -> int:
    return max(1, min(_INT32_MAX, math.ceil(seconds * 1000)))


def _serialize(message: Message, limit: int) -> bytes:
    """The message's bytes; ModelhostError if over the limit. (Behaviors serialize, not grpc: a response
    over grpc's own send limit fails with a traceback in the server's log, and asking protobuf for the
    size first would serialize twice.)"""
    data = message.SerializeToString()
    if len(data) > limit:
        # NO_MEMORY is RESOURCE_EXHAUSTED, what gRPC answers a request over the limit with.
        raise ModelhostError(ErrorKind.NO_MEMORY, f"the response is {len(data)} bytes, more than the gRPC message "
                             f"limit of {limit} bytes (--grpc-max-message-bytes)")
    return data


def _generic_handler(service: Service, in_flight: InFlight, limit: int, access: AccessPolicy) -> grpc.GenericRpcHandler:
    # Requests arrive as bytes (no request_deserializer): grpc answers a message its deserializer cannot
    # read with UNKNOWN and logs a traceback per message; _parse answers INVALID_ARGUMENT in one line.
    handlers = {}
    guard = service.guard
    for rpc in service.rpcs:
        if isinstance(rpc, Unary):
            handlers[rpc.name] = grpc.unary_unary_rpc_method_handler(
                unary_behavior(rpc, in_flight, limit, access, guard))
        elif isinstance(rpc, ServerStream):
            handlers[rpc.name] = grpc.unary_stream_rpc_method_handler(
                _server_stream_behavior(rpc, in_flight, limit, access, guard))
        else:
            handlers[rpc.name] = grpc.stream_stream_rpc_method_handler(
                _stream_behavior(rpc, in_flight, limit, access, guard))
    return grpc.method_handlers_generic_handler(service.name, handlers)


def _parse(request_type: type[Message], data: bytes) -> Any:
    """The request message in `data`; INVALID_INPUT, logged at a limited rate, when it does not parse."""
    try:
        return request_type.FromString(data)
    except Exception as exc:  # DecodeError, or what else protobuf raises on bytes it cannot read
        name = request_type.DESCRIPTOR.full_name
        client_log(log, logging.WARNING, "grpc-undecodable", "undecodable %s (%d bytes): %s", name, len(data), exc)
        raise invalid(f"the request is not a valid {name} message ({len(data)} bytes): {exc}") from None


def _internal(rpc_name: str, exc: Exception) -> ModelhostError:
    """The client's error for an unexpected exception; the log (at a limited rate) has its text and traceback."""
    client_log(log, logging.ERROR, "grpc-internal-error", "%s failed", rpc_name, exc_info=exc)
    return ModelhostError(ErrorKind.INTERNAL, f"internal error ({type(exc).__name__}); the server log has the details")


def _denial(access: AccessPolicy, api: Api, context: Any) -> Denial | None:
    """The access check of one call, on its invocation metadata; None when allowed."""
    header = access.header(api)
    if header is None:
        return None
    sent = next((value for key, value in context.invocation_metadata() or () if key == header), None)
    return access.check(api, sent)


async def _abort_denied(context: Any, denial: Denial) -> None:
    code = grpc.StatusCode.UNAUTHENTICATED if denial.missing else grpc.StatusCode.PERMISSION_DENIED
    await context.abort(code, denial.message)


async def _check(context: Any, rpc: Unary | Stream | ServerStream, access: AccessPolicy, guard: Guard | None) -> None:
    """Access control, then the service's guard: aborts the call when either refuses it."""
    if access and (denial := _denial(access, rpc.api, context)) is not None:
        await _abort_denied(context, denial)
    if guard is not None:
        refused = guard({key.lower(): value for key, value in context.invocation_metadata() or ()
                         if isinstance(value, str)})
        if refused is not None:
            await context.abort(refused.code, refused.message)


async def _abort(context: Any, rpc_name: str, exc: Exception) -> None:
    """End the call with the status `exc` means for the client."""
    if isinstance(exc, RpcError):
        await context.abort(exc.code, public_message(exc.message))
    error = exc if isinstance(exc, ModelhostError) else _internal(rpc_name, exc)
    trailers = () if error.retry_after is None else (("retry-after", str(math.ceil(error.retry_after))),)
    await context.abort(STATUS[error.kind], public_message(error.message), trailers)


def unary_behavior(rpc: Unary, in_flight: InFlight, limit: int, access: AccessPolicy,
                   guard: Guard | None = None) -> Callable[[bytes, Any], Awaitable[bytes]]:
    """A unary RPC as grpc calls it: the request's bytes and the call's context (its invocation metadata; its
    `abort` ends the call with a status) -> the response's bytes. Also run on calls forwarded by Ray Serve."""
    with_context = rpc.with_context

    async def behavior(data: bytes, context: grpc.aio.ServicerContext) -> bytes:
        if access or guard is not None:
            await _check(context, rpc, access, guard)
        in_flight.arrived()
        try:
            message = _parse(rpc.request_type, data)
            return _serialize(await (rpc.call(message, context) if with_context else rpc.call(message)), limit)
        except Exception as exc:
            await _abort(context, rpc.name, exc)
        finally:
            in_flight.requests -= 1
        raise AssertionError("unreachable: context.abort raises")

    return behavior


def _server_stream_behavior(rpc: ServerStream, in_flight: InFlight, limit: int, access: AccessPolicy,
                            guard: Guard | None = None) -> Callable[[bytes, Any], AsyncIterator[bytes]]:
    async def behavior(data: bytes, context: Any) -> AsyncIterator[bytes]:
        if access or guard is not None:
            await _check(context, rpc, access, guard)
        in_flight.arrived()
        try:
            async for response in rpc.answer(_parse(rpc.request_type, data)):
                yield _serialize(response, limit)
        except Exception as exc:
            await _abort(context, rpc.name, exc)
        finally:
            in_flight.requests -= 1

    return behavior


def _stream_behavior(rpc: Stream, in_flight: InFlight, limit: int, access: AccessPolicy,
                     guard: Guard | None = None) -> Callable[[AsyncIterator[bytes], Any], AsyncIterator[bytes]]:
    async def answer(data: bytes) -> bytes | tuple[Any, AsyncIterator[Message]]:
        in_flight.arrived()
        request = None
        try:
            request = _parse(rpc.request_type, data)
            result = await rpc.answer(request)
            return _serialize(result, limit) if isinstance(result, Message) else (request, result)
        except Exception as exc:
            return failed(request, exc)
        finally:
            in_flight.requests -= 1

    async def parts(request: Any, messages: AsyncIterator[Message]) -> AsyncIterator[bytes]:
        """The messages of an answer that is several, as they come."""
        try:
            async for message in messages:
                yield _serialize(message, limit)
        except Exception as exc:
            yield failed(request, exc)
        finally:
            close = getattr(messages, "aclose", None)
            if close is not None:
                await close()  # the client is gone: the request's work is withdrawn

    async def answer_each(data: bytes) -> AsyncIterator[bytes]:
        assert rpc.answers is not None
        in_flight.arrived()
        request = None
        messages = None
        try:
            request = _parse(rpc.request_type, data)
            messages = rpc.answers(request)
            async for message in messages:
                yield _serialize(message, limit)
        except Exception as exc:
            yield failed(request, exc)
        finally:
            in_flight.requests -= 1
            close = getattr(messages, "aclose", None)
            if close is not None:
                await close()  # the client is gone: the request's work is withdrawn

    def failed(request: Any, exc: Exception) -> bytes:
        error = exc if isinstance(exc, ModelhostError) else _internal(rpc.name, exc)
        public = ModelhostError(error.kind, public_message(error.message), error.retry_after)
        return _serialize(rpc.error(request if request is not None else rpc.request_type(), public), limit)

    async def behavior(requests: AsyncIterator[bytes], context: Any) -> AsyncIterator[bytes]:
        if access or guard is not None:
            await _check(context, rpc, access, guard)  # the whole stream: its credential is in its metadata
        if rpc.in_order:
            async for request in requests:
                if rpc.answers is None:
                    result = await answer(request)
                    if isinstance(result, bytes):
                        yield result
                    else:
                        async for part in parts(*result):
                            yield part
                else:
                    async for part in answer_each(request):
                        yield part
            return
        # One reader task starts a task per request; this generator writes answers as they complete.
        # None in `answers` means the client finished sending and every request has been answered.
        answers: asyncio.Queue[bytes | None] = asyncio.Queue()
        tasks: set[asyncio.Task[None]] = set()
        reading = True
        # Answers of several messages wait while this many bytes are queued unwritten: a client that reads slower
        # than a model streams holds the model's stream back (where its unread part is bounded), not this queue.
        queued = [0]
        room = asyncio.Event()

        async def run(request: Any) -> None:
            result = await answer(request)
            if isinstance(result, bytes):
                answers.put_nowait(result)
                return
            async for part in parts(*result):
                while queued[0] >= MAX_QUEUED_PART_BYTES:
                    room.clear()
                    await room.wait()
                queued[0] += len(part)
                answers.put_nowait(part)

        def finished(task: asyncio.Task[None]) -> None:
            tasks.discard(task)
            if not reading and not tasks:
                answers.put_nowait(None)

        async def read() -> None:
            nonlocal reading
            try:
                async for request in requests:
                    task = asyncio.create_task(run(request))
                    tasks.add(task)
                    task.add_done_callback(finished)
            finally:
                reading = False
                if not tasks:
                    answers.put_nowait(None)

        reader = asyncio.create_task(read())
        try:
            while (message := await answers.get()) is not None:
                yield message
                if queued[0]:
                    queued[0] = max(0, queued[0] - len(message))
                    room.set()
            await reader  # a failed read ends the stream with its error
        finally:
            # The client is gone or the stream failed: requests still queued are dropped.
            reader.cancel()
            for task in list(tasks):
                task.cancel()

    return behavior
