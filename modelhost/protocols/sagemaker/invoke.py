"""One SageMaker invocation of a served model: the body decoded to tensors, run, encoded for Accept;
or, when the model came with an `inference.py`, handed to the user's handler with modelhost's defaults.

Contract: `Invoker.invoke` runs on the event loop. User handlers run in a thread of the handler pool; what they
call back into (the served model, TF Serving predict) is submitted to the loop and waited for there.
"""

from __future__ import annotations

import asyncio
import io
import threading
import uuid
from collections.abc import AsyncGenerator, Awaitable, Coroutine, Mapping
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Any, TypeVar

import grpc
import numpy as np
import orjson

from modelhost.core.dataplane import DataPlane
from modelhost.core.partial_answers import PartialAnswers
from modelhost.errors import ErrorKind, ModelhostError, invalid, public_message
from modelhost.handler_messages import (
    HANDLER_INPUT,
    HANDLER_SIGNATURE,
    RESPONSE_OUTPUT,
    HandlerRequest,
    HandlerResponse,
)
from modelhost.protocols.http.app import STATUS
from modelhost.protocols.sagemaker.handler_api import Handler, HandlerError, RequestInfo, TfsResponse
from modelhost.protocols.sagemaker.payloads import (
    CSV,
    JSON,
    NPY,
    Invocation,
    MediaTypeError,
    decode_invocation,
    encode_answer,
    media_type,
)
from modelhost.protocols.sagemaker.streaming import handler_parts, is_handler_model, model_parts
from modelhost.protocols.tfserving.serving import TfServing
from modelhost.types import DATATYPE_DTYPES, InferRequest, ModelMetadata, TensorSpec

T = TypeVar("T")
CUSTOM_ATTRIBUTES_HEADER = "x-amzn-sagemaker-custom-attributes"


@dataclass(frozen=True, slots=True)
class Call:
    """What the caller sent, as the container contract forwards it."""

    body: bytes
    content_type: str | None
    accept: str | None
    custom_attributes: str


@dataclass(frozen=True, slots=True)
class Answer:
    """An invocation's answer (or one part of it): the body, its content type, and the custom attributes the
    model's code set for the response (X-Amzn-SageMaker-Custom-Attributes; "" when none)."""

    body: bytes
    content_type: str
    custom_attributes: str = ""


