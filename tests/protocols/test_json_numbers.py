"""The one JSON-numbers converter behind the V2 and TF Serving JSON codecs."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import orjson
import pytest

from modelhost.errors import ErrorKind, ModelhostError
from modelhost.protocols.json_numbers import DIRECT_MIN_ROWS, json_numbers
from modelhost.protocols.kserve_v2.codec import decode_infer_request
from modelhost.protocols.tfserving.json_codec import decode_predict
from modelhost.types import TensorSpec


@pytest.mark.parametrize(
    ("datatype", "value", "dtype"),
    [
        ("BOOL", [True, False], np.bool_),
        ("UINT8", [0, 255], np.uint8),
        ("UINT16", [0, 65535], np.uint16),
        ("UINT32", [0, 2**32 - 1], np.uint32),
        ("UINT64", [0, 2**63, 2**64 - 1], np.uint64),
        ("INT8", [-128, 127], np.int8),
        ("INT16", [-(2**15), 2**15 - 1], np.int16),
        ("INT32", [-(2**31), 2**31 - 1], np.int32),
        ("INT64", [-(2**63), 2**53 + 1, 2**63 - 1], np.int64),
        ("FP16", [0.5, 2], np.float16),
        ("FP32", [[1, 2.5], [-3, 1e-3]], np.float32),
        ("FP64", [0.1, -7], np.float64),
        ("INT64", [[-(2**63), 1], [2**63 - 1, 0]], np.int64),  # rows, as TF Serving's instances send them
        ("UINT8", [[[0, 1], [2, 3]], [[4, 5], [6, 255]]], np.uint8),
        ("BOOL", [[True], [False]], np.bool_),
        ("FP16", [[1, 0.25]], np.float16),
    ],
)
def test_every_numeric_datatype_is_exact(datatype: str, value: list[Any], dtype: type) -> None:
    array = json_numbers(value, datatype, "input 'x'")
    assert array.dtype == np.dtype(dtype)
    assert array.tolist() == np.array(value, dtype=dtype).tolist()
    if np.dtype(dtype).kind in "iu":
        assert array.tolist() == value  # no detour through float64


def test_scalars_and_empty_lists() -> None:
    assert json_numbers(3, "INT32", "x").shape == ()
    empty = json_numbers([], "INT64", "x")
    assert empty.shape == (0,) and empty.dtype == np.int64


@pytest.mark.parametrize(
    ("datatype", "value", "words"),
    [
        ("INT32", [1.0, 2], "is INT32, so its data must be integers"),
        ("INT64", [True, 1], "is INT64, so its data must be integers"),
        ("UINT64", [1, None], "is UINT64, so its data must be integers"),
        ("UINT8", ["1"], "is UINT8, so its data must be integers"),
        ("FP32", [1, "2"], "is FP32, so its data must be numbers"),
        ("FP64", [None], "is FP64, so its data must be numbers"),
        ("BOOL", [1, 0], "is BOOL, so its data must be true/false"),
        ("INT8", [1, 128], "has values outside the range of INT8"),
        ("UINT64", [-1, 2**64 - 1], "has values outside the range of UINT64"),
        ("INT64", [2**63], "has values outside the range of INT64"),
        ("FP32", [[1, 2], [3]], "is a ragged list"),
        ("INT8", [[1, 2], [3, 128]], "has values outside the range of INT8"),
        ("INT32", [[1, 2], [3, 4.0]], "is INT32, so its data must be integers"),
        ("FP32", [[1, 2], 3], "is a ragged list"),
        ("INT64", [[1, [2]], [3, 4]], "is a ragged list"),
        ("FP32", [[1, 2], []], "is a ragged list"),
        ("FP32", [[1, 2], "ab"], "is a ragged list"),  # a string as long as the rows: not flattened into them
        ("BOOL", [[True, 1]], "is BOOL, so its data must be true/false"),
    ],
)
def test_errors_name_the_field_and_the_problem(datatype: str, value: list[Any], words: str) -> None:
    with pytest.raises(ModelhostError) as info:
        json_numbers(value, datatype, "instances[3]: input 'x'")
    assert info.value.kind is ErrorKind.INVALID_INPUT
    assert info.value.message.startswith("instances[3]: input 'x'")
    assert words in info.value.message, info.value.message


def rows_of(width: int, last: list[Any] | None = None) -> list[Any]:
    """DIRECT_MIN_ROWS rows of `width` integers (the direct way's size), the last one replaced by `last`."""
    rows: list[Any] = [[row * width + column for column in range(width)] for row in range(DIRECT_MIN_ROWS)]
    if last is not None:
        rows[-1] = last
    return rows


def test_long_integer_lists_convert_exactly() -> None:
    rows = rows_of(3, [-(2**63), 2**53 + 1, 2**63 - 1])
    array = json_numbers(rows, "INT64", "x")
    assert array.shape == (DIRECT_MIN_ROWS, 3) and array.dtype == np.int64 and array.tolist() == rows
    deep = [[[1, 2], [3, 4]]] * DIRECT_MIN_ROWS
    assert json_numbers(deep, "UINT8", "x").shape == (DIRECT_MIN_ROWS, 2, 2)
    flat = list(range(-100, 100))
    assert json_numbers(flat, "INT16", "x").tolist() == flat


@pytest.mark.parametrize(
    ("datatype", "value", "words"),
    [
        ("INT8", rows_of(2, [1, 128]), "has values outside the range of INT8"),
        ("UINT64", rows_of(2, [0, -1]), "has values outside the range of UINT64"),
        ("INT32", rows_of(2, [1, 2.0]), "is INT32, so its data must be integers"),
        ("INT64", rows_of(2, [1, True]), "is INT64, so its data must be integers"),
        ("INT64", rows_of(2, [1, None]), "is INT64, so its data must be integers"),
        ("INT64", rows_of(2, [1, 2, 3]), "is a ragged list"),
        ("INT64", rows_of(2, [1, [2]]), "is a ragged list"),
        ("INT64", rows_of(2, "ab"), "is a ragged list"),
        ("INT64", rows_of(2, 7), "is a ragged list"),
    ],
)
def test_long_integer_lists_are_refused_as_short_ones_are(datatype: str, value: list[Any], words: str) -> None:
    with pytest.raises(ModelhostError) as info:
        json_numbers(value, datatype, "input 'x'")
    assert info.value.kind is ErrorKind.INVALID_INPUT
    assert words in info.value.message, info.value.message


def test_bytes_is_not_a_numeric_datatype() -> None:
    with pytest.raises(ValueError, match="BYTES"):
        json_numbers(["a"], "BYTES", "x")


def test_floats_accept_nan_and_infinity() -> None:
    array = json_numbers([math.nan, -math.inf], "FP32", "x")
    assert math.isnan(array[0]) and array[1] == -math.inf


def test_both_codecs_keep_64_bit_integers_exact() -> None:
    values = [2**63 - 1, 2**53 + 1, -(2**63)]
    rows, _ = decode_predict(orjson.dumps({"instances": values}), [TensorSpec("x", "INT64", (-1,))])
    body = orjson.dumps({"inputs": [{"name": "x", "datatype": "INT64", "shape": [3], "data": values}]})
    v2 = decode_infer_request(body, None, "m").inputs["x"]
    assert rows["x"].tolist() == v2.tolist() == values


def test_both_codecs_refuse_booleans_for_integers_alike() -> None:
    with pytest.raises(ModelhostError, match="'x' is INT32, so its data must be integers"):
        decode_predict(orjson.dumps({"inputs": [True, 1]}), [TensorSpec("x", "INT32", (-1,))])
    body = orjson.dumps({"inputs": [{"name": "x", "datatype": "INT32", "shape": [2], "data": [True, 1]}]})
    with pytest.raises(ModelhostError, match="input 'x' is INT32, so its data must be integers"):
        decode_infer_request(body, None, "m")
