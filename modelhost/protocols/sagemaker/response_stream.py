"""InvokeEndpointWithResponseStream's answer: an invocation's parts (Invoker.parts) as event-stream PayloadPart
events (event_stream.py), so boto3's `invoke_endpoint_with_response_stream(...)["Body"]` iterates them.

A failure before the first part is the call's error (the route answers it as InvokeEndpoint does); after it, the
HTTP head is sent and the stream ends with a modeled exception event: ModelStreamError for what the model or its
code answered (ErrorCode ModelInvocationTimeExceeded when the stream outlives the model server timeout),
InternalStreamFailure for anything else. The response custom attributes are those of the first part (a header
goes before the body). The client leaving closes the parts: the model's request is cancelled.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import AsyncExitStack

from modelhost.client_log import client_log
from modelhost.errors import ErrorKind, ModelhostError, public_message
from modelhost.protocols.http.app import HttpResponse
from modelhost.protocols.sagemaker import event_stream
from modelhost.protocols.sagemaker.handler_api import HandlerError
from modelhost.protocols.sagemaker.invoke import Answer
from modelhost.protocols.sagemaker.payloads import MediaTypeError

log = logging.getLogger("modelhost.sagemaker")

CUSTOM_ATTRIBUTES = b"x-amzn-sagemaker-custom-attributes"
_FAILURES = (ModelhostError, MediaTypeError, HandlerError)


async def streamed(parts: AsyncGenerator[Answer, None], held: AsyncExitStack, timeout_s: float,
                   headers: list[tuple[bytes, bytes]]) -> HttpResponse:
    """The response for `parts`; raises what fails before the first part (then `parts` is closed, `held` not).
    `held` (what keeps the model in use) is closed when the stream ends; `timeout_s` bounds the whole stream."""
    deadline = time.monotonic() + timeout_s
    try:
        first = await _next(parts, deadline, timeout_s)
    except BaseException:
        await parts.aclose()
        raise
    if first is None:
        first = Answer(b"", "application/octet-stream")
    head = [(b"content-type", event_stream.CONTENT_TYPE),
            (b"x-amzn-sagemaker-content-type", first.content_type.encode()), *attributes_header(first), *headers]
    return HttpResponse(200, [b"".join(event_stream.payload_parts(first.body))], head,
                        more=_events(parts, held, deadline, timeout_s))


async def _events(parts: AsyncGenerator[Answer, None], held: AsyncExitStack, deadline: float,
                  timeout_s: float) -> AsyncIterator[bytes]:
    try:
        while (part := await _next(parts, deadline, timeout_s)) is not None:
            for event in event_stream.payload_parts(part.body):
                yield event
    except _FAILURES as exc:
        yield _model_stream_error(exc)
    except Exception as exc:  # noqa: BLE001 - after the head, an event is the only way to say it
        client_log(log, logging.WARNING, "sagemaker-stream-failed", "a response stream failed", exc_info=exc)
        yield event_stream.stream_error(event_stream.INTERNAL_STREAM_FAILURE,
                                        f"the response stream failed: {type(exc).__name__}")
    finally:
        await parts.aclose()
        await held.aclose()


async def _next(parts: AsyncGenerator[Answer, None], deadline: float, timeout_s: float) -> Answer | None:
    try:
        return await asyncio.wait_for(anext(parts, None), max(deadline - time.monotonic(), 0.0))
    except asyncio.TimeoutError:
        raise ModelhostError(ErrorKind.TIMEOUT, f"the invocation did not finish within {timeout_s:g} s "
                                                "(model server timeout)") from None


def _model_stream_error(exc: ModelhostError | MediaTypeError | HandlerError) -> bytes:
    if isinstance(exc, ModelhostError):
        code = "ModelInvocationTimeExceeded" if exc.kind == ErrorKind.TIMEOUT else ""
        return event_stream.stream_error(event_stream.MODEL_STREAM_ERROR, public_message(exc.message), code)
    return event_stream.stream_error(event_stream.MODEL_STREAM_ERROR, exc.message)


def attributes_header(answer: Answer) -> list[tuple[bytes, bytes]]:
    """The response's X-Amzn-SageMaker-Custom-Attributes: what user code set, where it is what the Runtime API
    carries (at most 1024 visible US-ASCII characters; anything else, a header injection included, is dropped)."""
    value = answer.custom_attributes
    if not value:
        return []
    if len(value) > 1024 or not all(" " <= c <= "~" for c in value):
        log.warning("custom attributes set by the model's code were dropped: they must be at most 1024 visible "
                    "US-ASCII characters")
        return []
    return [(CUSTOM_ATTRIBUTES, value.encode())]
