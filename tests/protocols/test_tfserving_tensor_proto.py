"""TensorProto <-> numpy and TF Serving PredictRequest / PredictResponse bytes (protocols §5.6)."""

from __future__ import annotations

import struct
from typing import Any

import numpy as np
import pytest

from modelhost.errors import ErrorKind, ModelhostError
from modelhost.protocols.tfserving import predict_pb2 as pb
from modelhost.protocols.tfserving.tensor_proto import (
    ModelSpecInfo,
    array_to_tensor,
    decode_predict_request,
    encode_predict_response,
    tensor_to_array,
)
from modelhost.types import TensorSpec

ARRAYS = [
    pytest.param(np.array([[1.5, -2.0], [np.inf, 0.0]], dtype=np.float32), pb.DT_FLOAT, "float_val", id="float"),
    pytest.param(np.array([0.1, -1e300], dtype=np.float64), pb.DT_DOUBLE, "double_val", id="double"),
    pytest.param(np.array([[0.5, -65504.0, 1e-7]], dtype=np.float16), pb.DT_HALF, "half_val", id="half"),
    pytest.param(np.array([-128, 127], dtype=np.int8), pb.DT_INT8, "int_val", id="int8"),
    pytest.param(np.array([-(2**15), 2**15 - 1], dtype=np.int16), pb.DT_INT16, "int_val", id="int16"),
    pytest.param(np.array([[-(2**31)], [2**31 - 1]], dtype=np.int32), pb.DT_INT32, "int_val", id="int32"),
    pytest.param(np.array([-(2**63), 2**53 + 1], dtype=np.int64), pb.DT_INT64, "int64_val", id="int64"),
    pytest.param(np.array([0, 255], dtype=np.uint8), pb.DT_UINT8, "int_val", id="uint8"),
    pytest.param(np.array([0, 65535], dtype=np.uint16), pb.DT_UINT16, "int_val", id="uint16"),
    pytest.param(np.array([0, 2**32 - 1], dtype=np.uint32), pb.DT_UINT32, "uint32_val", id="uint32"),
    pytest.param(np.array([0, 2**64 - 1], dtype=np.uint64), pb.DT_UINT64, "uint64_val", id="uint64"),
    pytest.param(np.array([[True, False, True]]), pb.DT_BOOL, "bool_val", id="bool"),
    pytest.param(np.array([b"a", b"", b"\xff\x00"], dtype=object), pb.DT_STRING, "string_val", id="string"),
]


def wire(proto: Any) -> Any:
    """The tensor after a trip through its serialized bytes."""
    return type(proto).FromString(proto.SerializeToString())


@pytest.mark.parametrize(("array", "data_type", "field"), ARRAYS)
def test_round_trip_through_tensor_content(array: np.ndarray, data_type: int, field: str) -> None:
    proto = wire(array_to_tensor(array))
    assert proto.dtype == data_type
    assert [d.size for d in proto.tensor_shape.dim] == list(array.shape)
    if data_type != pb.DT_STRING:
        assert len(proto.tensor_content) == array.nbytes and not len(getattr(proto, field))
    decoded = tensor_to_array(proto, "t")
    assert decoded.dtype == array.dtype and decoded.shape == array.shape
    assert decoded.tolist() == array.tolist()


@pytest.mark.parametrize(("array", "data_type", "field"), ARRAYS)
def test_round_trip_through_typed_fields(array: np.ndarray, data_type: int, field: str) -> None:
    proto = wire(array_to_tensor(array, typed=True))
    assert proto.dtype == data_type and not proto.tensor_content
    assert len(getattr(proto, field)) == array.size
    decoded = tensor_to_array(proto, "t")
    assert decoded.dtype == array.dtype and decoded.tolist() == array.tolist()


def test_strings_are_encoded_as_utf8_and_come_back_as_bytes() -> None:
    proto = array_to_tensor(np.array(["héllo", "x"]))
    assert list(proto.string_val) == ["héllo".encode(), b"x"]
    assert tensor_to_array(proto, "t").tolist() == ["héllo".encode(), b"x"]


