"""TF Serving REST JSON codec: row and columnar predict bodies <-> arrays by name (protocols §5.2, §5.4)."""

from __future__ import annotations

import base64
import math
from typing import Any

import numpy as np
import orjson
import pytest

from modelhost.errors import ErrorKind, ModelhostError
from modelhost.protocols.tfserving.json_codec import COLUMNAR, ROW, decode_predict, encode_predict
from modelhost.types import RequestLimits, TensorSpec

X = TensorSpec("x", "FP32", (-1, 2))
IDS = TensorSpec("ids", "INT64", (-1, 3))
MASK = TensorSpec("mask", "BOOL", (-1,))
TEXT = TensorSpec("text", "BYTES", (-1,))


def decode(document: Any, *specs: TensorSpec) -> tuple[dict[str, np.ndarray], str]:
    return decode_predict(orjson.dumps(document), specs)


def encode(outputs: dict[str, np.ndarray], form: str) -> Any:
    return orjson.loads(encode_predict(outputs, form))


def b64(data: bytes) -> dict[str, str]:
    return {"b64": base64.b64encode(data).decode("ascii")}


ROUND_TRIPS = [
    pytest.param(X, [[1.5, -2.0], [0.25, 3.0]], np.float32, id="FP32"),
    pytest.param(IDS, [[1, 2**40, -7], [0, 0, 2**62]], np.int64, id="INT64"),
    pytest.param(MASK, [True, False, True], np.bool_, id="BOOL"),
    pytest.param(TEXT, ["héllo", "", "x y"], np.object_, id="BYTES"),
]


@pytest.mark.parametrize(("spec", "rows", "dtype"), ROUND_TRIPS)
def test_row_round_trip(spec: TensorSpec, rows: list[Any], dtype: type) -> None:
    arrays, form = decode({"instances": rows}, spec)
    assert form == ROW
    assert arrays[spec.name].dtype == dtype
    assert arrays[spec.name].shape[0] == len(rows)
    assert encode(arrays, form) == {"predictions": rows}


@pytest.mark.parametrize(("spec", "rows", "dtype"), ROUND_TRIPS)
def test_columnar_round_trip(spec: TensorSpec, rows: list[Any], dtype: type) -> None:
    arrays, form = decode({"inputs": rows}, spec)
    assert form == COLUMNAR
    assert arrays[spec.name].dtype == dtype
    assert encode(arrays, form) == {"outputs": rows}


def test_bytes_inputs_become_bytes_objects() -> None:
    arrays, _ = decode({"instances": ["héllo", b64(b"\xff\x00")]}, TEXT)
    assert arrays["text"].tolist() == ["héllo".encode(), b"\xff\x00"]


def test_rows_may_name_their_inputs_in_any_order() -> None:
    arrays, _ = decode({"instances": [{"x": [1, 2], "ids": [1, 2, 3]}, {"ids": [4, 5, 6], "x": [3, 4]}]}, X, IDS)
    np.testing.assert_array_equal(arrays["x"], [[1, 2], [3, 4]])
    np.testing.assert_array_equal(arrays["ids"], [[1, 2, 3], [4, 5, 6]])


def test_row_with_several_inputs_round_trips_as_objects() -> None:
    instances = [{"x": [1.0, 2.0], "ids": [1, 2, 3]}, {"x": [3.0, 4.0], "ids": [4, 5, 6]}]
    arrays, form = decode({"instances": instances}, X, IDS)
    assert arrays["x"].shape == (2, 2) and arrays["ids"].shape == (2, 3)
    assert encode(arrays, form) == {"predictions": instances}


def test_columnar_with_several_inputs_allows_different_first_dims() -> None:
    inputs = {"x": [[1.0, 2.0]], "ids": [[1, 2, 3], [4, 5, 6]]}
    arrays, form = decode({"inputs": inputs}, X, IDS)
    assert arrays["x"].shape == (1, 2) and arrays["ids"].shape == (2, 3)
    assert encode(arrays, form) == {"outputs": inputs}


def test_one_input_may_be_named_in_rows_and_columns() -> None:
    rows, _ = decode({"instances": [{"x": [1, 2]}, {"x": [3, 4]}]}, X)
    columns, _ = decode({"inputs": {"x": [[1, 2], [3, 4]]}}, X)
    assert rows["x"].tolist() == columns["x"].tolist() == [[1.0, 2.0], [3.0, 4.0]]


def test_signature_name_is_accepted_and_ignored() -> None:
    arrays, _ = decode({"signature_name": "serving_default", "instances": [[1, 2]]}, X)
    assert arrays["x"].dtype == np.float32


