"""KServe V2 / Triton gRPC messages <-> core types: raw and typed tensor contents, parameters, metadata.

Pure functions with no I/O and no grpc import, shared by the gRPC servicer and (later) the Python client.
API (messages are grpc_service_pb2 classes):
    decode_infer_request(message: ModelInferRequest, limits: RequestLimits = DEFAULT_LIMITS) -> InferRequest
    encode_infer_response(response: InferResponse, request: InferRequest) -> ModelInferResponse
    parameters_from_proto(params: Mapping[str, InferParameter | ModelRepositoryParameter], where: str) -> dict
    parameters_to_proto(params: Mapping[str, Any], target: MessageMap[str, InferParameter]) -> None
    metadata_to_proto(metadata: ModelMetadata) -> ModelMetadataResponse
    config_to_proto(config_json: dict[str, Any]) -> ModelConfigResponse        # DataPlane.model_config() output
    statistics_to_proto(stats_json: list[dict[str, Any]]) -> ModelStatisticsResponse  # DataPlane.statistics()
    index_to_proto(entries: Iterable[IndexEntry]) -> RepositoryIndexResponse    # Control.index()
    load_request_from_proto(message: RepositoryModelLoadRequest) -> LoadRequest    # Control.load()
    unload_dependents_from_proto(message: RepositoryModelUnloadRequest) -> bool  # Control.unload()
Errors are ModelhostError(INVALID_INPUT), worded as the HTTP codec words the same problem (UNSUPPORTED for
a repository name). Requested outputs' parameters (`classification` included) pass to the core as they are.
Raw inputs become np.frombuffer views of the message's bytes: no copy in Python.
The codec only turns data into arrays of the declared datatype and shape; the core checks them against the model.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np
from google.protobuf import json_format
from google.protobuf.internal.containers import MessageMap

from modelhost.core.load_request import FILE_PREFIX, LoadRequest
from modelhost.errors import invalid
from modelhost.protocols.kserve_v2.codec import tensor_from_bytes, tensor_to_bytes
from modelhost.protocols.kserve_v2.grpc_service_pb2 import (
    InferParameter,
    InferTensorContents,
    ModelConfigResponse,
    ModelInferRequest,
    ModelInferResponse,
    ModelMetadataResponse,
    ModelRepositoryParameter,
    ModelStatisticsResponse,
    RepositoryIndexResponse,
    RepositoryModelLoadRequest,
    RepositoryModelUnloadRequest,
)
from modelhost.protocols.kserve_v2.repository_codec import no_repository
from modelhost.types import (
    DATATYPE_DTYPES,
    DEFAULT_LIMITS,
    InferRequest,
    InferResponse,
    ModelMetadata,
    RequestedOutput,
    RequestLimits,
    TensorSpec,
    datatype_of,
    format_shape,
)

if TYPE_CHECKING:
    from modelhost.core.manager import IndexEntry
    from modelhost.core.shared_memory import SharedMemory

# Typed InferTensorContents field of each datatype, and the numpy dtype protobuf hands its values in.
# FP16 (and BF16) have no typed field: they travel in raw_input_contents only.
_CONTENTS_FIELDS: dict[str, tuple[str, np.dtype]] = {
    "BOOL": ("bool_contents", np.dtype(np.bool_)),
    "INT8": ("int_contents", np.dtype(np.int32)),
    "INT16": ("int_contents", np.dtype(np.int32)),
    "INT32": ("int_contents", np.dtype(np.int32)),
    "INT64": ("int64_contents", np.dtype(np.int64)),
    "UINT8": ("uint_contents", np.dtype(np.uint32)),
    "UINT16": ("uint_contents", np.dtype(np.uint32)),
    "UINT32": ("uint_contents", np.dtype(np.uint32)),
    "UINT64": ("uint64_contents", np.dtype(np.uint64)),
    "FP32": ("fp32_contents", np.dtype(np.float32)),
    "FP64": ("fp64_contents", np.dtype(np.float64)),
    "BYTES": ("bytes_contents", np.dtype(np.object_)),
}
_INT64_MIN, _INT64_MAX, _UINT64_MAX = -(2**63), 2**63 - 1, 2**64 - 1
_REGION = "shared_memory_region"  # shm_tensors.REGION, checked here without importing it


def decode_infer_request(message: ModelInferRequest, limits: RequestLimits = DEFAULT_LIMITS,
                         regions: SharedMemory | None = None) -> InferRequest:
    """A ModelInferRequest as an InferRequest; raw inputs are read-only views of the message's bytes.
    Each input's shape is checked against `limits` before its array is made. Inputs and outputs that name a
    shared memory region are `regions`' (shm_tensors); such inputs have no raw_input_contents entry."""
    raw = message.raw_input_contents
    if raw and len(raw) != len(message.inputs) and len(raw) != len(message.inputs) - _in_regions(message):
        raise invalid(
            f"raw_input_contents has {len(raw)} entries, but the request has {len(message.inputs)} inputs; "
            "when used, raw_input_contents holds the data of every input, in 'inputs' order"
        )
    inputs: dict[str, np.ndarray] = {}
    budget = limits.budget()
    placed = 0  # inputs so far that are in shared memory, which raw_input_contents skips
    # When raw_input_contents holds every input (tritonclient's ordinary request) none is in a region: the
    # parameters are not looked at (~0.25 µs an input).
    may_be_placed = not raw or len(raw) != len(message.inputs)
    for index, tensor in enumerate(message.inputs):
        name, datatype, shape = _tensor_header(tensor, index)
        if name in inputs:
            raise invalid(f"input '{name}' appears twice in the request")
        budget.take(f"input '{name}'", shape)
        if may_be_placed and tensor.parameters and _REGION in tensor.parameters:
            from modelhost.protocols.kserve_v2 import shm_tensors  # a rare path: imported when used

            if tensor.HasField("contents"):
                raise shm_tensors.data_and_region(name)
            parameters = parameters_from_proto(tensor.parameters, f"input '{name}'")
            inputs[name] = shm_tensors.input_from_region(regions, name, datatype, shape, parameters,
                                                         message.model_name)
            placed += 1
        elif raw:
            if tensor.HasField("contents"):
                raise invalid(
                    f"input '{name}' sets 'contents', but the request uses raw_input_contents, "
                    "which must then hold the data of every input"
                )
            if index - placed >= len(raw):
                raise invalid(f"input '{name}' has no entry in raw_input_contents")
            inputs[name] = tensor_from_bytes(name, datatype, shape, memoryview(raw[index - placed]))
        elif tensor.HasField("contents"):
            inputs[name] = _tensor_from_contents(name, datatype, shape, tensor.contents)
        else:
            raise invalid(f"input '{name}' has neither 'contents' nor an entry in raw_input_contents")
    return InferRequest(
        model_name=message.model_name,
        model_version=message.model_version,
        inputs=inputs,
        id=message.id,
        outputs=_requested_outputs(message, regions),
        parameters=parameters_from_proto(message.parameters, "request"),
    )


