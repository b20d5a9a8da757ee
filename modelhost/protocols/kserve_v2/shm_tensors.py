"""Tensors in client shared memory, for both V2 codecs (HTTP JSON/binary and gRPC).

An input or requested output whose parameters name `shared_memory_region` (with `shared_memory_byte_size` and
an optional `shared_memory_offset`) lives in a registered region (core/shared_memory.py): an input is read as
a read-only numpy view of the region (no copy), and an output is written into the region after inference,
its response entry carrying its name, datatype and shape only: no data, and no parameters, as Triton answers
(Triton's C++ HTTP client, perf_analyzer's, reads `binary_data_size` from any output that has parameters).
Parameters arrive as plain dicts (JSON, or grpc_codec.parameters_from_proto), so one set of rules serves both
protocols.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from modelhost.core.shared_memory import FLAG, SharedMemory
from modelhost.errors import ErrorKind, ModelhostError, invalid
from modelhost.protocols.kserve_v2.codec import tensor_from_bytes, tensor_view
from modelhost.types import DATATYPE_DTYPES, InferRequest, InferResponse, RequestedOutput, format_shape

REGION = "shared_memory_region"
BYTE_SIZE = "shared_memory_byte_size"
OFFSET = "shared_memory_offset"


def placement(parameters: Mapping[str, Any], where: str) -> tuple[str, int, int] | None:
    """(region, offset, byte size) when `parameters` name a region; None when they name none."""
    region = parameters.get(REGION)
    if region is None:
        if BYTE_SIZE in parameters or OFFSET in parameters:
            raise invalid(f"{where} sets {BYTE_SIZE} or {OFFSET} without {REGION}")
        return None
    if not isinstance(region, str) or not region:
        raise invalid(f"{where}: {REGION} must be the name of a registered region, got {region!r}")
    if BYTE_SIZE not in parameters:
        raise invalid(f"{where} names shared memory region '{region}' but sets no {BYTE_SIZE}")
    numbers = []
    for field, value in ((OFFSET, parameters.get(OFFSET, 0)), (BYTE_SIZE, parameters[BYTE_SIZE])):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise invalid(f"{where}: {field} must be a non-negative integer, got {value!r}")
        numbers.append(value)
    return region, numbers[0], numbers[1]


def data_and_region(name: str) -> ModelhostError:
    """An input that names a region and also carries its data: Triton refuses it rather than pick one."""
    return invalid(f"input '{name}' names a shared memory region ({REGION}) and also carries data; "
                   "send its data in one place")


def input_from_region(regions: SharedMemory | None, name: str, datatype: str, shape: tuple[int, ...],
                      parameters: Mapping[str, Any], model: str = "") -> np.ndarray:
    """The input's tensor as a read-only view of its region; the caller has checked `shape` (ElementBudget)."""
    where = f"input '{name}'"
    place = placement(parameters, where)
    assert place is not None, "called for inputs that name a region"
    region, offset, size = place
    if datatype != "BYTES":
        needed = math.prod(shape) * DATATYPE_DTYPES[datatype].itemsize
        if size != needed:
            # Triton's words first (its qa/L0_shared_memory matches them), then what they mean here
            raise invalid(f"input byte size mismatch for input '{name}' for model '{model}'. Expected {needed}, "
                          f"got {size}: {BYTE_SIZE} {size} does not match shape {format_shape(shape)} of "
                          f"{datatype}")
    span = _regions(regions, where).region(region, where).span(offset, size, where)
    return tensor_from_bytes(name, datatype, shape, span.toreadonly())


def check_output_regions(regions: SharedMemory | None, outputs: Sequence[RequestedOutput]) -> None:
    """Before inference: each requested output that names a region names a registered one, within its bounds."""
    for output in outputs:
        if output.parameters:
            where = f"output '{output.name}'"
            place = placement(output.parameters, where)
            if place is not None:
                region, offset, size = place
                _regions(regions, where).region(region, where).span(offset, size, where).release()


def write_outputs(regions: SharedMemory | None, response: InferResponse, request: InferRequest) -> set[str]:
    """After inference: copy each output requested in a region into it; the names of those written."""
    placed: set[str] = set()
    for output in request.outputs or ():
        if REGION not in output.parameters:  # every output of an ordinary request: one lookup
            continue
        where = f"output '{output.name}'"
        place = placement(output.parameters, where)
        array = response.outputs.get(output.name)
        if place is None or array is None:
            continue
        region, offset, size = place
        data = tensor_view(array)
        if len(data) > size:
            raise invalid(f"{where} is {len(data)} bytes, more than its {BYTE_SIZE} {size} in region '{region}'")
        span = _regions(regions, where).region(region, where).span(offset, len(data), where)
        span[:] = data
        span.release()
        placed.add(output.name)
    return placed


def _regions(regions: SharedMemory | None, where: str) -> SharedMemory:
    if regions is None:
        raise ModelhostError(ErrorKind.UNSUPPORTED, f"{where}: shared memory is not taken on this endpoint")
    if not regions.enabled:
        raise ModelhostError(ErrorKind.PRECONDITION, f"{where} names a shared memory region, but client shared "
                             f"memory is off: the server takes it when started with {FLAG}")
    return regions
