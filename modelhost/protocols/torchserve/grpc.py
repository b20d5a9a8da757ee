"""TorchServe's gRPC APIs (tsfs §A4), each on its own port: `InferenceAPIsService` (Ping, Predictions,
StreamPredictions, StreamPredictions2) on the inference port (7070) and `ManagementAPIsService` on the management
port (7071), over modelhost's own messages (inference.proto, management.proto) with TorchServe's field numbers.

A request's `input` map is the handler's parameters (bytes, no content type). Status codes are TorchServe's: an
unknown model, a missing name or a model without workers is INTERNAL on Predictions; a handler's HTTP status maps
to its gRPC code (400 INVALID_ARGUMENT, 404 NOT_FOUND, 503 UNAVAILABLE, other 5xx INTERNAL, ...); management errors
are NOT_FOUND, INVALID_ARGUMENT, or PERMISSION_DENIED for a disabled model API. With token authorization a call
sends `authorization: Bearer <key>` in its metadata (PERMISSION_DENIED without the right key).
"""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

import grpc
from google.protobuf import empty_pb2

from modelhost.access import Api
from modelhost.errors import ModelhostError
from modelhost.handler_messages import HandlerRequest, HandlerResponse
from modelhost.protocols.grpc_handlers import STATUS as KIND_CODES
from modelhost.protocols.grpc_service import Guard, RpcError, ServerStream, Service, Stream, Unary
from modelhost.protocols.torchserve import inference_pb2 as ipb
from modelhost.protocols.torchserve import management_pb2 as mpb
from modelhost.protocols.torchserve.errors import TorchServeError
from modelhost.protocols.torchserve.management import Answer, ManagementApi
from modelhost.protocols.torchserve.serving import TorchServing, new_request_id
from modelhost.protocols.torchserve.tokens import FAILED, INFERENCE, MANAGEMENT, TokenKeys

INFERENCE_SERVICE = "org.pytorch.serve.grpc.inference.InferenceAPIsService"
MANAGEMENT_SERVICE = "org.pytorch.serve.grpc.management.ManagementAPIsService"
_HTTP_CODES = {
    400: grpc.StatusCode.INVALID_ARGUMENT, 401: grpc.StatusCode.UNAUTHENTICATED,
    403: grpc.StatusCode.PERMISSION_DENIED, 404: grpc.StatusCode.NOT_FOUND, 409: grpc.StatusCode.ABORTED,
    413: grpc.StatusCode.RESOURCE_EXHAUSTED, 429: grpc.StatusCode.RESOURCE_EXHAUSTED,
    416: grpc.StatusCode.OUT_OF_RANGE, 499: grpc.StatusCode.CANCELLED, 501: grpc.StatusCode.UNIMPLEMENTED,
    503: grpc.StatusCode.UNAVAILABLE, 504: grpc.StatusCode.DEADLINE_EXCEEDED,
}


def http_code(status: int) -> grpc.StatusCode:
    """TorchServe's gRPC code for an HTTP status."""
    if status in _HTTP_CODES:
        return _HTTP_CODES[status]
    return grpc.StatusCode.FAILED_PRECONDITION if 400 <= status < 500 else grpc.StatusCode.INTERNAL


def inference_service(serving: TorchServing, tokens: TokenKeys | None) -> Service:
    async def ping(request: empty_pb2.Empty) -> ipb.TorchServeHealthResponse:
        healthy = serving.healthy()
        return ipb.TorchServeHealthResponse(health=json.dumps({"status": "Healthy" if healthy else "Unhealthy"},
                                                              indent=2) + "\n")

    async def predictions(request: ipb.PredictionsRequest) -> ipb.PredictionResponse:
        return _prediction(await _predict(serving, request))

    async def stream_predictions(request: ipb.PredictionsRequest) -> AsyncIterator[ipb.PredictionResponse]:
        answers = _answers(serving, request)
        try:
            async for answer, _ in answers:
                yield _prediction(answer)
        finally:
            await answers.aclose()

    async def stream_predictions2(request: ipb.PredictionsRequest) -> AsyncIterator[ipb.PredictionResponse]:
        try:
            async for response in stream_predictions(request):
                if request.HasField("sequence_id"):
                    response.sequence_id = request.sequence_id
                yield response
        except RpcError as exc:
            yield _failed(request, exc.code, exc.message)

    def stream_error(request: ipb.PredictionsRequest, exc: ModelhostError) -> ipb.PredictionResponse:
        return _failed(request, KIND_CODES[exc.kind], exc.message)

    return Service(INFERENCE_SERVICE, [
        Unary("Ping", empty_pb2.Empty, ping, Api.HEALTH),
        Unary("Predictions", ipb.PredictionsRequest, predictions, Api.INFERENCE),
        ServerStream("StreamPredictions", ipb.PredictionsRequest, stream_predictions, Api.INFERENCE),
        Stream("StreamPredictions2", ipb.PredictionsRequest, predictions, stream_error, Api.INFERENCE,
               in_order=True, answers=stream_predictions2),
    ], _guard(tokens, INFERENCE))