def _in_regions(message: ModelInferRequest) -> int:
    return sum(1 for tensor in message.inputs if _REGION in tensor.parameters)


def _tensor_header(tensor: ModelInferRequest.InferInputTensor, index: int) -> tuple[str, str, tuple[int, ...]]:
    name = tensor.name
    if not name:
        raise invalid(f"inputs[{index}] has no 'name'")
    datatype = tensor.datatype
    if datatype not in DATATYPE_DTYPES:
        if not datatype:
            raise invalid(f"input '{name}' has no 'datatype'")
        raise invalid(f"input '{name}' has unknown datatype {datatype!r}; known: {', '.join(DATATYPE_DTYPES)}")
    shape = tuple(tensor.shape)
    if any(d < 0 for d in shape):
        raise invalid(f"input '{name}' needs 'shape' as a list of non-negative integers, got {list(shape)!r}")
    return name, datatype, shape


def _tensor_from_contents(
    name: str, datatype: str, shape: tuple[int, ...], contents: InferTensorContents
) -> np.ndarray:
    field = _CONTENTS_FIELDS.get(datatype)
    if field is None:
        raise invalid(f"input '{name}': {datatype} data cannot be sent as typed contents; use raw_input_contents")
    field_name, wire_dtype = field
    for descriptor, _ in contents.ListFields():
        if descriptor.name != field_name:
            raise invalid(f"input '{name}' is {datatype}, so its data goes in '{field_name}', not '{descriptor.name}'")
    values = getattr(contents, field_name)
    count = math.prod(shape)
    if len(values) != count:
        raise invalid(f"input '{name}' has {len(values)} elements, but shape {format_shape(shape)} needs {count}")
    if datatype == "BYTES":
        array = np.empty(count, dtype=object)
        array[:] = list(values)
        return array.reshape(shape)
    array = np.fromiter(values, dtype=wire_dtype, count=count)
    dtype = DATATYPE_DTYPES[datatype]
    if dtype != wire_dtype:
        info = np.iinfo(dtype)
        if count and (array.min() < info.min or array.max() > info.max):
            raise invalid(f"input '{name}' has values outside the range of {datatype}")
        array = array.astype(dtype)
    return array.reshape(shape)


def _requested_outputs(message: ModelInferRequest, regions: SharedMemory | None) -> list[RequestedOutput] | None:
    if not message.outputs:
        return None
    outputs = []
    for index, entry in enumerate(message.outputs):
        if not entry.name:
            raise invalid(f"outputs[{index}] has no 'name'")
        parameters = parameters_from_proto(entry.parameters, f"output '{entry.name}'")
        outputs.append(RequestedOutput(entry.name, parameters))
        if parameters and _REGION in parameters:
            from modelhost.protocols.kserve_v2 import shm_tensors

            shm_tensors.check_output_regions(regions, outputs[-1:])
    return outputs


def parameters_from_proto(
    params: Mapping[str, InferParameter] | Mapping[str, ModelRepositoryParameter], where: str
) -> dict[str, Any]:
    """InferParameter / ModelRepositoryParameter map -> {name: bool | int | str | float | bytes}.

    `where` names the owner in errors ("request", "input 'x'"); a parameter with no value set is an error.
    """
    result: dict[str, Any] = {}
    for key, param in params.items():
        choice = param.WhichOneof("parameter_choice")
        if choice is None:
            raise invalid(f"{where} parameter '{key}' has no value")
        result[key] = getattr(param, choice)
    return result


