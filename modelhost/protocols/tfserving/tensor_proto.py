"""TensorFlow TensorProto <-> numpy arrays, and TF Serving PredictRequest / PredictResponse bytes (protocols §5.6).

Pure functions with no I/O. Decoding follows tf.make_ndarray: `tensor_content` holds row-major little-endian
data, otherwise the dtype's typed `*_val` field holds the values in row-major order, and a typed field with one
value fills the whole shape. Stricter than TensorFlow, which pads a short field with its last value (or zeros):
any other count that does not match the shape is an error here. DT_STRING becomes an object array of `bytes`.
Encoding writes numeric arrays to `tensor_content` (one copy, no per-element work) unless asked for the typed
fields, which clients that read `outputs[name].float_val` directly need; strings always go in `string_val`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from google.protobuf.message import DecodeError

from modelhost.errors import invalid
from modelhost.protocols.tfserving import predict_pb2 as pb
from modelhost.protocols.tfserving.json_codec import check_input_names
from modelhost.types import DATATYPE_DTYPES, DEFAULT_LIMITS, ElementBudget, RequestLimits, TensorSpec, format_shape

# DataType -> (numpy dtype, the typed field that holds its values). DT_STRING's dtype is object (bytes elements).
_SUPPORTED: dict[pb.DataType, tuple[np.dtype, str]] = {
    pb.DT_FLOAT: (np.dtype(np.float32), "float_val"),
    pb.DT_DOUBLE: (np.dtype(np.float64), "double_val"),
    pb.DT_HALF: (np.dtype(np.float16), "half_val"),
    pb.DT_INT8: (np.dtype(np.int8), "int_val"),
    pb.DT_INT16: (np.dtype(np.int16), "int_val"),
    pb.DT_INT32: (np.dtype(np.int32), "int_val"),
    pb.DT_INT64: (np.dtype(np.int64), "int64_val"),
    pb.DT_UINT8: (np.dtype(np.uint8), "int_val"),
    pb.DT_UINT16: (np.dtype(np.uint16), "int_val"),
    pb.DT_UINT32: (np.dtype(np.uint32), "uint32_val"),
    pb.DT_UINT64: (np.dtype(np.uint64), "uint64_val"),
    pb.DT_BOOL: (np.dtype(np.bool_), "bool_val"),
    pb.DT_STRING: (np.dtype(np.object_), "string_val"),
}
_DATA_TYPES: dict[np.dtype, pb.DataType] = {dtype: data_type for data_type, (dtype, _) in _SUPPORTED.items()}
_TYPED_FIELDS = (
    "float_val", "double_val", "int_val", "string_val", "scomplex_val", "int64_val", "bool_val", "dcomplex_val",
    "half_val", "uint32_val", "uint64_val",
)


@dataclass(frozen=True, slots=True)
class ModelSpecInfo:
    """A request's ModelSpec: `version` is "" when the request names none (or names a label instead)."""

    name: str
    version: str
    signature_name: str
    version_label: str = ""


def dtype_name(data_type: int) -> str:
    """The DataType enum's name ("DT_FLOAT"), or the number for values this proto does not know."""
    try:
        return pb.DataType.Name(data_type)
    except ValueError:
        return str(data_type)


def data_type_of(datatype: str) -> int:
    """The DataType of a V2 datatype name (BYTES is DT_STRING)."""
    return _DATA_TYPES[DATATYPE_DTYPES[datatype]]


