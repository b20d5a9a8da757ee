"""KServe V2 inference bodies <-> core types: JSON tensors and Triton's binary tensor data extension.

Pure functions with no I/O, shared by the HTTP front-end and (later) the Python client.
Binary inputs become numpy views of the request body (np.frombuffer): no copy in Python.
"""

from __future__ import annotations

import math
from collections.abc import Collection
from itertools import chain
from typing import TYPE_CHECKING, Any

import numpy as np
import orjson

from modelhost.errors import client_value, invalid
from modelhost.protocols import json_tensors
from modelhost.protocols.json_body import json_object
from modelhost.protocols.json_numbers import json_numbers
from modelhost.protocols.json_tensors import JsonNumbers
from modelhost.protocols.kserve_v2.bytes_tensors import join_elements, split_elements
from modelhost.types import (
    DATATYPE_DTYPES,
    DEFAULT_LIMITS,
    InferRequest,
    InferResponse,
    RequestedOutput,
    RequestLimits,
    check_json_depth,
    datatype_of,
    format_shape,
)

if TYPE_CHECKING:
    from modelhost.core.shared_memory import SharedMemory

_JSON_ONLY_BINARY = ("FP16", "BF16")
TENSOR_PATHS: tuple[json_tensors.TensorPath, ...] = (("inputs", json_tensors.ANY, "data"),)


def decode_infer_request(
    body: bytes, header_length: int | None, model_name: str, model_version: str = "",
    limits: RequestLimits = DEFAULT_LIMITS, regions: SharedMemory | None = None, document: Any = None,
) -> InferRequest:
    """Parse a V2 infer body; `header_length` is Inference-Header-Content-Length (None: all JSON; 0, a raw
    binary request, is read against the model's metadata by raw_codec instead). `document`: an all-JSON body
    already parsed (by json_tensors.load with TENSOR_PATHS among its paths).

    Each input's shape is checked against `limits` before its array is made. Inputs and outputs that name a
    shared memory region are `regions`' (shm_tensors)."""
    if header_length is None:
        header_length = len(body)
        if document is None:
            document = json_tensors.load(body, TENSOR_PATHS)
    elif not 0 < header_length <= len(body):
        raise invalid(
            f"Inference-Header-Content-Length {header_length} is outside the request body of {len(body)} bytes"
        )
    view = memoryview(body)
    if not isinstance(document, dict):
        document = json_object(view[:header_length], holding="an 'inputs' list")
    offset = header_length
    inputs: dict[str, np.ndarray] = {}
    budget = limits.budget()
    for index, entry in enumerate(_list_field(document, "inputs", required=True)):
        name, datatype, shape, parameters = _tensor_header(entry, f"inputs[{index}]")
        if name in inputs:
            raise invalid(f"input '{name}' appears twice in the request")
        budget.take(f"input '{name}'", shape)
        size = parameters.get("binary_data_size")
        if "shared_memory_region" in parameters:
            from modelhost.protocols.kserve_v2 import shm_tensors  # a rare path: imported when used

            if size is not None or "data" in entry:
                raise shm_tensors.data_and_region(name)
            inputs[name] = shm_tensors.input_from_region(regions, name, datatype, shape, parameters, model_name)
        elif size is not None:
            if not isinstance(size, int) or isinstance(size, bool) or size < 0:
                raise invalid(f"input '{name}': binary_data_size must be a non-negative integer, "
                              f"got {client_value(size)}")
            if offset + size > len(body):
                raise invalid(
                    f"input '{name}': binary_data_size {size} exceeds the {len(body) - offset} bytes "
                    "of binary data left in the request body"
                )
            inputs[name] = tensor_from_bytes(name, datatype, shape, view[offset : offset + size])
            offset += size
        elif "data" in entry:
            inputs[name] = tensor_from_json(name, datatype, shape, entry["data"], limits.max_json_depth)
        else:
            raise invalid(f"input '{name}' has neither 'data' nor a binary_data_size parameter")
    if offset != len(body):
        raise invalid(f"request body has {len(body) - offset} bytes of binary data that no input claims")
    return InferRequest(
        model_name=model_name,
        model_version=model_version,
        inputs=inputs,
        id=_string_field(document, "id"),
        outputs=_requested_outputs(document, regions),
        parameters=_dict_field(document, "parameters", "request"),
    )


