"""KServe V2 / Triton gRPC and TF Serving gRPC through Ray Serve's gRPC proxy: their unary RPCs.

Ray's gRPC proxy serves the services whose `add_..._to_server` functions its config names
(`add_inference_service_to_server` and `add_tfserving_services_to_server` here), and calls the ingress
deployment's method of each RPC's name with the request. The request stays bytes (no deserializer: Ray passes
what the client sent); the ingress reads the model it names, forwards the bytes to a replica holding that model,
and the replica runs the RPC as modelhost's own gRPC server does (grpc_handlers.unary_behavior: access control,
parsing, the call, its status). The status and trailers come back through Ray's gRPC context. Streaming RPCs
(ModelStreamInfer) are not forwarded.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import grpc

from modelhost.protocols.grpc_handlers import unary_behavior
from modelhost.protocols.grpc_service import Unary
from modelhost.protocols.kserve_v2 import grpc as kserve_v2_grpc
from modelhost.protocols.kserve_v2 import grpc_service_pb2 as pb
from modelhost.protocols.tfserving import apis_pb2, predict_pb2
from modelhost.protocols.tfserving import grpc as tfserving_grpc
from modelhost.ray_serve.request_sequence import SEQUENCE_KWARG, grpc_sequence


@dataclass(frozen=True, slots=True)
class _Rpc:
    """An RPC's request, where it names its model (None: it names none), and whether the model must be loaded
    before the call."""

    request: Any
    model: Callable[[Any], str] | None = None
    loads: bool = False


def _named(field: str) -> Callable[[Any], str]:
    return lambda request: str(getattr(request, field))


def _spec(request: Any) -> str:
    return str(request.model_spec.name)


def _first_task(request: Any) -> str:
    return str(request.tasks[0].model_spec.name) if request.tasks else ""


# Each service's RPCs by name; the names are unique across services (Ray's proxy calls the ingress's method of
# the RPC's name).
SERVICES: dict[str, dict[str, _Rpc]] = {
    kserve_v2_grpc.SERVICE_NAME: {
        "ServerLive": _Rpc(pb.ServerLiveRequest),
        "ServerReady": _Rpc(pb.ServerReadyRequest),
        "ServerMetadata": _Rpc(pb.ServerMetadataRequest),
        "RepositoryIndex": _Rpc(pb.RepositoryIndexRequest),
        "ModelReady": _Rpc(pb.ModelReadyRequest, _named("name"), True),
        "ModelMetadata": _Rpc(pb.ModelMetadataRequest, _named("name"), True),
        "ModelConfig": _Rpc(pb.ModelConfigRequest, _named("name"), True),
        "ModelInfer": _Rpc(pb.ModelInferRequest, _named("model_name"), True),
        "ModelStatistics": _Rpc(pb.ModelStatisticsRequest, _named("name")),
        "RepositoryModelLoad": _Rpc(pb.RepositoryModelLoadRequest, _named("model_name")),
        "RepositoryModelUnload": _Rpc(pb.RepositoryModelUnloadRequest, _named("model_name")),
    },
    tfserving_grpc.PREDICTION_SERVICE: {
        "Predict": _Rpc(predict_pb2.PredictRequest, _spec, True),
        "Classify": _Rpc(apis_pb2.ClassificationRequest, _spec, True),
        "Regress": _Rpc(apis_pb2.RegressionRequest, _spec, True),
        "MultiInference": _Rpc(apis_pb2.MultiInferenceRequest, _first_task, True),
        "GetModelMetadata": _Rpc(apis_pb2.GetModelMetadataRequest, _spec, True),
    },
    tfserving_grpc.MODEL_SERVICE: {
        "GetModelStatus": _Rpc(apis_pb2.GetModelStatusRequest, _spec, True),
        "HandleReloadConfigRequest": _Rpc(apis_pb2.ReloadConfigRequest),  # refused by the replica, as by `serve`
    },
}
RPCS: dict[str, _Rpc] = {name: rpc for rpcs in SERVICES.values() for name, rpc in rpcs.items()}
SERVICER_FUNCTIONS = ("modelhost.ray_serve.grpc_forwarding.add_inference_service_to_server",
                      "modelhost.ray_serve.grpc_forwarding.add_tfserving_services_to_server")


def add_inference_service_to_server(servicer: Any, server: Any) -> None:
    """What Ray's gRPC proxy calls to learn the service (as generated `add_*Servicer_to_server` functions do)."""
    _add_services(servicer, server, kserve_v2_grpc.SERVICE_NAME)


def add_tfserving_services_to_server(servicer: Any, server: Any) -> None:
    """TF Serving's PredictionService and ModelService, as the function above."""
    _add_services(servicer, server, tfserving_grpc.PREDICTION_SERVICE, tfserving_grpc.MODEL_SERVICE)


