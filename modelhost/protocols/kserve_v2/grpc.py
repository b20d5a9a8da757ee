"""KServe V2 and Triton RPCs of `inference.GRPCInferenceService`: parse, call the core once, encode.

The gRPC twin of rest.py. Messages are grpc_codec's (package modelhost.kserve_v2); the method paths
are Triton's, /inference.GRPCInferenceService/<Rpc>, because the service is registered by that name.
Errors are ModelhostErrors that grpc_server maps to status codes; inside ModelStreamInfer a failed
request is answered with `error_message` (and its `id`) while the stream goes on, as Triton does; a decoupled
model's request is answered by each response it sends (decoupled_answers).
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import aclosing
from typing import Any

from modelhost.access import Api
from modelhost.core.control import Control
from modelhost.core.dataplane import DataPlane
from modelhost.core.decoupled import Response
from modelhost.core.trace import GRPC_SEND_END, GRPC_SEND_START
from modelhost.errors import ModelhostError
from modelhost.protocols.grpc_service import Service, Stream, Unary
from modelhost.protocols.header_forwarding import HeaderForwarding
from modelhost.protocols.kserve_v2 import grpc_service_pb2 as pb
from modelhost.protocols.kserve_v2 import shm_grpc
from modelhost.protocols.kserve_v2.grpc_codec import (
    config_to_proto,
    decode_infer_request,
    encode_infer_response,
    index_to_proto,
    load_request_from_proto,
    metadata_to_proto,
    statistics_to_proto,
    unload_dependents_from_proto,
)
from modelhost.protocols.kserve_v2.repository_codec import no_repository
from modelhost.protocols.kserve_v2.shm_tensors import write_outputs
from modelhost.protocols.kserve_v2.trace_setting import trace_rpc
from modelhost.types import InferRequest, InferResponse

SERVICE_NAME = "inference.GRPCInferenceService"
EMPTY_FINAL_PARAMETER = "triton_enable_empty_final_response"
FINAL_PARAMETER = "triton_final_response"
EMBEDDING_SERVICE_NAME = "modelhost.EmbeddingService"


def service(dataplane: DataPlane, control: Control, forwarding: HeaderForwarding | None = None) -> Service:
    """`forwarding`: the metadata to hand the model as request parameters (--grpc-header-forward-pattern)."""
    tracer = dataplane.tracer
    forwarded = forwarding if forwarding is not None and forwarding.active else None

    async def server_live(request: pb.ServerLiveRequest) -> pb.ServerLiveResponse:
        return pb.ServerLiveResponse(live=dataplane.live())

    async def server_ready(request: pb.ServerReadyRequest) -> pb.ServerReadyResponse:
        return pb.ServerReadyResponse(ready=dataplane.ready())

    async def model_ready(request: pb.ModelReadyRequest) -> pb.ModelReadyResponse:
        return pb.ModelReadyResponse(ready=dataplane.model_ready(request.name, request.version))

    async def server_metadata(request: pb.ServerMetadataRequest) -> pb.ServerMetadataResponse:
        return pb.ServerMetadataResponse(**dataplane.server_metadata())

    async def model_metadata(request: pb.ModelMetadataRequest) -> pb.ModelMetadataResponse:
        return metadata_to_proto(dataplane.metadata(request.name, request.version))

    async def model_infer(request: pb.ModelInferRequest, context: Any = None) -> pb.ModelInferResponse:
        trace = tracer.begin_grpc(request.model_name, context) if tracer.active else None
        infer_request = decode_infer_request(request, dataplane.limits, dataplane.shared_memory)
        infer_request.trace = trace
        if forwarded is not None and context is not None:
            infer_request.parameters.update(forwarded.parameters(_metadata(context)))
        response = await dataplane.infer(infer_request)
        placed = write_outputs(dataplane.shared_memory, response, infer_request) if infer_request.outputs else ()
        answer = encode_infer_response(response, infer_request, placed)
        if trace is not None:
            trace.stamp(GRPC_SEND_START)
            tracer.finish(trace, GRPC_SEND_END)  # grpc writes the answer after this returns: not seen here
        return answer

    async def stream_answer(
        request: pb.ModelInferRequest, context: Any = None,
    ) -> pb.ModelStreamInferResponse | AsyncIterator[pb.ModelStreamInferResponse]:
        infer_request = decode_infer_request(request, dataplane.limits)
        if forwarded is not None and context is not None:
            infer_request.parameters.update(forwarded.parameters(_metadata(context)))
        # The stream's own setting, as Triton keeps it: the one 'triton_' parameter a client may send.
        flagged = infer_request.parameters.pop(EMPTY_FINAL_PARAMETER, None) is True
        answer = await dataplane.infer_or_stream(infer_request)
        if isinstance(answer, InferResponse):
            return pb.ModelStreamInferResponse(infer_response=encode_infer_response(answer, infer_request))
        return decoupled_answers(answer, request, infer_request, flagged)

    async def model_config(request: pb.ModelConfigRequest) -> pb.ModelConfigResponse:
        return config_to_proto(dataplane.model_config(request.name, request.version))

    async def model_statistics(request: pb.ModelStatisticsRequest) -> pb.ModelStatisticsResponse:
        return statistics_to_proto(await dataplane.statistics(request.name, request.version))

    async def repository_index(request: pb.RepositoryIndexRequest) -> pb.RepositoryIndexResponse:
        no_repository(request.repository_name, "index")
        return index_to_proto(await control.index(request.ready))

    async def load(request: pb.RepositoryModelLoadRequest) -> pb.RepositoryModelLoadResponse:
        await control.load(request.model_name, load_request_from_proto(request))
        return pb.RepositoryModelLoadResponse()

    async def unload(request: pb.RepositoryModelUnloadRequest) -> pb.RepositoryModelUnloadResponse:
        await control.unload(request.model_name, unload_dependents_from_proto(request))
        return pb.RepositoryModelUnloadResponse()

    return Service(SERVICE_NAME, [
        Unary("ServerLive", pb.ServerLiveRequest, server_live, Api.HEALTH),
        Unary("ServerReady", pb.ServerReadyRequest, server_ready, Api.HEALTH),
        Unary("ModelReady", pb.ModelReadyRequest, model_ready, Api.HEALTH),
        Unary("ServerMetadata", pb.ServerMetadataRequest, server_metadata, Api.METADATA),
        Unary("ModelMetadata", pb.ModelMetadataRequest, model_metadata, Api.METADATA),
        Unary("ModelInfer", pb.ModelInferRequest, model_infer, Api.INFERENCE, with_context=True),
        Stream("ModelStreamInfer", pb.ModelInferRequest, stream_answer, _stream_error, Api.INFERENCE,
               with_context=forwarded is not None),
        Unary("ModelConfig", pb.ModelConfigRequest, model_config, Api.MODEL_CONFIG),
        Unary("ModelStatistics", pb.ModelStatisticsRequest, model_statistics, Api.STATISTICS),
        Unary("RepositoryIndex", pb.RepositoryIndexRequest, repository_index, Api.MODEL_REPOSITORY),
        Unary("RepositoryModelLoad", pb.RepositoryModelLoadRequest, load, Api.MODEL_REPOSITORY),
        Unary("RepositoryModelUnload", pb.RepositoryModelUnloadRequest, unload, Api.MODEL_REPOSITORY),
        trace_rpc(dataplane),
        *shm_grpc.rpcs(dataplane.shared_memory),
    ])


def _metadata(context: Any) -> list[tuple[str, str]]:
    """A call's text metadata (binary `-bin` entries are not headers to forward)."""
    return [(key, value) for key, value in context.invocation_metadata() or () if isinstance(value, str)]


