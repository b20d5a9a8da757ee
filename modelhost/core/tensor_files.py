"""Tensors read from files of a model's directory: model_warmup's `input_data_file` (in `warmup/`) and a
sequence state's `initial_state` `data_file` (in `initial_state/`), both as Triton reads them.

A file holds the tensor's raw bytes, row-major: little-endian numbers, one byte per BOOL, and for BYTES
(TYPE_STRING) each element as a 4-byte little-endian length and its bytes. Bytes past the tensor's are
ignored, as Triton ignores them. The file must lie inside its folder: no absolute path, no `..`, no symlink
out (the resolved path is checked). Messages name the file by its path in the model's directory, never the
server's.
"""

from __future__ import annotations

import math
import struct
from pathlib import Path

import numpy as np

from modelhost.config.pbtxt import ConfigError
from modelhost.types import DATATYPE_DTYPES, format_shape

_LENGTH = struct.Struct("<I")


def read_tensor_file(model_dir: Path, folder: str, filename: str, datatype: str, dims: tuple[int, ...],
                     where: str, field: str) -> np.ndarray:
    """The tensor of V2 `datatype` and `dims` in `model_dir/folder/filename`; ConfigError naming `where` and
    the config `field` when the file is outside the folder, unreadable or too short."""
    directory = model_dir / folder
    path = directory / filename
    if not filename or Path(filename).is_absolute() or not path.resolve().is_relative_to(directory.resolve()):
        raise ConfigError(f"{where}: {field} '{filename}' must name a file inside {folder}/ of the model's "
                          "directory")
    shown = f"{folder}/{filename}"
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"{where}: cannot read {field} {shown}: {exc.strerror or exc}") from None
    count = math.prod(dims)
    dtype = DATATYPE_DTYPES[datatype]
    if dtype == np.object_:
        return _strings(data, count, shown, where).reshape(dims)
    need = count * dtype.itemsize
    if len(data) < need:
        raise ConfigError(f"{where}: {field} {shown} has {len(data)} bytes; dims {format_shape(dims)} "
                          f"of {datatype} need {need}")
    if dtype == np.bool_:
        flags: np.ndarray = np.frombuffer(data, np.uint8, count) != 0
        return flags.reshape(dims)
    # Raw tensor bytes are little-endian (as Triton's wire format); astype copies into native order.
    return np.frombuffer(data, dtype.newbyteorder("<"), count).astype(dtype).reshape(dims)


def _strings(data: bytes, count: int, shown: str, where: str) -> np.ndarray:
    """`count` length-prefixed elements from the start of `data`."""
    elements = np.empty(count, dtype=object)
    offset = 0
    for i in range(count):
        if offset + _LENGTH.size > len(data):
            raise ConfigError(f"{where}: {shown} holds {i} BYTES element(s); dims need {count}")
        (length,) = _LENGTH.unpack_from(data, offset)
        offset += _LENGTH.size
        if offset + length > len(data):
            raise ConfigError(f"{where}: {shown}: element {i} says {length} bytes, but only "
                              f"{len(data) - offset} follow")
        elements[i] = data[offset:offset + length]
        offset += length
    return elements
