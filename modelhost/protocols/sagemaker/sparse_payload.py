"""application/x-npz and text/libsvm bodies -> the dense rows of a model's one float input [batch, width].

- application/x-npz: what scipy.sparse.save_npz writes (the SageMaker SDK's SparseMatrixSerializer): a zip of .npy
  arrays, `format` (csr, csc or coo), `shape`, `data` and that format's index arrays (`indices` and `indptr`, or
  `row` and `col`). Read with numpy's .npy reader, pickles refused, no scipy needed; duplicate entries add up, as
  scipy's toarray adds them.
- text/libsvm: one row per non-empty line, `[label] index:value ...`, indices 0-based as SageMaker's XGBoost
  container reads them; a leading token without ':' is the label, which inference does not use.

The input must be the model's only (required) one, floating point, with a fixed width: what else could take
sparse rows is ambiguous, so `sparse_input` refuses with a 415 listing what the model accepts (`accepted_types`).
Bounds, before anything is allocated: the dense rows x width against the request's element budget; each zip
member's size, declared and actual, against what that shape's arrays can need; every index against the shape.
"""

from __future__ import annotations

import io
import lzma
import zipfile
import zlib
from collections.abc import Sequence

import numpy as np

from modelhost.errors import client_value, invalid
from modelhost.protocols.sagemaker import media_types as types
from modelhost.protocols.sagemaker.media_types import MediaTypeError
from modelhost.types import DATATYPE_DTYPES, RequestLimits, TensorSpec, format_shape

_FLOATS = ("FP16", "FP32", "FP64")
# What zipfile, its decompressors and numpy's .npy reader raise for bytes they cannot read (an encrypted member:
# RuntimeError; an unknown compression method: NotImplementedError).
_UNREADABLE = (zipfile.BadZipFile, zipfile.LargeZipFile, zlib.error, lzma.LZMAError, NotImplementedError, RuntimeError,
               EOFError, OSError, ValueError, TypeError)
_INDEX_ARRAYS = {"csr": ("indices", "indptr"), "csc": ("indices", "indptr"), "coo": ("row", "col")}
_SMALL = 1024  # a .npy of a few values: its header (128 bytes as numpy writes it) and data
_LIBSVM_BASE = "0-based, as SageMaker's XGBoost container reads libsvm"


def accepted_types(inputs: Sequence[TensorSpec]) -> list[str]:
    """The request Content-Types a model with `inputs` can take (aliases left out)."""
    names = [types.JSON, types.JSONLINES, types.PROTOBUF, types.OCTET_STREAM, types.TRITON_BINARY]
    required = [spec for spec in inputs if not spec.optional] or list(inputs)
    if len(required) == 1:
        names[1:1] = [types.CSV, types.NPY]
        if _sparse_width(required[0]) is not None:
            names[3:3] = [types.NPZ, types.LIBSVM]
    return names


def sparse_input(inputs: Sequence[TensorSpec], content_type: str) -> TensorSpec:
    """The input sparse rows fill; MediaTypeError(415) listing what the model accepts when there is none."""
    required = [spec for spec in inputs if not spec.optional] or list(inputs)
    if len(required) == 1 and _sparse_width(required[0]) is not None:
        return required[0]
    shown = ", ".join(f"'{s.name}' {s.datatype} {format_shape(s.shape)}" for s in inputs) or "none"
    raise MediaTypeError(415, f"Content-Type '{content_type}' is not supported by this model: its sparse rows fill "
                              f"one floating-point input of fixed width [batch, width], and the model's inputs are "
                              f"{shown}; it accepts: {', '.join(accepted_types(inputs))}")


def _sparse_width(spec: TensorSpec) -> int | None:
    if spec.datatype in _FLOATS and len(spec.shape) == 2 and spec.shape[1] > 0:
        return spec.shape[1]
    return None


def decode_npz(body: bytes, spec: TensorSpec, limits: RequestLimits) -> np.ndarray:
    """The dense batch of the sparse matrix in an npz body; INVALID_INPUT naming the array and the problem."""
    try:
        with zipfile.ZipFile(io.BytesIO(body)) as archive:
            kind = _member(archive, "format", _SMALL).item()
            kind = kind.decode("ascii", "replace") if isinstance(kind, bytes) else str(kind)
            if kind not in _INDEX_ARRAYS:
                raise invalid(f"npz body: sparse format {client_value(kind)} is not supported; send csr, csc or coo "
                              "(scipy.sparse.save_npz of one of those)")
            rows, columns = _shape(_member(archive, "shape", _SMALL), spec)
            elements = limits.budget().take(f"the npz body for input '{spec.name}'", (rows, columns))
            bound = 8 * (elements + max(rows, columns) + 1) + _SMALL  # the most this shape's arrays can need
            data, first, second = (_member(archive, name, bound) for name in ("data", *_INDEX_ARRAYS[kind]))
    except _UNREADABLE as error:
        raise invalid(f"npz body is not a zip of .npy arrays as scipy.sparse.save_npz writes: {error}") from None
    row_ids, column_ids = _coordinates(kind, first, second, rows, columns)
    _check_data(data, row_ids)
    flat = row_ids.astype(np.int64) * columns + column_ids.astype(np.int64)
    dense = np.bincount(flat, weights=data.astype(np.float64), minlength=rows * columns)
    return dense.reshape(rows, columns).astype(DATATYPE_DTYPES[spec.datatype])


