"""SageMaker /invocations payloads: every Content-Type in, every Accept out, and Accept negotiation (§6, §7)."""

from __future__ import annotations

import io
from typing import Any

import numpy as np
import orjson
import pytest

from modelhost.errors import ErrorKind, ModelhostError
from modelhost.protocols.sagemaker.payloads import (
    CSV,
    JSON,
    JSONLINES,
    NPY,
    PROTOBUF,
    REQUEST_TYPES,
    RESPONSE_TYPES,
    Invocation,
    MediaTypeError,
    choose_accept,
    decode_invocation,
    encode_invocation,
    media_type,
)
from modelhost.protocols.tfserving import predict_pb2 as pb
from modelhost.protocols.tfserving.tensor_proto import array_to_tensor, tensor_to_array
from modelhost.types import InferRequest, InferResponse, RequestedOutput, TensorSpec

ROW4 = TensorSpec("x", "FP32", (-1, 4))  # one input, four values per row
SCALAR = TensorSpec("v", "FP32", (-1,))  # one input, one value per row
GRID = TensorSpec("g", "INT32", (-1, 2, 2))
TEXT = TensorSpec("text", "BYTES", (-1,))
A = TensorSpec("a", "FP32", (-1, 2))
B = TensorSpec("b", "INT64", (-1,))


def decode(body: Any, content_type: str | None, *specs: TensorSpec) -> Invocation:
    raw = body if isinstance(body, bytes) else orjson.dumps(body)
    return decode_invocation(raw, content_type, specs)


def inputs(body: Any, content_type: str | None, *specs: TensorSpec) -> dict[str, np.ndarray]:
    return decode(body, content_type, *specs).request.inputs


def data_error(body: Any, content_type: str | None, *specs: TensorSpec) -> str:
    with pytest.raises(ModelhostError) as info:
        decode(body, content_type, *specs)
    assert info.value.kind is ErrorKind.INVALID_INPUT
    return info.value.message


def npy(array: np.ndarray, allow_pickle: bool = False) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array, allow_pickle=allow_pickle)
    return buffer.getvalue()


# --- application/json ---


def test_tfs_row_and_columnar_bodies() -> None:
    rows = decode({"instances": [[1, 2, 3, 4]]}, JSON, ROW4)
    columns = decode({"inputs": {"a": [[1, 2]], "b": [7, 8]}}, JSON, A, B)
    assert rows.form == "row" and rows.request.inputs["x"].dtype == np.float32
    assert rows.request.model_name == "" and rows.request.outputs is None
    assert columns.form == "columnar" and columns.request.inputs["b"].tolist() == [7, 8]


def test_v2_inference_request_in_json() -> None:
    body = {
        "id": "r1",
        "parameters": {"priority": 2},
        "inputs": [{"name": "a", "datatype": "FP32", "shape": [1, 2], "data": [1, 2]}],
        "outputs": [{"name": "y"}],
    }
    invocation = decode(body, JSON, A)
    assert invocation.form == "v2" and invocation.request.model_name == ""
    assert invocation.request.inputs["a"].tolist() == [[1, 2]]
    assert invocation.request.id == "r1" and invocation.request.parameters == {"priority": 2}
    assert invocation.request.outputs == [RequestedOutput("y", {})]


def test_columnar_b64_objects_are_not_v2() -> None:
    invocation = decode({"inputs": [{"b64": "aGk="}]}, JSON, TEXT)
    assert invocation.form == "columnar" and invocation.request.inputs["text"].tolist() == [b"hi"]


@pytest.mark.parametrize(
    ("body", "spec", "shape"),
    [
        pytest.param([[1, 2, 3, 4], [5, 6, 7, 8]], ROW4, (2, 4), id="list-of-rows"),
        pytest.param([1, 2, 3, 4], ROW4, (1, 4), id="flat-list-is-one-instance"),
        pytest.param([1, 2, 3], SCALAR, (3,), id="flat-list-of-scalars-per-row-is-a-batch"),
        pytest.param(5, SCALAR, (1,), id="scalar-is-one-instance"),
        pytest.param([[[1, 2], [3, 4]]], GRID, (1, 2, 2), id="nested-rows"),
    ],
)
def test_other_json_becomes_instances(body: Any, spec: TensorSpec, shape: tuple[int, ...]) -> None:
    invocation = decode(body, JSON, spec)
    assert invocation.form == "row"
    array = invocation.request.inputs[spec.name]
    assert array.shape == shape and array.dtype == np.dtype({"FP32": np.float32, "INT32": np.int32}[spec.datatype])