def test_half_val_holds_bit_patterns() -> None:
    values = np.array([1.0, -2.5], dtype=np.float16)
    proto = pb.TensorProto(dtype=pb.DT_HALF, half_val=values.view(np.uint16).tolist())
    proto.tensor_shape.dim.add(size=2)
    assert list(proto.half_val) == [0x3C00, 0xC100]
    assert tensor_to_array(proto, "t").tolist() == [1.0, -2.5]


@pytest.mark.parametrize(
    ("field", "value", "data_type", "dtype"),
    [
        ("float_val", 2.5, pb.DT_FLOAT, np.float32),
        ("int_val", 7, pb.DT_UINT8, np.uint8),
        ("bool_val", True, pb.DT_BOOL, np.bool_),
        ("string_val", b"s", pb.DT_STRING, np.object_),
        ("half_val", 0x3C00, pb.DT_HALF, np.float16),
    ],
)
def test_one_typed_value_fills_the_shape(field: str, value: Any, data_type: int, dtype: type) -> None:
    proto = pb.TensorProto(dtype=data_type, **{field: [value]})
    proto.tensor_shape.dim.add(size=2)
    proto.tensor_shape.dim.add(size=3)
    array = tensor_to_array(proto, "t")
    assert array.shape == (2, 3) and array.dtype == np.dtype(dtype)
    assert len(set(array.flat)) == 1


def test_empty_and_scalar_tensors() -> None:
    empty = pb.TensorProto(dtype=pb.DT_FLOAT)
    empty.tensor_shape.dim.add(size=0)
    assert tensor_to_array(empty, "t").shape == (0,)
    assert tensor_to_array(pb.TensorProto(dtype=pb.DT_INT64, int64_val=[5]), "t").tolist() == 5


def tensor(data_type: int, shape: list[int], **fields: Any) -> pb.TensorProto:
    proto = pb.TensorProto(dtype=data_type, **fields)
    for size in shape:
        proto.tensor_shape.dim.add(size=size)
    return proto


BAD_TENSORS = [
    pytest.param(tensor(pb.DT_COMPLEX64, [1], scomplex_val=[1, 2]), ["DT_COMPLEX64", "not supported", "DT_FLOAT"],
                 id="complex"),
    pytest.param(tensor(pb.DT_BFLOAT16, [1], half_val=[1]), ["DT_BFLOAT16", "not supported"], id="bfloat16"),
    pytest.param(tensor(77, [1]), ["dtype 77", "not supported"], id="unknown-enum"),
    pytest.param(tensor(pb.DT_FLOAT, [3], tensor_content=b"\0" * 8), ["8 bytes", "[3]", "needs 12"], id="content-size"),
    pytest.param(tensor(pb.DT_FLOAT, [1], tensor_content=b"\0" * 4, float_val=[1]), ["tensor_content", "float_val"],
                 id="both"),
    pytest.param(tensor(pb.DT_FLOAT, [2], int_val=[1, 2]), ["DT_FLOAT", "int_val", "float_val"], id="wrong-field"),
    pytest.param(tensor(pb.DT_FLOAT, [3], float_val=[1, 2]), ["2 values", "float_val", "[3]", "needs 3"], id="count"),
    pytest.param(tensor(pb.DT_STRING, [1], tensor_content=b"ab"), ["DT_STRING", "string_val"], id="string-content"),
    pytest.param(tensor(pb.DT_INT8, [2], int_val=[1, 200]), ["int_val", "range", "DT_INT8"], id="int8-range"),
    pytest.param(tensor(pb.DT_FLOAT, [-1], float_val=[1]), ["[-1]", "known size"], id="unknown-dim"),
]


@pytest.mark.parametrize(("proto", "words"), BAD_TENSORS)
def test_bad_tensors_name_where_and_the_problem(proto: pb.TensorProto, words: list[str]) -> None:
    with pytest.raises(ModelhostError) as info:
        tensor_to_array(proto, "inputs['x']")
    assert info.value.kind is ErrorKind.INVALID_INPUT
    assert info.value.message.startswith("inputs['x']")
    assert all(word in info.value.message for word in words), info.value.message