def tensor_to_array(proto: pb.TensorProto, where: str, budget: ElementBudget | None = None) -> np.ndarray:
    """The array a TensorProto holds; errors are INVALID_INPUT and start with `where` (e.g. "inputs['x']").

    Its shape is taken from `budget` (the request's; by default one of the default limits) before any allocation:
    a typed field with one value fills the whole shape, however large it says it is."""
    if proto.dtype not in _SUPPORTED:
        supported = ", ".join(dtype_name(d) for d in _SUPPORTED)
        raise invalid(f"{where} has dtype {dtype_name(proto.dtype)}, which is not supported; supported: {supported}")
    dtype, field = _SUPPORTED[proto.dtype]
    shape = _shape(proto.tensor_shape, where)
    (budget or DEFAULT_LIMITS.budget()).take(where, shape)
    for other in _TYPED_FIELDS:
        if other != field and len(getattr(proto, other)):
            raise invalid(
                f"{where} is {dtype_name(proto.dtype)} but sets {other}; its values go in {field} or tensor_content"
            )
    if proto.tensor_content:
        if len(getattr(proto, field)):
            raise invalid(f"{where} sets both tensor_content and {field}; a tensor holds its values in one of them")
        return _from_content(proto.tensor_content, dtype, shape, proto.dtype, where)
    return _from_typed(getattr(proto, field), dtype, field, shape, where)


def _shape(proto: pb.TensorShapeProto, where: str) -> tuple[int, ...]:
    if proto.unknown_rank:
        raise invalid(f"{where} has unknown_rank set; a request tensor needs a known shape")
    shape = tuple(dim.size for dim in proto.dim)
    if any(size < 0 for size in shape):
        raise invalid(f"{where} has shape {format_shape(shape)}; every dimension needs a known size")
    return shape


def _from_content(content: bytes, dtype: np.dtype, shape: tuple[int, ...], data_type: int, where: str) -> np.ndarray:
    if dtype.kind == "O":
        raise invalid(f"{where} is DT_STRING, whose values go in string_val, not tensor_content")
    expected = math.prod(shape) * dtype.itemsize
    if len(content) != expected:
        raise invalid(
            f"{where} has {len(content)} bytes of tensor_content, but shape {format_shape(shape)} "
            f"of {dtype_name(data_type)} needs {expected}"
        )
    # The wire is little-endian; on little-endian hosts astype is a no-op and the array views `content`.
    return np.frombuffer(content, dtype=dtype.newbyteorder("<")).astype(dtype, copy=False).reshape(shape)


def _from_typed(values: Any, dtype: np.dtype, field: str, shape: tuple[int, ...], where: str) -> np.ndarray:
    count = math.prod(shape)
    if len(values) not in (count, 1):
        raise invalid(
            f"{where} has {len(values)} values in {field}, but shape {format_shape(shape)} needs {count} "
            "(or 1, which fills the shape)"
        )
    if dtype.kind == "O":
        flat = np.empty(len(values), dtype=object)
        flat[:] = list(values)
    elif field == "half_val":
        # Each int32 holds a float16's bit pattern in its low 16 bits.
        flat = (np.array(values, dtype=np.int64) & 0xFFFF).astype(np.uint16).view(np.float16)
    elif field == "int_val" and dtype != np.int32:
        wide = np.array(values, dtype=np.int64)
        info = np.iinfo(dtype)
        if wide.size and (wide.min() < info.min or wide.max() > info.max):
            raise invalid(f"{where} has int_val values outside the range of {dtype_name(_DATA_TYPES[dtype])}")
        flat = wide.astype(dtype)
    else:
        flat = np.array(values, dtype=dtype)
    if flat.size == count:
        return flat.reshape(shape)
    return np.full(shape, flat[0], dtype=dtype)


def array_to_tensor(array: np.ndarray, *, typed: bool = False) -> pb.TensorProto:
    """A TensorProto holding `array`: numbers in tensor_content (typed: the dtype's *_val field), strings in string_val.

    bytes elements go as they are, str elements as UTF-8; raises TypeError for a dtype TensorFlow has no DataType for.
    """
    proto = pb.TensorProto()
    _fill(proto, array, typed)
    return proto