def test_objects_by_input_name_are_instances() -> None:
    one = inputs({"a": [1, 2], "b": 3}, JSON, A, B)
    many = inputs([{"a": [1, 2], "b": 3}, {"a": [4, 5], "b": 6}], JSON, A, B)
    assert one["a"].shape == (1, 2) and one["b"].tolist() == [3]
    assert many["a"].tolist() == [[1, 2], [4, 5]] and many["b"].tolist() == [3, 6]


def test_json_lines_looking_json_body_is_one_instance_per_line() -> None:
    invocation = decode(b'[1, 2, 3, 4]\n\n[5, 6, 7, 8]\n', JSON, ROW4)
    assert invocation.form == "jsonlines" and invocation.request.inputs["x"].shape == (2, 4)


@pytest.mark.parametrize("content_type", [None, "", "application/json; charset=utf-8", "Application/JSON"])
def test_missing_or_decorated_content_type_means_json(content_type: str | None) -> None:
    assert inputs([[1, 2, 3, 4]], content_type, ROW4)["x"].shape == (1, 4)


@pytest.mark.parametrize(
    ("body", "specs", "words"),
    [
        pytest.param(b"{oops", [ROW4], ["not valid JSON"], id="not-json"),
        pytest.param(b"[1, 2]\n{oops", [ROW4], ["not valid JSON"], id="bad-json-lines"),
        pytest.param([], [ROW4], ["empty JSON list"], id="empty-list"),
        pytest.param([[1, 2, 3]], [ROW4], ["instances[0]", "'x'", "[3]", "[4]"], id="wrong-shape"),
        pytest.param([[1, 2, 3, "a"]], [ROW4], ["'x'", "FP32", "numbers"], id="wrong-type"),
        pytest.param([1, 2], [A, B], ["instances[0]", "'a'", "'b'"], id="several-inputs-unnamed"),
        pytest.param({"instances": [[1, 2, 3, 4]], "inputs": []}, [ROW4], ["'instances'", "'inputs'"], id="both"),
    ],
)
def test_json_errors_name_the_instance_and_input(body: Any, specs: list[TensorSpec], words: list[str]) -> None:
    message = data_error(body, JSON, *specs)
    assert all(word in message for word in words), message


# --- text/csv ---


def test_csv_lines_fill_the_row_shape() -> None:
    assert inputs(b"1,2,3,4\n5,6,7,8\n", CSV, ROW4)["x"].tolist() == [[1, 2, 3, 4], [5, 6, 7, 8]]
    grid = inputs(b"1,2,3,4\r\n\r\n5,6,7,8", CSV, GRID)["g"]
    assert grid.dtype == np.int32 and grid.tolist() == [[[1, 2], [3, 4]], [[5, 6], [7, 8]]]
    assert inputs(b"1.5\n-2\nnan\n", CSV, SCALAR)["v"].shape == (3,)
    variable = inputs(b"1,2,3\n4,5,6\n", CSV, TensorSpec("w", "FP64", (-1, -1)))["w"]
    assert variable.dtype == np.float64 and variable.shape == (2, 3)


def test_csv_values_take_the_input_datatype() -> None:
    assert inputs(b'"a,b",c\n', CSV, TensorSpec("t", "BYTES", (-1, 2)))["t"].tolist() == [[b"a,b", b"c"]]
    assert inputs(b"true,0\nFalse,1\n", CSV, TensorSpec("m", "BOOL", (-1, 2)))["m"].tolist() == [
        [True, False], [False, True],
    ]
    big = inputs(b"18446744073709551615\n", CSV, TensorSpec("u", "UINT64", (-1,)))["u"]
    assert big.dtype == np.uint64 and big.tolist() == [2**64 - 1]