def test_optional_input_may_be_left_out() -> None:
    arrays, _ = decode({"inputs": {"x": [[1, 2]]}}, X, TensorSpec("ids", "INT64", (-1, 3), optional=True))
    assert list(arrays) == ["x"]


def test_row_count_is_checked_against_a_fixed_first_dim() -> None:
    arrays, _ = decode({"instances": [[1, 2], [3, 4]]}, TensorSpec("grid", "FP32", (2, 2)))
    assert arrays["grid"].shape == (2, 2)


def test_bare_nan_and_infinity_tokens_are_accepted() -> None:
    arrays, _ = decode_predict(b'{"instances": [[NaN, -Infinity]]}', [X])
    assert math.isnan(arrays["x"][0, 0]) and arrays["x"][0, 1] == -math.inf


def test_nan_and_infinity_outputs_become_null() -> None:
    outputs = {"y": np.array([np.nan, np.inf, 1.0], dtype=np.float32)}
    assert encode(outputs, COLUMNAR) == {"outputs": [None, None, 1.0]}


def test_bytes_outputs_that_are_not_utf8_go_back_as_b64() -> None:
    outputs = {"text": np.array([b"ok", b"\xff\xfe"], dtype=object)}
    assert encode(outputs, ROW) == {"predictions": ["ok", b64(b"\xff\xfe")]}


def test_bytes_outputs_named_bytes_always_go_back_as_b64() -> None:
    outputs = {"image_bytes": np.array([[b"ok"]], dtype=object)}
    assert encode(outputs, COLUMNAR) == {"outputs": [[b64(b"ok")]]}


def test_several_outputs_in_columnar_form_are_keyed_by_name() -> None:
    outputs = {"score": np.array([0.5], dtype=np.float32), "label": np.array([b"cat"], dtype=object)}
    assert encode(outputs, COLUMNAR) == {"outputs": {"score": [0.5], "label": ["cat"]}}


@pytest.mark.parametrize(
    ("outputs", "names"),
    [
        pytest.param({"y": np.array(1.0, dtype=np.float32)}, ["'y'", "scalar"], id="scalar"),
        pytest.param({"a": np.zeros((2, 1)), "b": np.zeros((3, 1))}, ["'a': 2", "'b': 3", "row format"], id="dim0"),
    ],
)
def test_row_outputs_need_a_shared_first_dim(outputs: dict[str, np.ndarray], names: list[str]) -> None:
    with pytest.raises(ModelhostError) as info:
        encode_predict(outputs, ROW)
    assert info.value.kind is ErrorKind.INVALID_INPUT
    assert all(name in info.value.message for name in names), info.value.message


def test_unknown_form_is_a_programming_error() -> None:
    with pytest.raises(ValueError, match="'rows'"):
        encode_predict({"y": np.zeros(1)}, "rows")