def _list_field(document: dict[str, Any], field: str, required: bool = False) -> list[Any]:
    value = document.get(field)
    if value is None:
        if required:
            raise invalid(f"request has no '{field}' list")
        return []
    if not isinstance(value, list):
        raise invalid(f"request field '{field}' must be a list, got {type(value).__name__}")
    return value


def _string_field(document: dict[str, Any], field: str) -> str:
    value = document.get(field, "")
    if not isinstance(value, str):
        raise invalid(f"request field '{field}' must be a string, got {type(value).__name__}")
    return value


def _dict_field(document: dict[str, Any], field: str, where: str) -> dict[str, Any]:
    value = document.get(field)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise invalid(f"{where} field '{field}' must be an object, got {type(value).__name__}")
    return value


def _tensor_header(entry: Any, where: str) -> tuple[str, str, tuple[int, ...], dict[str, Any]]:
    if not isinstance(entry, dict):
        raise invalid(f"{where} must be an object with name, datatype and shape")
    name = entry.get("name")
    if not isinstance(name, str) or not name:
        raise invalid(f"{where} has no 'name'")
    datatype = entry.get("datatype")
    if not isinstance(datatype, str) or datatype not in DATATYPE_DTYPES:  # a list is not hashable
        if datatype is None:
            raise invalid(f"input '{name}' has no 'datatype'")
        raise invalid(f"input '{name}' has unknown datatype {client_value(datatype)}; "
                      f"known: {', '.join(DATATYPE_DTYPES)}")
    shape = entry.get("shape")
    if not isinstance(shape, list) or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape):
        raise invalid(f"input '{name}' needs 'shape' as a list of non-negative integers, got {client_value(shape)}")
    return name, datatype, tuple(shape), _dict_field(entry, "parameters", f"input '{name}'")


def tensor_from_bytes(name: str, datatype: str, shape: tuple[int, ...], chunk: memoryview) -> np.ndarray:
    """The tensor in `chunk`; the caller has checked `shape` (ElementBudget.take)."""
    count = math.prod(shape)
    if datatype == "BYTES":
        return np.array(split_elements(name, chunk, count), dtype=object).reshape(shape)
    dtype = DATATYPE_DTYPES[datatype]
    if len(chunk) != count * dtype.itemsize:
        raise invalid(
            f"input '{name}' has {len(chunk)} bytes of binary data, but shape {format_shape(shape)} "
            f"of {datatype} needs {count * dtype.itemsize}"
        )
    return np.frombuffer(chunk, dtype=dtype).reshape(shape)


def tensor_from_json(
    name: str, datatype: str, shape: tuple[int, ...], data: Any, max_depth: int = DEFAULT_LIMITS.max_json_depth
) -> np.ndarray:
    """The tensor in JSON `data`; the caller has checked `shape` (ElementBudget.take)."""
    if datatype in _JSON_ONLY_BINARY:
        raise invalid(f"input '{name}': {datatype} data cannot be sent as JSON; use binary tensor data")
    if not isinstance(data, (list, JsonNumbers)):
        data = [data]
    count = math.prod(shape)
    if datatype == "BYTES":
        data = json_tensors.plain(data)
        check_json_depth(data, f"input '{name}'", max_depth)
        flat = _flatten_strings(name, data)
        if len(flat) != count:
            raise invalid(f"input '{name}' has {len(flat)} elements, but shape {format_shape(shape)} needs {count}")
        return np.array(flat, dtype=object).reshape(shape)
    array = json_numbers(data, datatype, f"input '{name}'", max_depth)
    if array.size != count:
        raise invalid(f"input '{name}' has {array.size} elements, but shape {format_shape(shape)} needs {count}")
    return array.reshape(shape)