def test_csv_fills_the_only_required_input() -> None:
    optional = TensorSpec("extra", "FP32", (-1,), optional=True)
    assert list(inputs(b"1,2,3,4\n", CSV, ROW4, optional)) == ["x"]


@pytest.mark.parametrize(
    ("body", "specs", "words"),
    [
        pytest.param(b"1,2\n", [A, B], ["text/csv", "2 inputs", "'a'", "'b'"], id="several-inputs"),
        pytest.param(b"1,2,3,4\n5,6,7,8\n1,2,3\n", [ROW4], ["line 3 has 3 values", "line 1 has 4"], id="lengths"),
        pytest.param(b"1,2,3,4\n\n1,2,abc,4\n", [ROW4], ["line 3, value 3", "'abc'", "'x'", "FP32"], id="not-number"),
        pytest.param(b"1,2,,4\n", [ROW4], ["line 1, value 3", "''"], id="empty-value"),
        pytest.param(b"1,2,3,4.5\n", [GRID], ["line 1, value 4", "'4.5'", "an integer", "INT32"], id="float-for-int"),
        pytest.param(b"1\n300\n", [TensorSpec("s", "INT8", (-1,))], ["line 2, value 1", "300", "range"], id="range"),
        pytest.param(b"1,2,3\n", [ROW4], ["line 1 has 3 values", "'x'", "takes 4"], id="row-width"),
        pytest.param(b"1,2,3\n", [TensorSpec("p", "FP32", (-1, -1, 2))], ["a multiple of 2"], id="not-a-multiple"),
        pytest.param(b"yes\n", [TensorSpec("m", "BOOL", (-1,))], ["line 1", "'yes'", "true/false"], id="bool"),
        pytest.param(b"\n \n", [ROW4], ["no lines"], id="empty"),
        pytest.param(b"\xff\xfe1\n", [ROW4], ["UTF-8"], id="not-utf8"),
        pytest.param(b"1,2\n", [TensorSpec("q", "FP32", (-1, -1, -1))], ["several variable"], id="ambiguous-shape"),
    ],
)
def test_csv_errors_name_the_line(body: bytes, specs: list[TensorSpec], words: list[str]) -> None:
    message = data_error(body, CSV, *specs)
    assert all(word in message for word in words), message


# --- application/jsonlines ---


@pytest.mark.parametrize("content_type", [JSONLINES, "application/jsonl", "application/x-jsonlines"])
def test_json_lines_one_instance_per_line(content_type: str) -> None:
    invocation = decode(b'[1, 2, 3, 4]\n\n[5, 6, 7, 8]', content_type, ROW4)
    assert invocation.form == "jsonlines" and invocation.request.inputs["x"].shape == (2, 4)


def test_json_lines_with_objects_and_a_single_line() -> None:
    named = inputs(b'{"a": [1, 2], "b": 3}\n{"a": [4, 5], "b": 6}\n', JSONLINES, A, B)
    assert named["a"].shape == (2, 2) and named["b"].tolist() == [3, 6]
    # One line is one instance, even one that looks like a list of rows.
    assert inputs(b"[[1, 2], [3, 4]]", JSONLINES, TensorSpec("m", "FP32", (-1, 2, 2)))["m"].shape == (1, 2, 2)


def test_json_lines_errors_name_the_line() -> None:
    assert "line 3 is not valid JSON" in data_error(b'[1,2,3,4]\n\n[5,6', JSONLINES, ROW4)
    assert "no lines" in data_error(b"\n", JSONLINES, ROW4)


# --- application/x-npy ---


def test_npy_becomes_the_input_datatype() -> None:
    floats = inputs(npy(np.arange(8, dtype=np.float64).reshape(2, 4)), NPY, ROW4)["x"]
    assert floats.dtype == np.float32 and floats.tolist() == [[0, 1, 2, 3], [4, 5, 6, 7]]
    ints = inputs(npy(np.array([[[1, 2], [3, 4]]], dtype=np.int64)), NPY, GRID)["g"]
    assert ints.dtype == np.int32 and ints.shape == (1, 2, 2)
    assert inputs(npy(np.array([1, 2], dtype=np.uint8)), NPY, SCALAR)["v"].dtype == np.float32
    assert inputs(npy(np.array(["hé", "x"])), NPY, TEXT)["text"].tolist() == ["hé".encode(), b"x"]
    assert inputs(npy(np.array([b"a"])), NPY, TEXT)["text"].tolist() == [b"a"]


