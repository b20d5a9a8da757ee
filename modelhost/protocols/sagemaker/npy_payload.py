"""application/x-npy bodies <-> one array (NumPy's .npy format, as the SageMaker SDK's NumpySerializer writes).

Decoding loads without pickle: object arrays and non-.npy bodies are refused. The array becomes the input's
datatype as JSON values would: integers and floats become a float datatype (rounding to its precision),
integers become an integer datatype that holds their values, booleans only BOOL; fixed-width bytes or text
("S"/"U" arrays) become BYTES. Anything else is refused rather than silently changed.
Encoding writes the single output; BYTES outputs become fixed-width bytes ("S"), which numpy reads back without
pickle (and which, as numpy's fixed-width bytes do, drop trailing NUL bytes).
"""

from __future__ import annotations

import io

import numpy as np
from numpy.lib import format as npy_format

from modelhost.errors import invalid
from modelhost.protocols.sagemaker.media_types import NPY, MediaTypeError
from modelhost.types import DATATYPE_DTYPES, DEFAULT_LIMITS, RequestLimits, TensorSpec, format_shape

_NPY_MAGIC = b"\x93NUMPY"
_HEADER_READERS = {(1, 0): npy_format.read_array_header_1_0, (2, 0): npy_format.read_array_header_2_0}


def decode_npy(body: bytes, spec: TensorSpec, limits: RequestLimits = DEFAULT_LIMITS) -> np.ndarray:
    """The array in a .npy body as `spec`'s datatype; INVALID_INPUT when it is not one safe .npy array.

    The header is read and its shape checked against `limits` before anything is allocated: the data then
    is a view of `body` (numpy's own loader allocates the shape the header declares before reading).
    """
    if not body.startswith(_NPY_MAGIC):
        raise invalid("request body is not a .npy array (it does not start with the \\x93NUMPY magic)")
    stream = io.BytesIO(body)
    try:
        version = npy_format.read_magic(stream)
        if version not in _HEADER_READERS:
            raise ValueError(f".npy format version {version[0]}.{version[1]} is not supported (1.0 and 2.0 are)")
        shape, fortran_order, dtype = _HEADER_READERS[version](stream)
    except ValueError as error:
        raise invalid(f"request body is not a valid .npy array: {error}") from None
    if dtype.hasobject:
        raise invalid(
            "the .npy body holds Python objects, which are only readable by unpickling, and modelhost "
            "does not unpickle requests; send numbers or fixed-width strings"
        )
    if dtype.names is not None or dtype.shape or dtype.itemsize == 0:
        raise invalid(f"the .npy array has dtype {dtype}; send an array of numbers or fixed-width strings")
    count = limits.budget().take(f"the .npy array for input '{spec.name}'", shape)
    offset = stream.tell()
    if len(body) - offset != count * dtype.itemsize:
        raise invalid(
            f"the .npy array has {len(body) - offset} bytes of data, but its header's shape {format_shape(shape)} "
            f"of {dtype} needs {count * dtype.itemsize}"
        )
    array = np.frombuffer(body, dtype=dtype, count=count, offset=offset)
    return _as_input(array.reshape(shape, order="F" if fortran_order else "C"), spec)


def _as_input(array: np.ndarray, spec: TensorSpec) -> np.ndarray:
    target = DATATYPE_DTYPES.get(spec.datatype)
    if target is None:
        raise invalid(f"input '{spec.name}' is {spec.datatype}, which cannot be sent as .npy")
    source = array.dtype
    if spec.datatype == "BYTES":
        if source.kind not in "SU":
            raise invalid(f"the .npy array is {source}, but input '{spec.name}' is BYTES; send a bytes or str array")
        flat = np.empty(array.size, dtype=object)
        flat[:] = [bytes(e) if source.kind == "S" else str(e).encode("utf-8") for e in array.flat]
        return flat.reshape(array.shape)
    if not _fits(array, target):
        raise invalid(
            f"the .npy array is {source}, which cannot become input '{spec.name}' ({spec.datatype}) "
            "without changing values"
        )
    return np.ascontiguousarray(array, dtype=target)


def _fits(array: np.ndarray, target: np.dtype) -> bool:
    source = array.dtype.kind
    if target.kind == "f":
        return source in "iuf"
    if target.kind in "iu":
        if source not in "iu":
            return False
        info = np.iinfo(target)
        return array.size == 0 or (int(array.min()) >= info.min and int(array.max()) <= info.max)
    return source == target.kind  # BOOL takes booleans only


def encode_npy(outputs: dict[str, np.ndarray]) -> bytes:
    """The .npy bytes of the only output; MediaTypeError(406) when there are several."""
    if len(outputs) != 1:
        names = ", ".join(f"'{name}'" for name in outputs)
        raise MediaTypeError(
            406, f"{NPY} holds one array, but the response has {len(outputs)} outputs ({names}); "
            "ask for application/json, or request one output"
        )
    array = next(iter(outputs.values()))
    if array.dtype.kind == "O":
        encoded = [e if isinstance(e, bytes) else str(e).encode("utf-8") for e in array.flat]
        array = np.array(encoded, dtype=np.bytes_).reshape(array.shape)
    buffer = io.BytesIO()
    np.save(buffer, array, allow_pickle=False)
    return buffer.getvalue()
