"""JSON tensors read from simdjson's tape: the same arrays and the same errors as the usual way, for every body.

Each case decodes one body twice, the fast way (json_tensors.load) and the usual way (orjson, the codecs'
conversions), and compares the outcomes: the array (dtype, shape, values) or the error's message.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import numpy as np
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from modelhost.errors import ModelhostError
from modelhost.protocols import json_tensors
from modelhost.protocols.json_tensors import JsonNumbers
from modelhost.protocols.kserve_v2.codec import TENSOR_PATHS, decode_infer_request
from modelhost.protocols.sagemaker.payloads import decode_invocation
from modelhost.protocols.tfserving.json_codec import decode_predict, parse_predict_json
from modelhost.types import TensorSpec

NUMERIC = ["BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64", "FP32", "FP64"]
EXAMPLES = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def outcome(decode: Callable[[], dict[str, np.ndarray]]) -> Any:
    try:
        arrays = decode()
    except ModelhostError as error:
        return ("error", error.kind, str(error))
    return {name: (array.dtype.str, array.shape, array.tolist() if array.dtype == object else array.tobytes())
            for name, array in arrays.items()}


def both_ways(monkeypatch: pytest.MonkeyPatch, decode: Callable[[], dict[str, np.ndarray]]) -> tuple[Any, Any]:
    with monkeypatch.context() as patch:
        patch.setattr(json_tensors, "MIN_BODY_BYTES", 0)
        fast = outcome(decode)
    with monkeypatch.context() as patch:
        patch.setattr(json_tensors, "MIN_BODY_BYTES", float("inf"))
        usual = outcome(decode)
    return fast, usual


def v2_body(data: Any, datatype: str, shape: list[int], name: str = "x") -> bytes:
    document = {"id": "r", "inputs": [{"name": name, "datatype": datatype, "shape": shape, "data": data}]}
    return json.dumps(document).encode()  # orjson cannot write integers past 64 bits


def v2_arrays(body: bytes) -> Callable[[], dict[str, np.ndarray]]:
    return lambda: decode_infer_request(body, None, "m").inputs


def recommender_body() -> tuple[bytes, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(7)
    ids = rng.integers(0, 2**40, (500, 26))
    dense = rng.random((500, 13), dtype=np.float32)
    body = orjson.dumps({"inputs": [
        {"name": "sparse_ids", "datatype": "INT64", "shape": [500, 26], "data": ids.reshape(-1).tolist()},
        {"name": "dense", "datatype": "FP32", "shape": [500, 13], "data": dense.tolist()},
    ]})
    return body, ids, dense


def test_a_recommender_request_takes_the_fast_way_and_decodes_exactly() -> None:
    body, ids, dense = recommender_body()
    assert len(body) > json_tensors.MIN_BODY_BYTES
    document = json_tensors.load(body, TENSOR_PATHS)
    assert isinstance(document, dict)
    assert [type(entry["data"]) for entry in document["inputs"]] == [JsonNumbers, JsonNumbers]
    assert [entry["data"].shape for entry in document["inputs"]] == [(13000,), (500, 13)]
    inputs = decode_infer_request(body, None, "m").inputs
    assert inputs["sparse_ids"].dtype == np.int64 and (inputs["sparse_ids"] == ids).all()
    assert inputs["dense"].dtype == np.float32 and (inputs["dense"] == dense).all()


def test_tf_serving_columnar_and_row_bodies_take_the_fast_way() -> None:
    rng = np.random.default_rng(3)
    ids = rng.integers(-(2**63), 2**63 - 1, (500, 26), dtype=np.int64)
    columnar = orjson.dumps({"inputs": {"ids": ids.tolist()}, "signature_name": "serving_default"})
    rows = orjson.dumps({"instances": ids.tolist()})
    paths = (("inputs",), ("inputs", json_tensors.ANY), ("instances",))
    assert isinstance(json_tensors.load(columnar, paths)["inputs"]["ids"], JsonNumbers)
    assert isinstance(json_tensors.load(rows, paths)["instances"], JsonNumbers)
    spec = [TensorSpec("ids", "INT64", (-1, 26))]
    for body in (columnar, rows):
        arrays, _ = decode_predict(body, spec)
        assert arrays["ids"].dtype == np.int64 and (arrays["ids"] == ids).all()


@pytest.mark.parametrize("count", [2000, 80_000], ids=["small", "past-the-first-chunk"])
def test_a_list_hidden_in_a_row_is_not_read_as_its_number(monkeypatch: pytest.MonkeyPatch, count: int) -> None:
    rows: list[Any] = [[float(i), float(i + 1)] for i in range(count)]
    assert isinstance(json_tensors.load(v2_body(rows, "FP32", [count, 2]), TENSOR_PATHS)["inputs"][0]["data"],
                      JsonNumbers)  # every bracket counted, however long the body
    rows[count * 3 // 4] = [1.0, [2.0]]  # as many numbers per row as the others, one of them in a list
    body = v2_body(rows, "FP32", [count, 2])
    assert json_tensors.load(body, TENSOR_PATHS) is None
    fast, usual = both_ways(monkeypatch, v2_arrays(body))
    assert fast == usual and fast[0] == "error" and "ragged" in fast[2]


def test_a_bracket_in_a_string_sends_the_body_the_usual_way() -> None:
    body = v2_body([[1, 2]] * 3000, "INT32", [3000, 2], name="x[0]")
    assert json_tensors.load(body, TENSOR_PATHS) is None
    assert decode_infer_request(body, None, "m").inputs["x[0]"].shape == (3000, 2)


def test_a_large_tensor_of_strings_sends_the_body_the_usual_way(monkeypatch: pytest.MonkeyPatch) -> None:
    words = [f"candidate item number {i}" for i in range(500)]
    body = v2_body(words, "BYTES", [500])
    assert len(body) > json_tensors.MIN_BODY_BYTES and json_tensors.load(body, TENSOR_PATHS) is None
    fast, usual = both_ways(monkeypatch, v2_arrays(body))
    assert fast == usual and fast["x"][1] == (500,)


def test_a_key_given_twice_is_read_as_orjson_reads_it(monkeypatch: pytest.MonkeyPatch) -> None:
    entry = b'{"name": "x", "datatype": "INT64", "shape": [2], "data": [1, 2], "data": [3, 4]}'
    body = b'{"inputs": [' + entry + b'], "pad": "' + b" " * 9000 + b'"}'
    assert json_tensors.load(body, TENSOR_PATHS) is None
    fast, usual = both_ways(monkeypatch, v2_arrays(body))
    assert fast == usual
    assert np.frombuffer(fast["x"][2], dtype=np.int64).tolist() == [3, 4]


@pytest.mark.parametrize(("data", "datatype", "words"), [
    ([2**31] + [1] * 4000, "INT32", "outside the range"),
    ([-1] + [1] * 4000, "UINT8", "outside the range"),
    ([1.5] + [1] * 4000, "INT64", "must be integers"),
    ([True] + [1] * 4000, "INT64", "must be integers"),
    (["1"] + [1.0] * 4000, "FP32", "must be numbers"),
    # Past 64 bits simdjson refuses an integer and orjson reads it as a float: the usual way decides.
    ([2**64] + [1] * 4000, "UINT64", "must be integers"),
    ([2**70] + [1.0] * 4000, "FP64", None),
])
def test_bad_values_get_the_usual_words(
    monkeypatch: pytest.MonkeyPatch, data: list[Any], datatype: str, words: str | None
) -> None:
    fast, usual = both_ways(monkeypatch, v2_arrays(v2_body(data, datatype, [len(data)])))
    assert fast == usual
    if words is not None:
        assert fast[0] == "error" and words in fast[2]


def test_nesting_past_the_depth_limit_gets_the_usual_words(monkeypatch: pytest.MonkeyPatch) -> None:
    deep: Any = [1]
    for _ in range(70):
        deep = [deep]
    body = orjson.dumps({"inputs": [{"name": "x", "datatype": "INT32", "shape": [1], "data": [deep] * 300}]})
    fast, usual = both_ways(monkeypatch, v2_arrays(body))
    assert fast == usual and "nested" in fast[2]


def test_sagemaker_json_bodies_decode_the_same_both_ways(monkeypatch: pytest.MonkeyPatch) -> None:
    spec = [TensorSpec("x", "FP32", (-1, 8))]
    rows = np.arange(4000, dtype=np.float32).reshape(500, 8).tolist()
    v2 = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [500, 8], "data": rows}]}
    for document in ({"instances": rows}, {"inputs": {"x": rows}}, {"inputs": rows}, rows, v2):
        body = orjson.dumps(document)

        def decode(body: bytes = body) -> dict[str, np.ndarray]:
            return decode_invocation(body, "application/json", spec).request.inputs

        fast, usual = both_ways(monkeypatch, decode)
        assert fast == usual and fast["x"][1] == (500, 8)
    parsed = parse_predict_json(orjson.dumps(v2), also=((), *TENSOR_PATHS))
    assert isinstance(parsed["inputs"][0]["data"], JsonNumbers)
    scores = [TensorSpec("x", "FP64", (-1,))]
    body = orjson.dumps(list(range(3000)))
    assert isinstance(json_tensors.load(body, ((),)), JsonNumbers)
    fast, usual = both_ways(monkeypatch, lambda: decode_invocation(body, "application/json", scores).request.inputs)
    assert fast == usual and fast["x"][1] == (3000,)


# Generated bodies: rank-1 and rank-2 lists of numbers, then one change that a fast reader could get wrong.

NUMBERS = st.one_of(
    st.integers(-(2**63), 2**64 - 1),
    st.integers(-300, 300),
    st.floats(allow_nan=False, allow_infinity=False, width=64),
)
ODD_VALUES = st.one_of(st.booleans(), st.none(), st.text(max_size=3), st.integers(2**64, 2**80),
                       st.just([]), st.lists(st.integers(0, 9), min_size=1, max_size=2), st.just({"b64": "AA=="}))


@st.composite
def tensor_values(draw: st.DrawFn) -> Any:
    rows = draw(st.integers(1, 12))
    width = draw(st.one_of(st.none(), st.integers(0, 5)))
    kind = draw(st.sampled_from(["int", "small", "float", "mixed"]))
    number = {"int": st.integers(-(2**63), 2**63 - 1), "small": st.integers(-300, 300),
              "float": st.floats(allow_nan=False, allow_infinity=False), "mixed": NUMBERS}[kind]
    value: Any = (draw(st.lists(number, min_size=rows, max_size=rows)) if width is None else
                  [draw(st.lists(number, min_size=width, max_size=width)) for _ in range(rows)])
    change = draw(st.sampled_from(["none", "odd value", "ragged", "deeper row", "number among rows", "rank 3"]))
    if change == "odd value" and (width is None or width):
        row = draw(st.integers(0, rows - 1))
        if width is None:
            value[row] = draw(ODD_VALUES)
        else:
            value[row][draw(st.integers(0, width - 1))] = draw(ODD_VALUES)
    elif change == "ragged" and width is not None:
        value[draw(st.integers(0, rows - 1))].append(0)
    elif change == "deeper row" and width is not None:
        value[draw(st.integers(0, rows - 1))] = [value[0]]
    elif change == "number among rows" and width is not None:
        value[draw(st.integers(0, rows - 1))] = 1
    elif change == "rank 3":
        value = [value] * draw(st.integers(1, 3))
    return value


def nested_shape(value: Any) -> list[int]:
    shape = []
    while isinstance(value, list):
        shape.append(len(value))
        value = value[0] if value else None
    return shape


@EXAMPLES
@given(value=tensor_values(), datatype=st.sampled_from(NUMERIC), flat_shape=st.booleans())
def test_v2_json_data_decodes_the_same_both_ways(value: Any, datatype: str, flat_shape: bool) -> None:
    shape = nested_shape(value)
    if flat_shape:
        shape = [int(np.prod(shape))]
    with pytest.MonkeyPatch.context() as monkeypatch:
        fast, usual = both_ways(monkeypatch, v2_arrays(v2_body(value, datatype, shape)))
    assert fast == usual


@EXAMPLES
@given(value=tensor_values(), datatype=st.sampled_from(NUMERIC), form=st.sampled_from(["rows", "named", "bare"]))
def test_tf_serving_json_decodes_the_same_both_ways(value: Any, datatype: str, form: str) -> None:
    shape = nested_shape(value)
    spec = [TensorSpec("x", datatype, tuple([-1] + [-1] * (len(shape) - 1)))]
    document = {"rows": {"instances": value}, "named": {"inputs": {"x": value}}, "bare": {"inputs": value}}[form]
    body = json.dumps(document).encode()
    with pytest.MonkeyPatch.context() as monkeypatch:
        fast, usual = both_ways(monkeypatch, lambda: decode_predict(body, spec)[0])
    assert fast == usual


@EXAMPLES
@given(value=tensor_values(), datatype=st.sampled_from(NUMERIC), form=st.sampled_from(["inputs", "instances",
                                                                                      "bare", "v2"]))
def test_sagemaker_json_decodes_the_same_both_ways(value: Any, datatype: str, form: str) -> None:
    shape = nested_shape(value)
    spec = [TensorSpec("x", datatype, tuple([-1] + [-1] * (len(shape) - 1)))]
    document = {"inputs": {"inputs": {"x": value}}, "instances": {"instances": value}, "bare": value,
                "v2": {"inputs": [{"name": "x", "datatype": datatype, "shape": shape, "data": value}]}}[form]
    body = json.dumps(document).encode()
    with pytest.MonkeyPatch.context() as monkeypatch:
        fast, usual = both_ways(monkeypatch, lambda: decode_invocation(body, "application/json", spec).request.inputs)
    assert fast == usual