@pytest.mark.parametrize(
    ("body", "specs", "words"),
    [
        pytest.param(npy(np.array([1, None], dtype=object), True), [SCALAR], ["Python objects", "unpickl"],
                     id="pickle"),
        pytest.param(b"1,2,3", [SCALAR], ["not a .npy array"], id="not-npy"),
        pytest.param(b"\x93NUMPY\x01\x00", [SCALAR], ["not a valid .npy array"], id="truncated"),
        pytest.param(npy(np.array([1.5])), [GRID], ["float64", "'g'", "INT32"], id="float-for-int"),
        pytest.param(npy(np.array([2**40])), [GRID], ["int64", "'g'", "INT32", "without changing values"],
                     id="int-out-of-range"),
        pytest.param(npy(np.array([True])), [SCALAR], ["bool", "'v'"], id="bool-for-float"),
        pytest.param(npy(np.array([1.0])), [TEXT], ["float64", "BYTES"], id="number-for-bytes"),
        pytest.param(npy(np.zeros((1, 2))), [A, B], ["application/x-npy", "2 inputs"], id="several-inputs"),
    ],
)
def test_npy_errors(body: bytes, specs: list[TensorSpec], words: list[str]) -> None:
    message = data_error(body, NPY, *specs)
    assert all(word in message for word in words), message


def test_npz_archives_are_refused() -> None:
    buffer = io.BytesIO()
    np.savez(buffer, x=np.zeros(4))
    assert "not a .npy array" in data_error(buffer.getvalue(), NPY, SCALAR)


# --- application/x-protobuf ---


def predict_request(**arrays: np.ndarray) -> pb.PredictRequest:
    request = pb.PredictRequest()
    for name, array in arrays.items():
        request.inputs[name].CopyFrom(array_to_tensor(array))
    return request


@pytest.mark.parametrize("content_type", [PROTOBUF, "application/protobuf", "application/vnd.google.protobuf"])
def test_protobuf_predict_request(content_type: str) -> None:
    request = predict_request(a=np.ones((2, 2), np.float32), b=np.array([1, 2]))
    request.model_spec.name = "half"
    request.model_spec.version.value = 4
    request.output_filter.append("y")
    invocation = decode(request.SerializeToString(), content_type, A, B)
    assert invocation.form == "protobuf"
    assert invocation.request.model_name == "half" and invocation.request.model_version == "4"
    assert invocation.request.outputs == [RequestedOutput("y", {})]
    assert invocation.request.inputs["a"].shape == (2, 2) and invocation.request.inputs["b"].dtype == np.int64


def test_protobuf_without_model_spec_or_filter() -> None:
    invocation = decode(predict_request(v=np.ones(3, np.float32)).SerializeToString(), PROTOBUF, SCALAR)
    assert invocation.request.model_name == "" and invocation.request.model_version == ""
    assert invocation.request.outputs is None


def test_protobuf_errors() -> None:
    assert "PredictRequest" in data_error(b"\xff\xff\xff", PROTOBUF, SCALAR)
    assert "'v'" in data_error(predict_request(w=np.ones(1, np.float32)).SerializeToString(), PROTOBUF, SCALAR)
    labelled = predict_request(v=np.ones(1, np.float32))
    labelled.model_spec.version_label = "canary"
    assert "version_label 'canary'" in data_error(labelled.SerializeToString(), PROTOBUF, SCALAR)


# --- unsupported Content-Type ---


@pytest.mark.parametrize("content_type", ["text/plain", "application/x-image"])
def test_unsupported_content_type_is_415_listing_the_supported(content_type: str) -> None:
    with pytest.raises(MediaTypeError) as info:
        decode(b"1", content_type, SCALAR)
    assert info.value.status == 415
    assert f"Content-Type '{content_type}' is not supported" in info.value.message
    assert all(name in info.value.message for name in (JSON, CSV, JSONLINES, NPY, PROTOBUF))


