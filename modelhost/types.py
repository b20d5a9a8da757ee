"""Protocol-neutral request, response and metadata types: named numpy tensors.

A BYTES tensor is a numpy object array whose elements are `bytes`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

# KServe V2 datatype name -> numpy dtype. BF16 has no numpy dtype and is not served.
DATATYPE_DTYPES: dict[str, np.dtype] = {
    "BOOL": np.dtype(np.bool_),
    "UINT8": np.dtype(np.uint8),
    "UINT16": np.dtype(np.uint16),
    "UINT32": np.dtype(np.uint32),
    "UINT64": np.dtype(np.uint64),
    "INT8": np.dtype(np.int8),
    "INT16": np.dtype(np.int16),
    "INT32": np.dtype(np.int32),
    "INT64": np.dtype(np.int64),
    "FP16": np.dtype(np.float16),
    "FP32": np.dtype(np.float32),
    "FP64": np.dtype(np.float64),
    "BYTES": np.dtype(np.object_),
}
DTYPE_DATATYPES: dict[np.dtype, str] = {dtype: name for name, dtype in DATATYPE_DTYPES.items()}


def datatype_of(array: np.ndarray) -> str:
    """The V2 datatype name of an array; str/bytes arrays count as BYTES."""
    name = DTYPE_DATATYPES.get(array.dtype)
    if name is None:
        if array.dtype.kind in "SU":
            return "BYTES"
        raise TypeError(f"numpy dtype {array.dtype} has no KServe V2 datatype")
    return name


def format_shape(shape: tuple[int, ...] | list[int]) -> str:
    return "[" + ",".join(str(d) for d in shape) + "]"


@dataclass(slots=True, frozen=True)
class TensorSpec:
    """A tensor as the API sees it: full shape, batch dim included, -1 where variable."""

    name: str
    datatype: str
    shape: tuple[int, ...]
    optional: bool = False


@dataclass(slots=True, frozen=True)
class ModelMetadata:
    name: str
    versions: tuple[str, ...]
    platform: str
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]


@dataclass(slots=True)
class RequestedOutput:
    name: str
    parameters: dict[str, Any] = field(default_factory=dict)


@dataclass(slots=True)
class InferRequest:
    """One inference request; `model_version` "" lets the server pick by version policy."""

    model_name: str
    inputs: dict[str, np.ndarray]
    model_version: str = ""
    id: str = ""
    outputs: list[RequestedOutput] | None = None
    parameters: dict[str, Any] = field(default_factory=dict)
    # The whole data of the model's only input, shape left to the server (Triton's raw binary request).
    raw_input: bytes | memoryview | None = None


@dataclass(slots=True)
class InferResponse:
    """Outputs in the order the request asked for them (model order when it asked for all)."""

    model_name: str
    model_version: str
    outputs: dict[str, np.ndarray]
    id: str = ""
    parameters: dict[str, Any] = field(default_factory=dict)
