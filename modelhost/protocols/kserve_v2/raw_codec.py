"""Triton's raw binary request (Inference-Header-Content-Length: 0): the body is all of the model's only input.

Read against the model's metadata (DataPlane.decode_and_infer), batch 1, every output sent back binary.
As Triton: the input's dims may hold at most one -1, which the body's size decides; a BYTES input must
have shape [1] and the body is its one element.
"""

from __future__ import annotations

import math

import numpy as np

from modelhost.errors import invalid
from modelhost.types import DATATYPE_DTYPES, InferRequest, ModelMetadata, format_shape


def decode_raw_request(body: bytes | memoryview, metadata: ModelMetadata) -> InferRequest:
    if len(metadata.inputs) != 1:
        raise invalid(  # Triton's words first, which its qa/L0_http matches
            f"Raw request must only have 1 input (found 1) to be deduced but got {len(metadata.inputs)} inputs in "
            f"'{metadata.name}' model configuration: a raw binary request (Inference-Header-Content-Length: 0) "
            "needs a model with exactly one input"
        )
    [spec] = metadata.inputs
    batch = (1,) if metadata.max_batch_size > 0 else ()
    dims = spec.shape[len(batch):]
    if spec.datatype == "BYTES":
        if dims != (1,):  # Triton's rule and words: the body is one element, so the shape must say one element
            raise invalid(f"For BYTE datatype raw input '{spec.name}', the model must have input shape [1]; "
                          f"'{metadata.name}' has {format_shape(dims)}")
        array = np.array([bytes(body)], dtype=object).reshape(batch + (1,))
    else:
        shape = batch + _decided(spec.name, spec.datatype, dims, len(body))
        array = np.frombuffer(body, dtype=DATATYPE_DTYPES[spec.datatype]).reshape(shape)
    return InferRequest(metadata.name, {spec.name: array}, parameters={"binary_data_output": True})


def _decided(name: str, datatype: str, dims: tuple[int, ...], size: int) -> tuple[int, ...]:
    """`dims` with its -1 set by the body's `size` in bytes."""
    if dims.count(-1) > 1:
        raise invalid(
            f"The shape of the raw input '{name}' can not be deduced because there are more than one variable-sized "
            f"dimension: its dims are {format_shape(dims)}, and a raw binary body decides at most one"
        )
    count, rest = divmod(size, DATATYPE_DTYPES[datatype].itemsize)
    fixed = math.prod(d for d in dims if d != -1)
    if rest or (count % fixed if -1 in dims else count != fixed):
        raise invalid(
            f"raw binary body of {size} bytes does not fit input '{name}' ({datatype}, dims {format_shape(dims)})"
        )
    return tuple(count // fixed if d == -1 else d for d in dims)