# --- responses ---

Y = np.array([[0.1, 2.0], [np.float32(1) / 3, -4.5]], dtype=np.float32)
LABEL = np.array([3, 7], dtype=np.int64)


def response(**outputs: np.ndarray) -> InferResponse:
    return InferResponse("m", "2", outputs, id="r9")


def invocation(form: str) -> Invocation:
    return Invocation(InferRequest("", {}), form)


def encode(outputs: dict[str, np.ndarray], form: str, accept: str) -> tuple[bytes, str]:
    return encode_invocation(response(**outputs), invocation(form), accept)


@pytest.mark.parametrize("form", ["row", "csv", "jsonlines", "npy", "protobuf"])
def test_json_response_is_tfs_row_predictions(form: str) -> None:
    body, content_type = encode({"y": Y, "label": LABEL}, form, JSON)
    assert content_type == JSON
    predictions = orjson.loads(body)["predictions"]
    assert predictions[1]["label"] == 7 and np.float32(predictions[1]["y"][0]) == Y[1, 0]


def test_json_response_columnar_and_v2() -> None:
    columnar = orjson.loads(encode({"y": Y, "label": LABEL}, "columnar", JSON)[0])
    assert columnar["outputs"]["label"] == [3, 7]
    v2 = orjson.loads(encode({"label": LABEL}, "v2", JSON)[0])
    assert v2 == {
        "model_name": "m", "model_version": "2", "id": "r9",
        "outputs": [{"name": "label", "datatype": "INT64", "shape": [2], "data": [3, 7]}],
    }


@pytest.mark.parametrize("accept", [JSONLINES, "application/jsonl"])
def test_json_lines_response_has_one_line_per_row(accept: str) -> None:
    body, content_type = encode({"label": LABEL}, "row", accept)
    assert content_type == accept and body == b"3\n7\n"
    body, _ = encode({"y": Y, "label": LABEL}, "jsonlines", accept)
    lines = body.decode().splitlines()
    assert len(lines) == 2 and body.endswith(b"\n")
    assert orjson.loads(lines[0]) == {"y": [pytest.approx(0.1), 2.0], "label": 3}


def test_csv_response_round_trips_float32_and_concatenates_outputs() -> None:
    body, content_type = encode({"y": Y, "label": LABEL}, "row", CSV)
    assert content_type == CSV
    lines = body.decode().splitlines()
    assert lines[0] == "0.1,2.0,3" and lines[1].endswith(",-4.5,7")
    parsed = np.array([line.split(",")[:2] for line in lines], dtype=np.float64).astype(np.float32)
    assert np.array_equal(parsed, Y)  # every float32 reads back bit for bit


def test_csv_response_flattens_rows_and_writes_text_and_booleans() -> None:
    outputs = {
        "grid": np.arange(8, dtype=np.int32).reshape(2, 2, 2),
        "ok": np.array([True, False]),
        "name": np.array([b"a,b", b"c"], dtype=object),
    }
    assert encode(outputs, "csv", CSV)[0] == b'0,1,2,3,true,"a,b"\n4,5,6,7,false,c\n'


@pytest.mark.parametrize(
    ("outputs", "words"),
    [
        pytest.param({"s": np.array(1.0)}, ["'s'", "scalar"], id="scalar"),
        pytest.param({"a": np.zeros(2), "b": np.zeros(3)}, ["'a': 2", "'b': 3"], id="first-dims"),
        pytest.param({"t": np.array([b"\xff"], dtype=object)}, ["'t'", "UTF-8"], id="not-utf8"),
    ],
)
def test_csv_response_errors(outputs: dict[str, np.ndarray], words: list[str]) -> None:
    with pytest.raises(ModelhostError) as info:
        encode(outputs, "row", CSV)
    assert all(word in info.value.message for word in words), info.value.message


def test_npy_response() -> None:
    body, content_type = encode({"y": Y}, "npy", NPY)
    assert content_type == NPY
    loaded = np.load(io.BytesIO(body), allow_pickle=False)
    assert loaded.dtype == np.float32 and np.array_equal(loaded, Y)
    text = np.load(io.BytesIO(encode({"t": np.array([b"ab", "hé"], dtype=object)}, "row", NPY)[0]))
    assert text.tolist() == [b"ab", "hé".encode()]


