"""The V2 gRPC API (`inference.GRPCInferenceService`) as messages to send and answers to read, with no I/O:
what the blocking and the asyncio gRPC transports share."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import grpc
import numpy as np
from google.protobuf import json_format
from google.protobuf.message import Message

from modelhost.client.errors import ClientError, DeadlineExceeded, retry_after_seconds
from modelhost.errors import ModelhostError
from modelhost.protocols.kserve_v2 import grpc_service_pb2 as pb
from modelhost.protocols.kserve_v2.codec import tensor_from_bytes, tensor_view
from modelhost.protocols.kserve_v2.grpc_codec import parameters_to_proto
from modelhost.types import datatype_of

SERVICE = "/inference.GRPCInferenceService/"
# Unary methods: name -> (request class, response class); ModelInfer's requests come serialized.
METHODS: dict[str, tuple[type[Message], type[Message]]] = {
    "ModelConfig": (pb.ModelConfigRequest, pb.ModelConfigResponse),
    "ModelMetadata": (pb.ModelMetadataRequest, pb.ModelMetadataResponse),
    "ModelStatistics": (pb.ModelStatisticsRequest, pb.ModelStatisticsResponse),
    "ServerReady": (pb.ServerReadyRequest, pb.ServerReadyResponse),
    "ServerLive": (pb.ServerLiveRequest, pb.ServerLiveResponse),
    "ModelReady": (pb.ModelReadyRequest, pb.ModelReadyResponse),
    "RepositoryModelLoad": (pb.RepositoryModelLoadRequest, pb.RepositoryModelLoadResponse),
    "RepositoryModelUnload": (pb.RepositoryModelUnloadRequest, pb.RepositoryModelUnloadResponse),
}
# No message size cap on the client: the server bounds what it accepts and sends.
CHANNEL_OPTIONS = [("grpc.max_send_message_length", -1), ("grpc.max_receive_message_length", -1)]


def infer_request(
    model: str, version: str, inputs: Mapping[str, np.ndarray], outputs: Sequence[str] | None,
    parameters: Mapping[str, Any], request_id: str,
) -> bytes:
    """A serialized ModelInferRequest. Protobuf encodes everything but the tensors' bytes, which are appended
    as raw_input_contents fields (a message's fields may follow one another in any order): the data is
    copied once, where building the message and serializing it would copy it three times."""
    message = pb.ModelInferRequest(model_name=model, model_version=version, id=request_id)
    try:
        parameters_to_proto(parameters, message.parameters)
    except ModelhostError as exc:
        raise ClientError(0, exc.message) from None
    for name, array in inputs.items():
        message.inputs.add(name=name, datatype=datatype_of(array), shape=array.shape)
    for name in outputs or ():
        message.outputs.add(name=name)
    parts: list[bytes | memoryview] = [message.SerializeToString()]
    for array in inputs.values():
        data = tensor_view(array)
        parts += (_RAW_INPUT_TAG, _varint(data.nbytes), data)
    return b"".join(parts)


_RAW_INPUT_TAG = bytes([pb.ModelInferRequest.RAW_INPUT_CONTENTS_FIELD_NUMBER << 3 | 2])  # length-delimited


def _varint(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def methods(channel: Any) -> dict[str, Any]:
    """The channel's callables for every method (grpc.Channel or grpc.aio.Channel)."""
    # Registered methods (as grpcio-tools' generated stubs ask for them) save the core a lookup per call.
    calls = {name: channel.unary_unary(SERVICE + name, request_serializer=request.SerializeToString,
                                       response_deserializer=response.FromString, _registered_method=True)
             for name, (request, response) in METHODS.items()}
    calls["ModelInfer"] = channel.unary_unary(SERVICE + "ModelInfer", request_serializer=_as_is,
                                              response_deserializer=pb.ModelInferResponse.FromString,
                                              _registered_method=True)
    return calls


def _as_is(data: bytes) -> bytes:
    return data


def infer_answer(message: pb.ModelInferResponse) -> dict[str, np.ndarray]:
    raw = message.raw_output_contents
    if len(raw) != len(message.outputs):
        raise ClientError(0, f"the server's answer has {len(message.outputs)} outputs but {len(raw)} "
                             "raw_output_contents; this client reads raw contents only")
    try:
        return {tensor.name: tensor_from_bytes(tensor.name, tensor.datatype, tuple(tensor.shape), memoryview(data))
                for tensor, data in zip(message.outputs, raw)}
    except (ModelhostError, KeyError) as exc:
        raise ClientError(0, f"the server's answer is malformed: {exc}") from None


def load_request(model: str, config: Mapping[str, Any] | str | None,
                 files: Mapping[str, bytes] | None) -> pb.RepositoryModelLoadRequest:
    import orjson

    message = pb.RepositoryModelLoadRequest(model_name=model)
    if config is not None:
        message.parameters["config"].string_param = config if isinstance(config, str) else orjson.dumps(
            config).decode()
    for path, content in (files or {}).items():
        message.parameters[path].bytes_param = content
    return message


def as_dict(message: Message) -> dict[str, Any]:
    """A message as Triton's HTTP API answers the same thing (field names as in the proto)."""
    return json_format.MessageToDict(message, preserving_proto_field_name=True)


def error(exc: grpc.RpcError) -> ClientError:
    """The ClientError of a failed call: UNAVAILABLE is worth retrying, and safe to retry when the server said
    so (Retry-After) or the call never reached it."""
    code: grpc.StatusCode = exc.code()
    details: str = exc.details() or ""
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return DeadlineExceeded(f"the call's deadline passed before the server answered ({details})")
    retry_after = None
    for key, value in exc.trailing_metadata() or ():
        if key == "retry-after":
            retry_after = retry_after_seconds(value)
    unavailable = code == grpc.StatusCode.UNAVAILABLE
    unsent = unavailable and (retry_after is not None or "failed to connect" in details.lower())
    return ClientError(code.name, details, sent=not unsent, retry_after=retry_after, transient=unavailable)