def test_unknown_rank_is_refused() -> None:
    proto = pb.TensorProto(dtype=pb.DT_FLOAT, float_val=[1])
    proto.tensor_shape.unknown_rank = True
    with pytest.raises(ModelhostError, match=r"inputs\['x'\] has unknown_rank"):
        tensor_to_array(proto, "inputs['x']")


def test_arrays_without_a_tensorflow_type_are_a_programming_error() -> None:
    with pytest.raises(TypeError, match="complex64"):
        array_to_tensor(np.zeros(2, dtype=np.complex64))


def test_big_endian_arrays_are_written_little_endian() -> None:
    proto = array_to_tensor(np.array([1.0, 2.0], dtype=">f4"))
    assert proto.dtype == pb.DT_FLOAT and proto.tensor_content == np.array([1, 2], dtype="<f4").tobytes()


# --- PredictRequest / PredictResponse ---

X = TensorSpec("x", "FP32", (-1, 2))
IDS = TensorSpec("ids", "INT64", (-1,))
TEXT = TensorSpec("text", "BYTES", (-1,), optional=True)


def predict_request(**inputs: np.ndarray) -> pb.PredictRequest:
    request = pb.PredictRequest()
    request.model_spec.name = "half_plus_two"
    request.model_spec.version.value = 3
    request.model_spec.signature_name = "serving_default"
    for name, array in inputs.items():
        request.inputs[name].CopyFrom(array_to_tensor(array, typed=True))
    return request


def test_decode_predict_request_from_generated_classes() -> None:
    request = predict_request(ids=np.array([4, 5]), x=np.array([[1, 2], [3, 4]], dtype=np.float32))
    request.output_filter.extend(["y", "z"])
    arrays, spec, output_filter = decode_predict_request(request.SerializeToString(), [X, IDS, TEXT])
    assert list(arrays) == ["x", "ids"]  # the model's order, not the map's
    assert arrays["x"].tolist() == [[1, 2], [3, 4]] and arrays["ids"].dtype == np.int64
    assert spec == ModelSpecInfo("half_plus_two", "3", "serving_default")
    assert output_filter == ["y", "z"]


def test_model_spec_without_version_or_with_a_label() -> None:
    request = predict_request(x=np.zeros((1, 2), dtype=np.float32), ids=np.zeros(1, dtype=np.int64))
    request.model_spec.version_label = "stable"  # the oneof drops version
    _, spec, _ = decode_predict_request(request.SerializeToString(), [X, IDS])
    assert spec.version == "" and spec.version_label == "stable"


@pytest.mark.parametrize(
    ("inputs", "words"),
    [
        pytest.param({"x": np.zeros((1, 2), np.float32)}, ["PredictRequest.inputs", "missing", "'ids'"], id="missing"),
        pytest.param(
            {"x": np.zeros((1, 2), np.float32), "ids": np.zeros(1, np.int64), "extra": np.zeros(1)},
            ["PredictRequest.inputs", "unknown", "'extra'"], id="unknown",
        ),
        pytest.param(
            {"x": np.zeros((1, 2), np.float64), "ids": np.zeros(1, np.int64)},
            ["inputs['x']", "DT_DOUBLE", "'x'", "DT_FLOAT"], id="dtype",
        ),
        pytest.param(
            {"x": np.zeros((1, 2), np.float32), "ids": np.zeros(1, np.int64), "text": np.zeros(1, np.float32)},
            ["inputs['text']", "DT_FLOAT", "DT_STRING"], id="bytes-dtype",
        ),
    ],
)
def test_request_inputs_are_checked_against_the_model(inputs: dict[str, np.ndarray], words: list[str]) -> None:
    with pytest.raises(ModelhostError) as info:
        decode_predict_request(predict_request(**inputs).SerializeToString(), [X, IDS, TEXT])
    assert info.value.kind is ErrorKind.INVALID_INPUT
    assert all(word in info.value.message for word in words), info.value.message


@pytest.mark.parametrize("body", [b"\xff\xff\xff", b"\x0a\x05ab", b'{"instances": [1]}'])
def test_bodies_that_are_not_predict_requests(body: bytes) -> None:
    with pytest.raises(ModelhostError, match="not a serialized tensorflow.serving.PredictRequest"):
        decode_predict_request(body, [X])


def varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def field(number: int, payload: bytes | int) -> bytes:
    """One field on the wire: varint (wire type 0) for ints, length-delimited (2) for bytes."""
    if isinstance(payload, int):
        return varint(number << 3) + varint(payload)
    return varint(number << 3 | 2) + varint(len(payload)) + payload


def test_hand_written_request_bytes_decode() -> None:
    # Field numbers from tensorflow_serving/apis/predict.proto and tensorflow/core/framework/tensor.proto.
    shape = field(2, field(1, 2))  # TensorShapeProto.dim(2) { size(1): 2 }
    x = field(1, pb.DT_FLOAT) + field(2, shape) + field(5, struct.pack("<2f", 1.5, -2.0))  # float_val packed
    ids = field(1, pb.DT_INT64) + field(2, field(2, field(1, 1))) + field(10, varint(9))  # int64_val packed
    model_spec = field(1, b"m") + field(2, field(1, 7)) + field(3, b"sig")  # version(2) Int64Value { value(1) }
    body = (
        field(1, model_spec)
        + field(2, field(1, b"x") + field(2, x))  # inputs map entry { key(1), value(2) }
        + field(2, field(1, b"ids") + field(2, ids))
        + field(3, b"y")  # output_filter
    )
    arrays, spec, output_filter = decode_predict_request(body, [X, IDS])
    assert arrays["x"].tolist() == [1.5, -2.0] and arrays["x"].dtype == np.float32
    assert arrays["ids"].tolist() == [9]
    assert spec == ModelSpecInfo("m", "7", "sig")
    assert output_filter == ["y"]


def test_response_bytes_match_a_hand_written_encoding() -> None:
    body = encode_predict_response({"y": np.array([1.0, 2.0], dtype=np.float32)}, "m", "7", signature_name="sig")
    content = struct.pack("<2f", 1.0, 2.0)
    y = field(1, pb.DT_FLOAT) + field(2, field(2, field(1, 2))) + field(4, content)  # tensor_content(4)
    model_spec = field(1, b"m") + field(2, field(1, 7)) + field(3, b"sig")
    assert body == field(1, field(1, b"y") + field(2, y)) + field(2, model_spec)


def test_response_round_trip_through_generated_classes() -> None:
    outputs = {"score": np.array([[0.5], [0.25]], dtype=np.float32), "label": np.array([b"cat", b"dog"], dtype=object)}
    response = pb.PredictResponse.FromString(encode_predict_response(outputs, "m", "12", typed=True))
    assert response.model_spec.name == "m" and response.model_spec.version.value == 12
    assert list(response.outputs["score"].float_val) == [0.5, 0.25]
    assert list(response.outputs["label"].string_val) == [b"cat", b"dog"]
    decoded = {name: tensor_to_array(t, name) for name, t in response.outputs.items()}
    assert decoded["score"].tolist() == [[0.5], [0.25]] and decoded["label"].tolist() == [b"cat", b"dog"]


def test_response_without_a_numeric_version_leaves_it_unset() -> None:
    response = pb.PredictResponse.FromString(encode_predict_response({}, "m", ""))
    assert not response.model_spec.HasField("version")


def test_messages_live_in_modelhost_own_package() -> None:
    # Not "tensorflow.serving": tensorflow-serving-api can share the process's descriptor pool.
    assert pb.PredictRequest.DESCRIPTOR.full_name == "modelhost.tfserving.PredictRequest"
    assert pb.TensorProto.DESCRIPTOR.fields_by_name["tensor_content"].number == 4


def test_a_response_sent_as_a_request_is_refused() -> None:
    # The bytes parse (field 2, the response's ModelSpec, reads as an inputs entry keyed by its name "m"),
    # so the input check is what catches it.
    body = encode_predict_response({"y": np.ones(2, np.float32)}, "m", "1")
    with pytest.raises(ModelhostError, match="PredictRequest.inputs has unknown input.*'m'"):
        decode_predict_request(body, [X])