def parameters_to_proto(params: Mapping[str, Any], target: MessageMap[str, InferParameter]) -> None:
    """Write {name: bool | int | str | float} into an InferParameter map; ints past int64 go as uint64."""
    for key, value in params.items():
        param = target[key]
        if isinstance(value, (bool, np.bool_)):
            param.bool_param = bool(value)
        elif isinstance(value, (int, np.integer)):
            number = int(value)
            if _INT64_MIN <= number <= _INT64_MAX:
                param.int64_param = number
            elif _INT64_MAX < number <= _UINT64_MAX:
                param.uint64_param = number
            else:
                raise invalid(f"parameter '{key}' = {number} does not fit in 64 bits")
        elif isinstance(value, (float, np.floating)):
            param.double_param = float(value)
        elif isinstance(value, str):
            param.string_param = value
        else:
            raise invalid(f"parameter '{key}' is a {type(value).__name__}; parameters are bool, int, float or str")


def encode_infer_response(response: InferResponse, request: InferRequest,
                          placed: Collection[str] = ()) -> ModelInferResponse:
    """A ModelInferResponse with every output in raw_output_contents (what tritonclient.grpc reads).

    `request` is the decoded request the response answers (kept for per-output options; none apply today).
    Outputs in `placed` were written to shared memory: an empty raw_output_contents entry each keeps the
    others at their outputs' index (tritonclient reads them by index).
    """
    message = ModelInferResponse(
        model_name=response.model_name, model_version=response.model_version, id=response.id
    )
    parameters_to_proto(response.parameters, message.parameters)
    for name, array in response.outputs.items():
        message.outputs.add(name=name, datatype=datatype_of(array), shape=array.shape)
        if placed and name in placed:
            message.raw_output_contents.append(b"")
        else:
            message.raw_output_contents.append(tensor_to_bytes(array))
    return message


def metadata_to_proto(metadata: ModelMetadata) -> ModelMetadataResponse:
    """Model metadata as ModelMetadataResponse (full shapes, -1 where variable)."""

    def tensor(spec: TensorSpec) -> ModelMetadataResponse.TensorMetadata:
        return ModelMetadataResponse.TensorMetadata(name=spec.name, datatype=spec.datatype, shape=spec.shape)

    return ModelMetadataResponse(
        name=metadata.name,
        versions=metadata.versions,
        platform=metadata.platform,
        inputs=[tensor(s) for s in metadata.inputs],
        outputs=[tensor(s) for s in metadata.outputs],
    )


def config_to_proto(config_json: dict[str, Any]) -> ModelConfigResponse:
    """DataPlane.model_config()'s JSON (proto field names) as ModelConfigResponse."""
    response = ModelConfigResponse()
    json_format.ParseDict(config_json, response.config)
    return response


def statistics_to_proto(stats_json: list[dict[str, Any]]) -> ModelStatisticsResponse:
    """DataPlane.statistics()'s `model_stats` list (Triton's JSON shape) as ModelStatisticsResponse.

    The JSON uses the proto's field names, so protobuf's JSON mapping converts it; a key the proto lacks raises.
    """
    response = ModelStatisticsResponse()
    json_format.ParseDict({"model_stats": stats_json}, response)
    return response


def load_request_from_proto(message: RepositoryModelLoadRequest) -> LoadRequest:
    """`config` as string_param and `file:<version>/<path>` as bytes_param, as tritonclient sends them."""
    no_repository(message.repository_name, f"load model '{message.model_name}'")
    config: str | None = None
    files: dict[str, bytes] = {}
    unknown: list[str] = []
    for key, value in parameters_from_proto(message.parameters, "load").items():
        if key == "config":
            if not isinstance(value, str):
                raise invalid("load parameter 'config' must be a string_param holding the model configuration in JSON")
            config = value
        elif key.startswith(FILE_PREFIX):
            if not isinstance(value, bytes):
                raise invalid(f"load parameter '{key}' must be a bytes_param holding the file's content")
            files[key] = value
        else:
            unknown.append(key)
    return LoadRequest(config, files, tuple(unknown))


def unload_dependents_from_proto(message: RepositoryModelUnloadRequest) -> bool:
    no_repository(message.repository_name, f"unload model '{message.model_name}'")
    value = parameters_from_proto(message.parameters, "unload").get("unload_dependents", False)
    if not isinstance(value, bool):
        raise invalid(f"unload parameter 'unload_dependents' must be a bool_param, got {value!r}")
    return value


def index_to_proto(entries: Iterable[IndexEntry]) -> RepositoryIndexResponse:
    """Control.index() entries as RepositoryIndexResponse (empty strings where a field is unknown)."""
    response = RepositoryIndexResponse()
    for entry in entries:
        response.models.add(name=entry.name, version=entry.version, state=entry.state, reason=entry.reason)
    return response
