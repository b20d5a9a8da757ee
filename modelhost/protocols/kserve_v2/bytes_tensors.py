"""BYTES tensors <-> Triton's wire form: each element as a 4-byte little-endian length, then its bytes.

Shared by HTTP binary data, gRPC raw contents, shared memory and the client. Elements of one length (ids,
hashes, fixed-width codes) are read and written by numpy in one strided pass; other bodies are read by one
tight loop and written by one join. A body that does not parse is read again by the careful loop, which names
the element.
"""

from __future__ import annotations

import struct

import numpy as np

from modelhost.errors import invalid

_U32 = struct.Struct("<I")
_FEW = 64  # elements: below, numpy's fixed cost is more than a loop over them


def split_elements(name: str, chunk: memoryview, count: int) -> list[bytes]:
    """The `count` elements of a BYTES tensor's wire bytes; INVALID_INPUT naming input `name` where they do not
    parse or are not `count`."""
    data = bytes(chunk)
    if not count:
        return _careful_split(name, data, count)
    elements = _same_length_split(data, count) if count >= _FEW else None
    if elements is not None:
        return elements
    elements = []
    append, unpack, offset = elements.append, _U32.unpack_from, 0
    try:
        for _ in range(count):
            (length,) = unpack(data, offset)
            start = offset + 4
            offset = start + length
            append(data[start:offset])
    except struct.error:  # a truncated length prefix
        return _careful_split(name, data, count)
    if offset != len(data):  # the last element ran past the data, or data follows the last element
        return _careful_split(name, data, count)
    return elements


def _same_length_split(data: bytes, count: int) -> list[bytes] | None:
    if len(data) < 4:
        return None
    (length,) = _U32.unpack_from(data, 0)
    stride = 4 + length
    if len(data) != count * stride:
        return None
    prefixes = np.ndarray((count,), dtype="<u4", buffer=data, strides=(stride,))
    if not (prefixes == length).all():
        return None
    if not length:
        return [b""] * count
    values: list[bytes] = np.ndarray((count,), dtype=f"V{length}", buffer=data, offset=4, strides=(stride,)).tolist()
    return values


def _careful_split(name: str, data: bytes, count: int) -> list[bytes]:
    elements: list[bytes] = []
    offset, end = 0, len(data)
    while offset < end:
        if offset + 4 > end:
            raise invalid(f"input '{name}': BYTES element {len(elements)} has a truncated 4-byte length prefix")
        (length,) = _U32.unpack_from(data, offset)
        offset += 4
        if offset + length > end:
            raise invalid(f"input '{name}': BYTES element {len(elements)} of {length} bytes runs past its data")
        elements.append(data[offset : offset + length])
        offset += length
    if len(elements) != count:
        raise invalid(f"input '{name}' has {len(elements)} BYTES elements, but its shape needs {count}")
    return elements


def join_elements(array: np.ndarray) -> bytes:
    """The wire bytes of a BYTES tensor (elements bytes, or anything else as its str in UTF-8), in row-major order."""
    if array.size < _FEW:
        parts: list[bytes] = []
        for item in array.flat:
            data = item if isinstance(item, bytes) else str(item).encode("utf-8")
            parts += (_U32.pack(len(data)), data)
        return b"".join(parts)
    items = array.reshape(-1).tolist()
    kinds = set(map(type, items))
    if kinds == {str}:
        items = list(map(str.encode, items))
    elif kinds - {bytes}:
        items = [item if isinstance(item, bytes) else str(item).encode("utf-8") for item in items]
    count = len(items)
    lengths = np.fromiter(map(len, items), dtype=np.int64, count=count)
    if lengths.min() == lengths.max():
        rows = np.empty((count, 4 + int(lengths[0])), dtype=np.uint8)
        rows[:, :4] = lengths[:1].astype("<u4").view(np.uint8)
        rows[:, 4:] = np.frombuffer(b"".join(items), dtype=np.uint8).reshape(count, -1)
        return rows.tobytes()
    joined: list[bytes] = [b""] * (2 * count)
    joined[::2] = map(_U32.pack, lengths.tolist())
    joined[1::2] = items
    return b"".join(joined)