class Invoker:
    def __init__(self, dataplane: DataPlane, default_accept: str, timeout_seconds: float, rest_base: str,
                 handler_pool: Executor | None = None, grpc_port: int | None = None) -> None:
        self._dataplane = dataplane
        self._grpc_port = grpc_port  # where TF Serving's gRPC API answers (context.grpc_port); None: off
        self._channel: grpc.Channel | None = None  # context.channel, opened at the first handler call
        self._channel_lock = threading.Lock()
        self._handler_pool = handler_pool  # where user handlers run (None: the loop's default executor)
        self._default_accept = default_accept
        self._timeout = timeout_seconds
        self._rest_base = rest_base  # e.g. "http://127.0.0.1:8080": where TF Serving predict answers

    @property
    def timeout_seconds(self) -> float:
        return self._timeout

    async def invoke(self, model: str, version: str, handler: Handler | None, call: Call) -> Answer:
        """The response body and its content type; raises ModelhostError, MediaTypeError or HandlerError."""
        if handler is not None:
            handle = self.handle(model, version)
            running = asyncio.get_running_loop().run_in_executor(self._handler_pool, self._run_handler, handler,
                                                                 handle, call)
            return await self._within_timeout(running)

        def decode(metadata: ModelMetadata) -> tuple[InferRequest, Invocation | None]:
            if HANDLER_SIGNATURE in metadata.signatures:  # a handler model takes the request as it came
                return _handler_request(call), None
            invocation = decode_invocation(call.body, call.content_type, metadata.inputs, self._dataplane.limits)
            return invocation.request, invocation

        response, invocation = await self._within_timeout(self._dataplane.decode_and_infer(model, version, decode))
        if invocation is None:
            return self._handler_answer(response.outputs[RESPONSE_OUTPUT].reshape(-1)[0], call)
        return Answer(*encode_answer(response, invocation, call.accept, self._default_accept))

    def parts(self, model: str, version: str, handler: Handler | None, call: Call) -> AsyncGenerator[Answer, None]:
        """The answer in parts, for a response stream (streaming.py): a decoupled model's responses, a handler
        model's intermediate answers, else one part. The caller bounds the whole stream's time."""
        if handler is not None:
            return _one(self.invoke(model, version, handler, call))
        if is_handler_model(self._dataplane, model, version):
            return self._handler_parts(model, version, call)
        return self._model_parts(model, version, call)

    async def _model_parts(self, model: str, version: str, call: Call) -> AsyncGenerator[Answer, None]:
        async for body, content_type in model_parts(self._dataplane, model, version, call.body, call.content_type,
                                                    call.accept, self._default_accept):
            yield Answer(body, content_type)

    async def _handler_parts(self, model: str, version: str, call: Call) -> AsyncGenerator[Answer, None]:
        partials = PartialAnswers(self._dataplane.limits.max_output_bytes)
        request = _handler_request(call, partials)
        request.model_name, request.model_version = model, version
        async for answer in handler_parts(self._dataplane, request, partials):
            yield self._handler_answer(answer, call)

    def _handler_answer(self, answer: HandlerResponse, call: Call) -> Answer:
        """A handler model's answer: its body and content type (Accept's, or the default, where it set none), and
        the custom attributes it set; a failed one is the handler's status and message."""
        if answer.error or answer.status >= 400:
            raise HandlerError(answer.status, answer.body.decode("utf-8", "replace"))
        accept = call.accept if call.accept and media_type(call.accept) != "*/*" else self._default_accept
        return Answer(answer.body, answer.content_type or accept, _custom_attributes(answer.headers))

    async def _within_timeout(self, work: Awaitable[T]) -> T:
        try:
            return await asyncio.wait_for(work, self._timeout)
        except asyncio.TimeoutError:
            raise ModelhostError(
                ErrorKind.TIMEOUT, f"the invocation did not finish within {self._timeout:g} s (model server timeout)"
            ) from None

    def handle(self, model: str, version: str) -> ServedModelHandle:
        """The served model for user code (on the loop): what predict_fn gets as `model` without a model_fn."""
        return ServedModelHandle(asyncio.get_running_loop(), self._dataplane, model, version)

    def _run_handler(self, handler: Handler, handle: ServedModelHandle, call: Call) -> Answer:
        accept = call.accept if call.accept and media_type(call.accept) != "*/*" else self._default_accept
        version = handle.version
        info = RequestInfo(
            body=call.body,
            content_type=call.content_type or JSON,  # as sent: handlers compare it with "application/X-protobuf"
            accept=accept,
            custom_attributes=call.custom_attributes,
            model_name=handle.name,
            model_version=version,
            rest_uri=f"{self._rest_base}/v1/models/{handle.name}{f'/versions/{version}' if version else ''}:predict",
            grpc_port=self._grpc_port,
            channel=self._grpc_channel(),
        )
        body, content_type = handler.invoke(info, ServedDefaults(handle))
        return Answer(body, content_type, _custom_attributes(info.response_headers))

    def _grpc_channel(self) -> grpc.Channel | None:
        """One channel to this server's gRPC port for every handler call, as the TF Serving container keeps one."""
        if self._grpc_port is None:
            return None
        with self._channel_lock:
            if self._channel is None:
                self._channel = grpc.insecure_channel(f"127.0.0.1:{self._grpc_port}")
            return self._channel

    def close(self) -> None:
        if self._channel is not None:
            self._channel.close()


async def _one(answer: Awaitable[Answer]) -> AsyncGenerator[Answer, None]:
    yield await answer


def _custom_attributes(headers: Mapping[str, str]) -> str:
    """The response custom attributes among headers user code set (names compared case-insensitively)."""
    for name, value in headers.items():
        if name.lower() == CUSTOM_ATTRIBUTES_HEADER:
            return str(value)
    return ""


def _handler_request(call: Call, partials: PartialAnswers | None = None) -> InferRequest:
    """The invocation for a handler model: its body, content type, Accept and custom attributes, as sent."""
    headers = {"Content-Type": call.content_type or "", "Accept": call.accept or ""}
    if call.custom_attributes:
        headers["X-Amzn-SageMaker-Custom-Attributes"] = call.custom_attributes
    requests = np.empty(1, dtype=object)
    requests[0] = HandlerRequest({"body": (media_type(call.content_type or ""), call.body)},
                                 {k: v for k, v in headers.items() if v}, str(uuid.uuid4()), partials)
    return InferRequest("", {HANDLER_INPUT: requests}, signature=HANDLER_SIGNATURE)