def management_service(serving: TorchServing, tokens: TokenKeys | None) -> Service:
    api = ManagementApi(serving)

    async def describe(request: mpb.DescribeModelRequest) -> mpb.ManagementResponse:
        return await _managed(api.describe(request.model_name, request.model_version or None, request.customized))

    async def list_models(request: mpb.ListModelsRequest) -> mpb.ManagementResponse:
        return await _managed(api.list_models({"limit": str(request.limit),
                                               "next_page_token": str(request.next_page_token)}))

    async def register(request: mpb.RegisterModelRequest) -> mpb.ManagementResponse:
        params = {"url": request.url, "model_name": request.model_name, "handler": request.handler,
                  "synchronous": "true" if request.synchronous else "false"}
        for field in ("batch_size", "max_batch_delay", "response_timeout", "startup_timeout"):
            if getattr(request, field):
                params[field] = str(getattr(request, field))
        if request.initial_workers:
            params["initial_workers"] = str(request.initial_workers)
        return await _managed(api.register(params))

    async def scale(request: mpb.ScaleWorkerRequest) -> mpb.ManagementResponse:
        params = {"min_worker": str(request.min_worker), "synchronous": "true" if request.synchronous else "false"}
        if request.max_worker:
            params["max_worker"] = str(request.max_worker)
        return await _managed(api.scale(request.model_name, request.model_version or None, params))

    async def set_default(request: mpb.SetDefaultRequest) -> mpb.ManagementResponse:
        return await _managed(api.set_default(request.model_name, request.model_version))

    async def unregister(request: mpb.UnregisterModelRequest) -> mpb.ManagementResponse:
        return await _managed(api.unregister(request.model_name, request.model_version or None))

    return Service(MANAGEMENT_SERVICE, [
        Unary("DescribeModel", mpb.DescribeModelRequest, describe, Api.MODEL_REPOSITORY),
        Unary("ListModels", mpb.ListModelsRequest, list_models, Api.MODEL_REPOSITORY),
        Unary("RegisterModel", mpb.RegisterModelRequest, register, Api.MODEL_REPOSITORY),
        Unary("ScaleWorker", mpb.ScaleWorkerRequest, scale, Api.MODEL_REPOSITORY),
        Unary("SetDefault", mpb.SetDefaultRequest, set_default, Api.MODEL_REPOSITORY),
        Unary("UnregisterModel", mpb.UnregisterModelRequest, unregister, Api.MODEL_REPOSITORY),
    ], _guard(tokens, MANAGEMENT))


async def _predict(serving: TorchServing, request: ipb.PredictionsRequest) -> HandlerResponse:
    try:
        return await serving.predict(request.model_name, request.model_version or None, _handler_request(request))
    except TorchServeError as exc:
        raise RpcError(grpc.StatusCode.INTERNAL, exc.message) from None


async def _answers(serving: TorchServing,
                   request: ipb.PredictionsRequest) -> AsyncGenerator[tuple[HandlerResponse, bool], None]:
    """The handler's answers as they come (tsfs §A1.6): intermediate ones, then the final."""
    answers = serving.answers(request.model_name, request.model_version or None, _handler_request(request))
    try:
        async for answer in answers:
            yield answer
    except TorchServeError as exc:
        raise RpcError(grpc.StatusCode.INTERNAL, exc.message) from None
    finally:
        await answers.aclose()


def _handler_request(request: ipb.PredictionsRequest) -> HandlerRequest:
    if not request.model_name:
        raise RpcError(grpc.StatusCode.INTERNAL, "Parameter model_name is required.")
    parameters = {name: ("", bytes(value)) for name, value in request.input.items()}
    return HandlerRequest(parameters, {"url_path": "", "explain": "False"}, new_request_id())


def _prediction(answer: HandlerResponse) -> ipb.PredictionResponse:
    if answer.error or answer.status >= 400:
        raise RpcError(http_code(answer.status), answer.body.decode("utf-8", "replace"))
    return ipb.PredictionResponse(prediction=answer.body)


async def _managed(operation: Any) -> mpb.ManagementResponse:
    try:
        answer: Answer = await operation
    except TorchServeError as exc:
        code = (grpc.StatusCode.PERMISSION_DENIED if exc.status == 405 else grpc.StatusCode.NOT_FOUND
                if exc.status == 404 else http_code(exc.status))
        raise RpcError(code, exc.message) from None
    return mpb.ManagementResponse(msg=json.dumps(answer[1], indent=2) + "\n")


def _failed(request: ipb.PredictionsRequest, code: grpc.StatusCode, message: str) -> ipb.PredictionResponse:
    response = ipb.PredictionResponse(status=ipb.Status(code=code.value[0], message=message))
    if request.HasField("sequence_id"):
        response.sequence_id = request.sequence_id
    return response


def _guard(tokens: TokenKeys | None, kind: str) -> Guard | None:
    if tokens is None:
        return None

    def check(metadata: dict[str, str]) -> RpcError | None:
        if tokens.allows(kind, metadata.get("authorization")):
            return None
        return RpcError(grpc.StatusCode.PERMISSION_DENIED, FAILED)
    return check
