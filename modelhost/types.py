"""Protocol-neutral request, response and metadata types: named numpy tensors.

A BYTES tensor is a numpy object array whose elements are `bytes`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from modelhost.errors import invalid

if TYPE_CHECKING:
    from modelhost.core.trace import Trace

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


def format_shape(shape: Sequence[int]) -> str:
    return "[" + ",".join(str(d) for d in shape) + "]"


def _numpy_max_rank() -> int:
    """The most dimensions an array of the installed numpy may have: 64 in numpy 2, 32 before."""
    try:
        np.empty((1,) * 64)
    except ValueError:
        return 32
    return 64


MAX_RANK = _numpy_max_rank()  # shapes and JSON nesting past it are refused before numpy sees them


@dataclass(frozen=True, slots=True)
class RequestLimits:
    """What one request may make the server allocate; ServerSettings documents each default and why.

    max_elements: elements of all of a request's input tensors together.
    max_json_depth: how deeply a tensor's JSON data may nest lists (at most MAX_RANK).
    max_output_bytes: the data bytes of a response's outputs together.
    """

    max_elements: int = 64 * 1024**2
    max_json_depth: int = MAX_RANK
    max_output_bytes: int = 1024**3

    def budget(self) -> ElementBudget:
        return ElementBudget(self)


DEFAULT_LIMITS = RequestLimits()


class ElementBudget:
    """The elements one request's tensors may still take; codecs `take` each tensor's shape before allocating it."""

    __slots__ = ("limits", "left")

    def __init__(self, limits: RequestLimits) -> None:
        self.limits = limits
        self.left = limits.max_elements

    def take(self, where: str, shape: Sequence[int]) -> int:
        """The element count of `shape`; INVALID_INPUT when it is not a shape numpy can hold within the budget.

        `where` names the tensor ("input 'x'"). Dims must be non-negative (callers check their types).
        A zero dim makes an empty tensor, but numpy still refuses one whose other dims overflow, so those
        count against the limit too.
        """
        if len(shape) > MAX_RANK:
            raise invalid(f"{where} has {len(shape)} dimensions; at most {MAX_RANK} are supported")
        count = math.prod(shape)
        limit = self.limits.max_elements
        spread = count if count else math.prod(d for d in shape if d)
        if count > self.left or spread > limit:
            what = f"{count} elements" if count else f"dimensions whose non-zero sizes multiply to {spread}"
            raise invalid(f"{where} has shape {format_shape(shape)}: {what}, more than the {limit} elements a "
                          f"request's tensors may hold together (--max-request-elements)")
        self.left -= count
        return count


def json_depth(value: Any) -> int:
    """How deeply nested lists go along their first items: a tensor's rank as its JSON writes it.

    O(depth); a list that is deeper elsewhere is ragged, which the array conversion refuses.
    """
    depth = 0
    while type(value) is list:
        depth += 1
        if not value:
            break
        value = value[0]
    return depth


@dataclass(slots=True, frozen=True)
class TensorSpec:
    """A tensor as the API sees it: full shape, batch dim included, -1 where variable."""

    name: str
    datatype: str
    shape: tuple[int, ...]
    optional: bool = False


@dataclass(slots=True, frozen=True)
class SignatureSpec:
    """A named signature's tensors as the model file shapes them, and what it does ("" where the file does not say;
    a SavedModel's method_name)."""

    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    method: str = ""


@dataclass(slots=True, frozen=True)
class ModelMetadata:
    name: str
    versions: tuple[str, ...]
    platform: str
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    max_batch_size: int = 0  # > 0: every tensor's shape starts with the batch dim, -1
    version: str = ""  # the version these tensors are of
    # Every signature by name, for APIs whose requests name one (the config's inputs and outputs are one of them).
    signatures: Mapping[str, SignatureSpec] = field(default_factory=dict)


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
    signature: str | None = None  # one of ModelMetadata.signatures by name; None: the config's inputs and outputs
    received: float = 0.0  # time.monotonic() when the server began receiving it; 0: unknown
    trace: Trace | None = None  # set by the front-end when the request is traced (core/trace.py)


@dataclass(slots=True)
class InferResponse:
    """Outputs in the order the request asked for them (model order when it asked for all)."""

    model_name: str
    model_version: str
    outputs: dict[str, np.ndarray]
    id: str = ""
    parameters: dict[str, Any] = field(default_factory=dict)


def check_json_depth(value: Any, where: str, max_depth: int) -> None:
    """INVALID_INPUT when a tensor's JSON data nests lists deeper than `max_depth`."""
    depth = json_depth(value)
    if depth > max_depth:
        raise invalid(f"{where} has JSON data nested {depth} lists deep: JSON nesting depth exceeds maximum "
                      f"allowed limit ({max_depth}) (--json-max-depth)")