def _member(archive: zipfile.ZipFile, name: str, bound: int) -> np.ndarray:
    try:
        info = archive.getinfo(f"{name}.npy")
    except KeyError:
        raise invalid(f"npz body has no '{name}' array (scipy.sparse.save_npz writes one)") from None
    if info.file_size > bound:
        raise invalid(f"npz body: array '{name}' is {info.file_size} bytes, more than its shape can need ({bound})")
    with archive.open(info) as member:
        raw = member.read(bound + 1)
    if len(raw) > bound:
        raise invalid(f"npz body: array '{name}' is more than its shape can need ({bound} bytes)")
    array = np.lib.format.read_array(io.BytesIO(raw), allow_pickle=False)
    if name != "format" and (array.ndim != 1 or array.dtype.kind not in ("fiu" if name == "data" else "iu")):
        raise invalid(f"npz body: array '{name}' must be one-dimensional "
                      f"{'numbers' if name == 'data' else 'integers'}, got {array.dtype} {list(array.shape)}")
    return array


def _shape(array: np.ndarray, spec: TensorSpec) -> tuple[int, int]:
    if array.shape != (2,) or array.dtype.kind not in "iu" or int(array.min()) < 0:
        raise invalid(f"npz body: 'shape' must be two non-negative integers, got {client_value(array.tolist())}")
    rows, columns = (int(value) for value in array)
    if columns != spec.shape[1]:
        raise invalid(f"npz body: the matrix has {columns} columns, but input '{spec.name}' takes {spec.shape[1]} "
                      f"per row (shape {format_shape(spec.shape)})")
    return rows, columns


def _coordinates(kind: str, first: np.ndarray, second: np.ndarray, rows: int,
                 columns: int) -> tuple[np.ndarray, np.ndarray]:
    """Each stored value's row and column, checked against the shape."""
    if kind == "coo":
        row_ids, column_ids = first, second
    else:
        outer = rows if kind == "csr" else columns
        if second.shape != (outer + 1,) or second[0] != 0 or np.any(np.diff(second) < 0) or second[-1] != len(first):
            raise invalid(f"npz body: 'indptr' must hold {outer + 1} non-decreasing offsets from 0 to the "
                          f"{len(first)} stored values")
        owners = np.repeat(np.arange(outer), np.diff(second))
        row_ids, column_ids = (owners, first) if kind == "csr" else (first, owners)
    if len(row_ids) != len(column_ids):
        raise invalid(f"npz body: 'row' has {len(row_ids)} entries and 'col' {len(column_ids)}; they must match")
    for name, ids, size in (("row", row_ids, rows), ("column", column_ids, columns)):
        if len(ids) and (int(ids.min()) < 0 or int(ids.max()) >= size):
            raise invalid(f"npz body: a {name} index is outside the matrix's {size} {name}s")
    return row_ids, column_ids


def _check_data(data: np.ndarray, row_ids: np.ndarray) -> None:
    if len(data) != len(row_ids):
        raise invalid(f"npz body: 'data' has {len(data)} values, but the index arrays place {len(row_ids)}")


def decode_libsvm(body: bytes, spec: TensorSpec, limits: RequestLimits) -> np.ndarray:
    """The dense batch of a libsvm body; INVALID_INPUT naming the line and the token."""
    try:
        text = body.decode("utf-8-sig")
    except UnicodeDecodeError as error:
        raise invalid(f"libsvm body is not UTF-8 text: {error}") from None
    lines = [(number, line.split()) for number, line in enumerate(text.splitlines(), 1) if line.strip()]
    if not lines:
        raise invalid("libsvm body has no lines with values; send one row per line, '[label] index:value ...'")
    width = spec.shape[1]
    limits.budget().take(f"the libsvm body for input '{spec.name}'", (len(lines), width))
    dense = np.zeros((len(lines), width), dtype=DATATYPE_DTYPES[spec.datatype])
    for row, (number, tokens) in enumerate(lines):
        for place, token in enumerate(tokens):
            index, colon, value = token.partition(":")
            if not colon and place == 0:
                continue  # the label
            column = _index(index, colon, token, number, width, spec)
            dense[row, column] = _value(value, token, number)
    return dense


def _index(text: str, colon: str, token: str, line: int, width: int, spec: TensorSpec) -> int:
    if not colon or not text.isascii() or not text.isdigit():
        raise invalid(f"libsvm line {line}: {client_value(token)} is not index:value (only the first token may be "
                      "a label)")
    if len(text) > 18 or int(text) >= width:  # 18 digits: int() of any length is never attempted
        raise invalid(f"libsvm line {line}: feature index {client_value(text)[1:-1]} is outside input "
                      f"'{spec.name}''s {width} columns ({_LIBSVM_BASE})")
    return int(text)


def _value(text: str, token: str, line: int) -> float:
    try:
        return float(text)
    except ValueError:
        raise invalid(f"libsvm line {line}: the value in {client_value(token)} is not a number") from None