def _flatten_strings(name: str, data: list[Any]) -> list[bytes]:
    kinds = set(map(type, data))
    if kinds == {list}:  # rows: one level down, the usual shape of a batch of strings
        data = list(chain.from_iterable(data))
        kinds = set(map(type, data))
    if kinds == {str}:
        return list(map(str.encode, data))
    flat: list[bytes] = []
    stack = [iter(data)]
    while stack:
        for item in stack[-1]:
            if isinstance(item, str):
                flat.append(item.encode("utf-8"))
            elif isinstance(item, list):
                stack.append(iter(item))
                break
            else:
                raise invalid(f"input '{name}' is BYTES, so its data must be strings, got {type(item).__name__}")
        else:
            stack.pop()
    return flat


def _requested_outputs(document: dict[str, Any], regions: SharedMemory | None) -> list[RequestedOutput] | None:
    entries = _list_field(document, "outputs")
    if not entries:
        return None
    outputs = []
    for index, entry in enumerate(entries):
        if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
            raise invalid(f"outputs[{index}] must be an object with a 'name'")
        parameters = _dict_field(entry, "parameters", f"output '{entry['name']}'")
        outputs.append(RequestedOutput(entry["name"], parameters))
        if parameters and "shared_memory_region" in parameters:
            from modelhost.protocols.kserve_v2 import shm_tensors

            shm_tensors.check_output_regions(regions, outputs[-1:])
    return outputs


def encode_infer_response(response: InferResponse, request: InferRequest,
                          placed: Collection[str] = ()) -> tuple[list[bytes], int | None]:
    """Body parts of a V2 infer response, and the JSON header length when binary parts follow. Outputs in
    `placed` were written to shared memory: their entries carry no data (and no parameters, as Triton's)."""
    default_binary = request.parameters.get("binary_data_output") is True
    binary_of = {o.name: o.parameters.get("binary_data", default_binary) is True for o in request.outputs or ()}
    outputs = []
    chunks: list[bytes] = []
    for name, array in response.outputs.items():
        entry: dict[str, Any] = {"name": name, "datatype": datatype_of(array), "shape": list(array.shape)}
        if placed and name in placed:
            pass  # its data is in the client's region
        elif binary_of.get(name, default_binary):
            data = tensor_to_bytes(array)
            entry["parameters"] = {"binary_data_size": len(data)}
            chunks.append(data)
        else:
            entry["data"] = _json_data(name, array)
        outputs.append(entry)
    document: dict[str, Any] = {"model_name": response.model_name, "model_version": response.model_version}
    if response.id:
        document["id"] = response.id
    if response.parameters:
        document["parameters"] = response.parameters
    document["outputs"] = outputs
    header = orjson.dumps(document, option=orjson.OPT_SERIALIZE_NUMPY)
    if chunks:
        return [header, *chunks], len(header)
    return [header], None


def tensor_to_bytes(array: np.ndarray) -> bytes:
    if array.dtype.kind in "OSU":
        return join_elements(array)
    return np.ascontiguousarray(array).tobytes()


def tensor_view(array: np.ndarray) -> memoryview:
    """The tensor's wire bytes as tensor_to_bytes makes them, but the array's own memory (no copy) when it is
    contiguous: for a sender that writes it out once (the client)."""
    if array.dtype.kind in "OSU":
        return memoryview(tensor_to_bytes(array))
    return memoryview(np.ascontiguousarray(array).reshape(-1)).cast("B")  # type: ignore[arg-type]


def _json_data(name: str, array: np.ndarray) -> Any:
    if array.dtype.kind in "OSU":
        try:
            return [e.decode("utf-8") if isinstance(e, bytes) else str(e) for e in array.flat]
        except UnicodeDecodeError:
            raise invalid(f"output '{name}' holds bytes that are not UTF-8; request it with binary_data") from None
    return np.ascontiguousarray(array.reshape(-1))