def _stream_error(request: pb.ModelInferRequest, error: ModelhostError) -> pb.ModelStreamInferResponse:
    # The id tells the client which of its requests failed (tritonclient reads only error_message).
    answer = pb.ModelInferResponse(model_name=request.model_name, model_version=request.model_version, id=request.id)
    return pb.ModelStreamInferResponse(error_message=error.message, infer_response=answer)


async def decoupled_answers(responses: AsyncGenerator[Response, None], request: pb.ModelInferRequest,
                            infer_request: InferRequest, flagged: bool) -> AsyncIterator[pb.ModelStreamInferResponse]:
    """A decoupled model's responses, as Triton streams them: an empty final response (the model's
    TRITONSERVER_RESPONSE_COMPLETE_FINAL with no outputs) only when the request's parameter
    `triton_enable_empty_final_response` asks for it (`flagged`), and then every response says whether it is the
    last in its parameter `triton_final_response`."""
    async with aclosing(responses):  # closed at once when the client leaves: the model sees it cancelled
        async for response, final in responses:
            if isinstance(response, ModelhostError):
                yield _stream_error(request, response)
                continue
            if final and not response.outputs and not flagged:
                continue
            message = encode_infer_response(response, infer_request)
            if flagged:
                message.parameters[FINAL_PARAMETER].bool_param = final
            yield pb.ModelStreamInferResponse(infer_response=message)


def embedding_service(dataplane: DataPlane) -> Service:
    """`/modelhost.EmbeddingService/Update`: rows of an embedding model's table, as the HTTP route takes them
    (a ModelInferRequest with inputs ids and vectors), durable when answered."""

    async def update(request: pb.ModelInferRequest) -> pb.EmbeddingUpdateResponse:
        version, rows, added = await dataplane.update_rows(decode_infer_request(request, dataplane.limits))
        return pb.EmbeddingUpdateResponse(model_name=request.model_name, model_version=version, rows=rows,
                                          new_rows=added)

    return Service(EMBEDDING_SERVICE_NAME, [Unary("Update", pb.ModelInferRequest, update, Api.MODEL_REPOSITORY)])
