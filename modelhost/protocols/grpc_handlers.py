"""How the gRPC server runs each call: access control and a service's guard, the request parsed from bytes, the
response serialized within the message limit, the per-request load count the schedulers read, and ErrorKind ->
grpc.StatusCode (`STATUS`) for the errors a call ends with.

Cancellation: when a client's deadline passes or it cancels, grpc.aio cancels the RPC's task; the CancelledError
reaches the scheduler, which drops the request if it is still queued.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
from google.protobuf.message import Message

from modelhost.access import AccessPolicy, Api, Denial
from modelhost.client_log import client_log
from modelhost.core.in_flight import InFlight
from modelhost.errors import ErrorKind, ModelhostError, invalid, public_message
from modelhost.protocols.grpc_service import Guard, RpcError, ServerStream, Service, Stream, Unary

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
MAX_QUEUED_PART_BYTES = 16 * 1024**2  # a stream's messages of several-message answers queued, unwritten


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


def generic_handler(service: Service, in_flight: InFlight, limit: int, access: AccessPolicy) -> grpc.GenericRpcHandler:
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
    async def answer(data: bytes, context: Any) -> bytes | tuple[Any, AsyncIterator[Message]]:
        in_flight.arrived()
        request = None
        try:
            request = _parse(rpc.request_type, data)
            result = await (rpc.answer(request, context) if rpc.with_context else rpc.answer(request))
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
                    result = await answer(request, context)
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
            result = await answer(request, context)
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