SMALL = TensorSpec("small", "INT8", (-1,))
VARIABLE = TensorSpec("v", "FP32", (-1, -1))
BAD_BODIES = [
    pytest.param(b"not json", [X], ["request body", "JSON"], id="not-json"),
    pytest.param(b"[[1, 2]]", [X], ["request body", "object"], id="not-object"),
    pytest.param({}, [X], ["'instances'", "'inputs'"], id="neither-key"),
    pytest.param({"instances": [[1, 2]], "inputs": [[1, 2]]}, [X], ["'instances'", "'inputs'"], id="both-keys"),
    pytest.param({"signature_name": 1, "instances": [[1, 2]]}, [X], ["'signature_name'"], id="signature-not-str"),
    pytest.param({"instances": {"x": [1, 2]}}, [X], ["'instances'", "list"], id="instances-not-list"),
    pytest.param({"instances": []}, [X], ["'instances'", "empty"], id="instances-empty"),
    pytest.param({"instances": [[1, 2], [3, [4]]]}, [X], ["instances[1]", "'x'", "ragged"], id="ragged"),
    pytest.param({"instances": [[1, 2], [3, 4, 5]]}, [X], ["instances[1]", "'x'", "[3]"], id="wrong-shape"),
    pytest.param({"instances": [[1], [1, 2]]}, [VARIABLE], ["instances[1]", "'v'", "instances[0]"], id="shapes-differ"),
    pytest.param({"instances": [[1, 2]]}, [X, IDS], ["instances[0]", "'x'", "'ids'"], id="row-not-named"),
    pytest.param(
        {"instances": [{"x": [1, 2], "ids": [1, 2, 3], "extra": 1}]}, [X, IDS], ["instances[0]", "'extra'"],
        id="unknown",
    ),
    pytest.param({"instances": [{"x": [1, 2]}]}, [X, IDS], ["instances[0]", "missing", "'ids'"], id="missing"),
    pytest.param(
        {"instances": [{"x": [1, 2], "ids": [1, 2, 3]}, {"x": [3, 4]}]}, [X, IDS], ["instances[1]"], id="keys-differ"
    ),
    pytest.param(
        {"instances": [{"x": [1, 2], "ids": [1, 2, 3]}, {"x": [3, 4], "ids": [4, 5, 6]}, [3, 4]]}, [X, IDS],
        ["instances[2]", "object keyed by input name"], id="later-row-not-named",
    ),
    pytest.param(
        {"instances": [{"x": [1, 2], "ids": [1, 2, 3]}, {"b64": "AAAA"}]}, [X, IDS],
        ["instances[1]", "object keyed by input name"], id="later-row-b64",
    ),
    pytest.param(
        {"instances": [{"x": [1, 2], "ids": [1, 2, 3]}, {"ids": [4, 5, 6], "x": [3, 4]}, {"x": [1, 2], "y": 1}]},
        [X, IDS], ["instances[2]", "'y'", "same inputs"], id="later-row-keys-differ",
    ),
    pytest.param({"instances": [[1, "a"]]}, [X], ["'x'", "FP32", "numbers"], id="string-for-float"),
    pytest.param({"instances": [[1, None]]}, [X], ["'x'", "numbers"], id="null-for-float"),
    pytest.param({"instances": [1, 0]}, [MASK], ["'mask'", "true/false"], id="number-for-bool"),
    pytest.param({"instances": [[1.5, 2, 3]]}, [IDS], ["'ids'", "integers"], id="float-for-int"),
    pytest.param({"instances": [300]}, [SMALL], ["instances[0]", "'small'", "range"], id="out-of-range"),
    pytest.param({"instances": ["a", 5]}, [TEXT], ["instances[1]", "'text'", "a number"], id="number-for-bytes"),
    pytest.param({"instances": [{"b64": "!!"}]}, [TEXT], ["'text'", "'b64'"], id="bad-b64"),
    pytest.param({"instances": [["a"], ["b", ["c"]]]}, [TensorSpec("t", "BYTES", (-1, -1))], ["'t'", "ragged"],
                 id="ragged-bytes"),
    pytest.param({"instances": [1.0]}, [TensorSpec("s", "FP32", ())], ["'s'", "scalar"], id="scalar-in-rows"),
    pytest.param({"instances": [[1, 2]]}, [TensorSpec("f", "FP32", (2, 2))], ["'f'", "2 instances"], id="fixed-rows"),
    pytest.param({"inputs": [[1, 2]]}, [X, IDS], ["'inputs'", "'x'", "'ids'"], id="columnar-not-named"),
    pytest.param({"inputs": {"y": [[1, 2]]}}, [X], ["'inputs'", "'y'"], id="columnar-unknown"),
    pytest.param({"inputs": {"x": [[1, 2]]}}, [X, IDS], ["'inputs'", "missing", "'ids'"], id="columnar-missing"),
    pytest.param({"inputs": [1, 2]}, [X], ["'inputs'", "'x'", "[2]", "[-1,2]"], id="columnar-wrong-shape"),
    pytest.param({"inputs": [[1, 2]]}, [TensorSpec("h", "BF16", (-1, 2))], ["'h'", "BF16"], id="no-json-datatype"),
]


@pytest.mark.parametrize(("body", "specs", "names"), BAD_BODIES)
def test_bad_bodies_name_the_offending_field(body: Any, specs: list[TensorSpec], names: list[str]) -> None:
    raw = body if isinstance(body, bytes) else orjson.dumps(body)
    with pytest.raises(ModelhostError) as info:
        decode_predict(raw, specs)
    assert info.value.kind is ErrorKind.INVALID_INPUT
    assert all(name in info.value.message for name in names), info.value.message


def test_instances_at_the_largest_depth_limit_are_a_400() -> None:
    # With --json-max-depth 64 (numpy's limit on dims), 'instances' of 64-deep rows nest 65 deep in all: for an
    # input of 64 dims a batch, a 400 naming the input, never numpy's IndexError (a 500).
    row: Any = 1
    for _ in range(64):
        row = [row]
    body = b'{"instances": [' + orjson.dumps(row) + b"]}"
    with pytest.raises(ModelhostError) as info:
        decode_predict(body, [TensorSpec("x", "INT32", (-1,) * 65)], RequestLimits(max_json_depth=64))
    assert info.value.kind is ErrorKind.INVALID_INPUT and "'x'" in info.value.message