class ServedModelHandle:
    """A served model for user code in a worker thread: `model(data)` or `model.predict(data)` runs it.

    `data` is one array (for a model with one input) or a dict of arrays by input name; the result is
    one array (one output) or a dict by output name.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, dataplane: DataPlane, name: str, version: str) -> None:
        self._loop = loop
        self._dataplane = dataplane
        self.name = name
        self.version = version
        self.inputs = dataplane.metadata(name, version).inputs

    def __call__(self, data: Any) -> Any:
        return self._run(self._infer(data))

    predict = __call__

    def tfs_predict(self, body: bytes) -> TfsResponse:
        """What TF Serving's REST predict would answer this body, without the HTTP round trip."""
        try:
            answer = self._run(TfServing(self._dataplane).predict_json(self.name, self.version, "", body))
        except ModelhostError as exc:
            return TfsResponse(STATUS[exc.kind], orjson.dumps({"error": public_message(exc.message)}), JSON)
        return TfsResponse(200, answer, JSON)

    def _run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result()

    async def _infer(self, data: Any) -> Any:
        inputs = _named_inputs(data, self.inputs)
        response = await self._dataplane.infer(InferRequest(self.name, inputs, self.version))
        outputs = response.outputs
        return next(iter(outputs.values())) if len(outputs) == 1 else outputs


def _named_inputs(data: Any, specs: tuple[TensorSpec, ...]) -> dict[str, np.ndarray]:
    if not isinstance(data, dict):
        if len(specs) != 1:
            names = ", ".join(s.name for s in specs)
            raise invalid(f"the model has {len(specs)} inputs ({names}): give predict a dict of arrays by input name")
        data = {specs[0].name: data}
    by_name = {s.name: s for s in specs}
    arrays = {}
    for name, value in data.items():
        spec = by_name.get(name)
        if spec is None:
            raise invalid(f"unexpected input '{name}'; the model's inputs are {', '.join(by_name)}")
        array = np.asarray(value)
        dtype = DATATYPE_DTYPES[spec.datatype]
        if array.dtype != dtype and not np.can_cast(array.dtype, dtype, casting="same_kind"):
            raise invalid(f"input '{name}': {array.dtype} data cannot become the model's {spec.datatype}")
        arrays[name] = array.astype(dtype, copy=False)
    return arrays


class ServedDefaults:
    """What modelhost does for the inference.py functions a user leaves out (toolkit semantics)."""

    def __init__(self, handle: ServedModelHandle) -> None:
        self._handle = handle

    def decode(self, body: bytes, content_type: str) -> Any:
        inputs = decode_invocation(body, content_type, self._handle.inputs).request.inputs
        return next(iter(inputs.values())) if len(inputs) == 1 else inputs

    def predict(self, data: Any, model: Any) -> Any:
        if callable(getattr(model, "predict", None)):
            return model.predict(data)
        if callable(model):
            return model(data)
        raise HandlerError(500, f"predict_fn (default) failed: model_fn returned a {type(model).__name__}, "
                                "which is neither callable nor has predict()")

    def encode(self, prediction: Any, accept: str) -> tuple[bytes, str]:
        kind = media_type(accept)
        if kind == JSON:
            return orjson.dumps(prediction, option=orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS), JSON
        if kind == CSV:
            out = io.StringIO()
            np.savetxt(out, np.atleast_2d(np.asarray(prediction)), delimiter=",", fmt="%s")
            return out.getvalue().encode(), CSV
        if kind == NPY:
            buffer = io.BytesIO()
            np.save(buffer, np.asarray(prediction), allow_pickle=False)
            return buffer.getvalue(), NPY
        raise MediaTypeError(406, f"Accept '{accept}' is not supported by the default output_fn; "
                                  f"supported: {JSON}, {CSV}, {NPY}")

    def tfs_predict(self, body: bytes) -> TfsResponse:
        return self._handle.tfs_predict(body)