def _add_services(servicer: Any, server: Any, *names: str) -> None:
    for name in names:
        handlers = {rpc: grpc.unary_unary_rpc_method_handler(getattr(servicer, rpc)) for rpc in SERVICES[name]}
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(name, handlers),))


@dataclass(frozen=True, slots=True)
class RpcModel:
    """The model an RPC's request names ("" for none, or a request that does not parse: the replica answers that),
    whether it must be loaded before the call, and the sequence an inference continues ("" for none)."""

    name: str = ""
    loads: bool = False
    sequence: str = ""


def model_of(method: str, data: bytes) -> RpcModel:
    rpc = RPCS[method]
    if rpc.model is None:
        return RpcModel()
    try:
        request = rpc.request.FromString(data)
    except Exception:
        return RpcModel()
    name = rpc.model(request)
    sequence = grpc_sequence(request) if isinstance(request, pb.ModelInferRequest) else ""
    return RpcModel(name, rpc.loads and bool(name), sequence)


class RawMessage(bytes):
    """A serialized response, which Ray serializes once more by calling this."""

    def SerializeToString(self) -> bytes:  # noqa: N802 - protobuf's name, which Ray calls
        return bytes(self)


@dataclass(slots=True)
class GrpcAnswer:
    body: bytes = b""
    code: str = "OK"  # a grpc.StatusCode name
    details: str = ""
    trailers: list[tuple[str, str]] = field(default_factory=list)


class _Aborted(Exception):
    def __init__(self, answer: GrpcAnswer) -> None:
        self.answer = answer


class _ForwardedContext:
    """What unary_behavior reads of a call's context: its metadata, and `abort`."""

    def __init__(self, metadata: list[tuple[str, str]]) -> None:
        self._metadata = metadata

    def invocation_metadata(self) -> list[tuple[str, str]]:
        return self._metadata

    async def abort(self, code: grpc.StatusCode, details: str = "", trailing_metadata: Any = ()) -> None:
        raise _Aborted(GrpcAnswer(b"", code.name, details, [tuple(pair) for pair in trailing_metadata]))


class ReplicaRpcs:
    """A replica's side: the V2 service's unary RPCs, run on forwarded bytes."""

    def __init__(self, server: Any) -> None:
        services = [kserve_v2_grpc.service(server.dataplane, server.control),
                    *tfserving_grpc.services(server.tfserving)]
        limit = server.settings.grpc_max_message_bytes
        self._calls = {rpc.name: unary_behavior(rpc, server.in_flight, limit, server.grpc_access)
                       for service in services for rpc in service.rpcs if isinstance(rpc, Unary) and rpc.name in RPCS}

    async def answer(self, method: str, data: bytes, metadata: list[tuple[str, str]]) -> GrpcAnswer:
        call = self._calls.get(method)
        if call is None:
            return GrpcAnswer(code="UNIMPLEMENTED", details=f"{method} is not served through Ray Serve")
        try:
            return GrpcAnswer(await call(data, _ForwardedContext(metadata)))
        except _Aborted as aborted:
            return aborted.answer


class IngressRpcs:
    """The ingress deployment's side: one method per RPC (Ray's gRPC proxy calls them by name), each forwarding
    to a replica holding the model its request names."""

    _replicas: Any
    _affinity: bool

    async def _forward(self, method: str, data: bytes, grpc_context: Any) -> RawMessage:
        from modelhost.ray_serve.ingress import ray_failure

        named = model_of(method, data)
        affine = bool(named.name) and self._affinity
        handle = self._replicas.options(multiplexed_model_id=named.name) if affine else self._replicas
        metadata = [(k, v) for k, v in (grpc_context.invocation_metadata() if grpc_context is not None else ())]
        routing = {SEQUENCE_KWARG: named.sequence} if named.sequence and affine else {}
        try:
            answer: GrpcAnswer = await handle.grpc_call.remote(method, data, metadata,
                                                               named.name if named.loads else None, **routing)
        except Exception as exc:
            message = ray_failure(exc)
            if message is None:
                raise
            answer = GrpcAnswer(code="UNAVAILABLE", details=message, trailers=[("retry-after", "1")])
        if answer.code != "OK" and grpc_context is not None:
            grpc_context.set_code(grpc.StatusCode[answer.code])
            grpc_context.set_details(answer.details)
            if answer.trailers:
                grpc_context.set_trailing_metadata(answer.trailers)
        return RawMessage(answer.body)


def _rpc_method(method: str) -> Any:
    async def call(self: IngressRpcs, request: bytes, grpc_context: Any = None) -> RawMessage:
        return await self._forward(method, request, grpc_context)

    call.__name__ = method
    return call


for _method in RPCS:
    setattr(IngressRpcs, _method, _rpc_method(_method))