def test_npy_response_with_several_outputs_is_406_naming_them() -> None:
    with pytest.raises(MediaTypeError) as info:
        encode({"y": Y, "label": LABEL}, "npy", NPY)
    assert info.value.status == 406
    assert all(word in info.value.message for word in ("one array", "'y'", "'label'"))


def test_protobuf_response() -> None:
    body, content_type = encode({"y": Y, "label": LABEL}, "json", "application/protobuf")
    assert content_type == "application/protobuf"
    parsed = pb.PredictResponse.FromString(body)
    assert parsed.model_spec.name == "m" and parsed.model_spec.version.value == 2
    assert np.array_equal(tensor_to_array(parsed.outputs["y"], "y"), Y)
    assert tensor_to_array(parsed.outputs["label"], "label").tolist() == [3, 7]


def test_unsupported_accept_in_encode_is_406() -> None:
    with pytest.raises(MediaTypeError) as info:
        encode({"y": Y}, "row", "image/png")
    assert info.value.status == 406


@pytest.mark.parametrize(
    ("content_type", "body", "accept"),
    [(CSV, b"1,2,3,4\n5,6,7,8\n", CSV), (JSONLINES, b"[1,2,3,4]\n[5,6,7,8]\n", JSONLINES)],
)
def test_identity_round_trip(content_type: str, body: bytes, accept: str) -> None:
    decoded = decode(body, content_type, ROW4)
    echoed = InferResponse("m", "1", {"x": decoded.request.inputs["x"]})
    out = encode_invocation(echoed, decoded, accept)[0]
    assert decode(out, content_type, ROW4).request.inputs["x"].tolist() == decoded.request.inputs["x"].tolist()


# --- Accept negotiation ---


@pytest.mark.parametrize(
    ("accept", "default", "chosen"),
    [
        (None, JSON, JSON),
        ("", CSV, CSV),
        ("*/*", JSON, JSON),
        ("*/*", "text/csv; charset=utf-8", CSV),
        ("text/csv", JSON, CSV),
        ("Text/CSV; charset=utf-8", JSON, CSV),
        ("image/png, text/csv", JSON, CSV),
        ("application/json;q=0.5, text/csv", JSON, CSV),
        ("text/csv;q=0, application/json", CSV, JSON),
        ("application/x-npy;q=0.9, */*;q=0.1", JSON, NPY),
        ("image/png, */*", CSV, CSV),
        ("text/*", JSON, CSV),
        ("application/*", JSON, JSON),
        ("application/*", JSONLINES, JSONLINES),
        ("application/*", CSV, JSON),
        ("application/jsonl", JSON, "application/jsonl"),
        ("application/json;q=abc", CSV, JSON),
    ],
)
def test_choose_accept(accept: str | None, default: str, chosen: str) -> None:
    assert choose_accept(accept, default) == chosen


@pytest.mark.parametrize(("accept", "default"), [("image/png", JSON), ("text/csv;q=0", JSON), ("x/y", "image/png")])
def test_unsatisfiable_accept_is_406_listing_the_supported(accept: str, default: str) -> None:
    with pytest.raises(MediaTypeError) as info:
        choose_accept(accept, default)
    assert info.value.status == 406
    assert all(name in info.value.message for name in RESPONSE_TYPES)


def test_media_type() -> None:
    assert media_type("Text/CSV; charset=utf-8") == "text/csv"
    assert media_type(" application/json ") == JSON
    assert media_type(None) == media_type("") == ""


def test_every_response_format_is_also_read() -> None:
    # Read only: the Triton container's two (answered in V2 JSON or binary+json), npz and libsvm (sparse rows).
    assert set(REQUEST_TYPES) - set(RESPONSE_TYPES) == {
        "application/octet-stream", "application/vnd.sagemaker-triton.binary+json", "application/x-npz",
        "text/libsvm"}
    assert set(RESPONSE_TYPES) >= {JSON, CSV, JSONLINES, NPY, PROTOBUF}