def _fill(proto: pb.TensorProto, array: np.ndarray, typed: bool) -> None:
    for size in array.shape:
        proto.tensor_shape.dim.add(size=size)
    if array.dtype.kind in "OSU":
        proto.dtype = pb.DT_STRING
        items = array.reshape(-1).tolist()
        if set(map(type, items)) != {bytes}:
            items = [e if isinstance(e, bytes) else str(e).encode("utf-8") for e in items]
        proto.string_val.extend(items)
        return
    data_type = _DATA_TYPES.get(array.dtype.newbyteorder("="))
    if data_type is None:
        raise TypeError(f"numpy dtype {array.dtype} has no TensorFlow DataType")
    proto.dtype = data_type
    if not typed:
        proto.tensor_content = np.ascontiguousarray(array, dtype=array.dtype.newbyteorder("<")).tobytes()
    elif array.dtype == np.float16:
        proto.half_val.extend(array.reshape(-1).view(np.uint16).tolist())
    else:
        getattr(proto, _SUPPORTED[data_type][1]).extend(array.reshape(-1).tolist())


def decode_predict_request(
    body: bytes, inputs: Sequence[TensorSpec], limits: RequestLimits = DEFAULT_LIMITS
) -> tuple[dict[str, np.ndarray], ModelSpecInfo, list[str]]:
    """Input arrays by name (in the model's input order), the ModelSpec and the output_filter of a serialized
    PredictRequest; INVALID_INPUT when it does not parse, and as `predict_inputs`."""
    request = pb.PredictRequest()
    try:
        request.ParseFromString(body)
    except DecodeError as error:
        raise invalid(f"request body is not a serialized tensorflow.serving.PredictRequest: {error}") from None
    return predict_inputs(request, inputs, limits), model_spec_info(request.model_spec), list(request.output_filter)


def predict_inputs(
    request: pb.PredictRequest, inputs: Sequence[TensorSpec], limits: RequestLimits = DEFAULT_LIMITS
) -> dict[str, np.ndarray]:
    """A PredictRequest's input arrays by name, in the order of `inputs` (a signature's).

    Raises INVALID_INPUT when it names inputs the signature lacks or misses required ones, or holds a tensor
    whose dtype is not the input's.
    """
    specs = {spec.name: spec for spec in inputs}
    check_input_names(request.inputs.keys(), specs, "PredictRequest.inputs")
    arrays = {}
    budget = limits.budget()
    for name, spec in specs.items():
        if name in request.inputs:
            where = f"inputs['{name}']"
            proto = request.inputs[name]
            array = tensor_to_array(proto, where, budget)
            _check_dtype(array, proto.dtype, spec, where)
            arrays[name] = array
    return arrays


def model_spec_info(model_spec: pb.ModelSpec) -> ModelSpecInfo:
    version = str(model_spec.version.value) if model_spec.HasField("version") else ""
    return ModelSpecInfo(model_spec.name, version, model_spec.signature_name, model_spec.version_label)


def _check_dtype(array: np.ndarray, data_type: int, spec: TensorSpec, where: str) -> None:
    expected = DATATYPE_DTYPES.get(spec.datatype)
    if expected is not None and array.dtype != expected:
        wanted = dtype_name(_DATA_TYPES[expected]) if expected in _DATA_TYPES else spec.datatype
        raise invalid(f"{where} is {dtype_name(data_type)}, but the model's input '{spec.name}' is {wanted}")


def encode_predict_response(
    outputs: dict[str, np.ndarray], name: str, version: str, *, signature_name: str = "", typed: bool = False
) -> bytes:
    """A serialized PredictResponse; its ModelSpec carries `version` when it is an integer."""
    return predict_response(outputs, name, version, signature_name=signature_name, typed=typed).SerializeToString()


def predict_response(
    outputs: dict[str, np.ndarray], name: str, version: str, *, signature_name: str = "", typed: bool = False
) -> pb.PredictResponse:
    response = pb.PredictResponse()
    fill_model_spec(response.model_spec, name, version, signature_name)
    for output, array in outputs.items():
        _fill(response.outputs[output], array, typed)
    return response


def fill_model_spec(model_spec: pb.ModelSpec, name: str, version: str, signature_name: str) -> None:
    """The ModelSpec of an answer: the model, the version that ran (when it is an integer) and the signature."""
    model_spec.name = name
    if version.isascii() and version.isdigit():
        model_spec.version.value = int(version)
    model_spec.signature_name = signature_name
