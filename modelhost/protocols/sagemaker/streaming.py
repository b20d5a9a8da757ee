"""One SageMaker invocation answered in parts, for InvokeEndpointWithResponseStream: a decoupled model's
responses (core/decoupled.py, through DataPlane.stream), each encoded for Accept as the model sends it; a
handler model's intermediate answers (PartialAnswers: a TorchServe handler's send_intermediate_predict_response)
then its final one; any other model's one answer as one part.

Contract: runs on the event loop. What fails the invocation raises (ModelhostError, MediaTypeError, HandlerError)
from the generator: before the first part it is the call's error, after it the stream's (the route ends the
stream with a modeled exception event). Closing the generator early cancels the model's request.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from contextlib import aclosing

from modelhost.core.dataplane import DataPlane
from modelhost.core.partial_answers import PartialAnswers
from modelhost.errors import ModelhostError
from modelhost.handler_messages import HANDLER_SIGNATURE, RESPONSE_OUTPUT, HandlerResponse
from modelhost.protocols.sagemaker.handler_api import HandlerError
from modelhost.protocols.sagemaker.payloads import decode_invocation, encode_answer
from modelhost.types import InferRequest

Part = tuple[bytes, str]  # a part's bytes and the content type of the whole answer


async def model_parts(dataplane: DataPlane, model: str, version: str, body: bytes, content_type: str | None,
                      accept: str | None, default_accept: str) -> AsyncGenerator[Part, None]:
    """A model's answer (no handler) in parts: each response with outputs of a decoupled model, else the one;
    each encoded as `encode_answer` encodes an invocation's answer."""
    metadata = dataplane.metadata(model, version)
    invocation = decode_invocation(body, content_type, metadata.inputs, dataplane.limits)
    request = invocation.request
    request.model_name, request.model_version = model, version
    async with aclosing(dataplane.stream(request)) as answers:
        async for response, _final in answers:
            if isinstance(response, ModelhostError):
                raise response
            if response.outputs:
                yield encode_answer(response, invocation, accept, default_accept)


async def handler_parts(dataplane: DataPlane, request: InferRequest,
                        partials: PartialAnswers) -> AsyncGenerator[HandlerResponse, None]:
    """A handler model's answers to `request` (whose HandlerRequest carries `partials`, read here): each
    intermediate one as the handler sends it, then the final one."""

    async def run() -> HandlerResponse:
        try:
            response = await dataplane.infer(request)
        finally:
            partials.close()
        final = response.outputs[RESPONSE_OUTPUT].reshape(-1)[0]
        assert isinstance(final, HandlerResponse)
        return final

    task = asyncio.ensure_future(run())
    try:
        while (partial := await partials.next()) is not None:
            yield _checked(partial)
        yield _checked(await task)
    finally:
        if not task.done():
            partials.abandon()
            task.cancel()  # the client is gone: a queued request is withdrawn
        elif not task.cancelled():
            task.exception()  # retrieved: a failure after the stream ended is the stream's


def _checked(answer: HandlerResponse) -> HandlerResponse:
    if answer.error or answer.status >= 400:
        raise HandlerError(answer.status, answer.body.decode("utf-8", "replace"))
    return answer


def is_handler_model(dataplane: DataPlane, model: str, version: str) -> bool:
    """Whether the model takes requests as they came (a TorchServe-style handler), not as tensors."""
    return HANDLER_SIGNATURE in dataplane.metadata(model, version).signatures
