"""KServe V2 gRPC codec: ModelInferRequest -> InferRequest, InferResponse -> ModelInferResponse, and the
metadata, config, statistics and index messages. Wire compatibility is proved against tritonclient.grpc's
own generated messages and its own request builder and result reader."""

from __future__ import annotations

import struct
from typing import Any

import numpy as np
import pytest
from tritonclient.grpc import InferInput, InferRequestedOutput, InferResult, service_pb2
from tritonclient.grpc._utils import _get_inference_request

from modelhost.config.model_config_pb2 import ModelConfig
from modelhost.config.pbtxt import config_to_json
from modelhost.core.manager import IndexEntry
from modelhost.core.statistics import ExecutionTiming, ModelStatistics
from modelhost.errors import ErrorKind, ModelhostError
from modelhost.protocols.kserve_v2 import grpc_service_pb2 as pb
from modelhost.protocols.kserve_v2.grpc_codec import (
    config_to_proto,
    decode_infer_request,
    encode_infer_response,
    index_to_proto,
    metadata_to_proto,
    parameters_from_proto,
    parameters_to_proto,
    statistics_to_proto,
)
from modelhost.types import InferRequest, InferResponse, ModelMetadata, RequestedOutput, TensorSpec

SAMPLES: dict[str, np.ndarray] = {
    "BOOL": np.array([[True, False, True], [False, False, True]]),
    "UINT8": np.array([[0, 7, 255], [1, 2, 3]], dtype=np.uint8),
    "UINT16": np.array([[0, 7, 65535], [1, 2, 3]], dtype=np.uint16),
    "UINT32": np.array([[0, 7, 2**32 - 1], [1, 2, 3]], dtype=np.uint32),
    "UINT64": np.array([[0, 7, 2**64 - 1], [1, 2, 3]], dtype=np.uint64),
    "INT8": np.array([[-128, 0, 127], [1, -2, 3]], dtype=np.int8),
    "INT16": np.array([[-32768, 0, 32767], [1, -2, 3]], dtype=np.int16),
    "INT32": np.array([[-(2**31), 0, 2**31 - 1], [1, -2, 3]], dtype=np.int32),
    "INT64": np.array([[-(2**63), 0, 2**63 - 1], [1, -2, 3]], dtype=np.int64),
    "FP16": np.array([[0.5, -1.25, 65504.0], [1, 2, 3]], dtype=np.float16),
    "FP32": np.array([[0.5, -1.25, 3.4e38], [1, 2, 3]], dtype=np.float32),
    "FP64": np.array([[0.5, -1.25, 1e308], [1, 2, 3]], dtype=np.float64),
    "BYTES": np.array([[b"", b"a", b"\x00\xff"], [b"hello", "é".encode(), b"x" * 300]], dtype=object),
}
TYPED_FIELDS = {
    "BOOL": "bool_contents", "UINT8": "uint_contents", "UINT16": "uint_contents", "UINT32": "uint_contents",
    "UINT64": "uint64_contents", "INT8": "int_contents", "INT16": "int_contents", "INT32": "int_contents",
    "INT64": "int64_contents", "FP32": "fp32_contents", "FP64": "fp64_contents", "BYTES": "bytes_contents",
}


def serialize_bytes(elements: list[bytes]) -> bytes:
    return b"".join(struct.pack("<I", len(e)) + e for e in elements)


def client_request(arrays: dict[str, np.ndarray], **options: Any) -> pb.ModelInferRequest:
    """What tritonclient.grpc puts on the wire for infer(), parsed by our generated classes."""
    inputs = []
    for name, array in arrays.items():
        datatype = next(d for d, s in SAMPLES.items() if s.dtype == array.dtype)
        inputs.append(InferInput(name, list(array.shape), datatype).set_data_from_numpy(array))
    arguments: dict[str, Any] = {
        "model_name": "m", "model_version": "", "request_id": "", "outputs": None, "sequence_id": 0,
        "sequence_start": False, "sequence_end": False, "priority": 0, "timeout": None, "parameters": None,
    }
    arguments.update(options)
    message = _get_inference_request(inputs=inputs, **arguments)
    return pb.ModelInferRequest.FromString(message.SerializeToString())


def typed_request(datatype: str, array: np.ndarray, messages: Any = pb) -> pb.ModelInferRequest:
    """A request with typed contents, built with `messages` (ours or tritonclient's service_pb2)."""
    message = messages.ModelInferRequest(model_name="m")
    tensor = message.inputs.add(name="x", datatype=datatype, shape=array.shape)
    getattr(tensor.contents, TYPED_FIELDS[datatype]).extend(array.reshape(-1).tolist())
    if messages is pb:
        return message
    return pb.ModelInferRequest.FromString(message.SerializeToString())


def raw_request(datatype: str, shape: list[int], *raw: bytes) -> pb.ModelInferRequest:
    message = pb.ModelInferRequest(model_name="m")
    message.inputs.add(name="x", datatype=datatype, shape=shape)
    message.raw_input_contents.extend(raw)
    return message


def rejects(message: pb.ModelInferRequest, match: str, kind: ErrorKind = ErrorKind.INVALID_INPUT) -> None:
    with pytest.raises(ModelhostError, match=match) as info:
        decode_infer_request(message)
    assert info.value.kind is kind, info.value


def assert_same(actual: np.ndarray, expected: np.ndarray) -> None:
    assert actual.dtype == expected.dtype
    assert actual.shape == expected.shape
    assert actual.tolist() == expected.tolist()


# Inputs: raw and typed, from our classes and from tritonclient's.


@pytest.mark.parametrize("datatype", list(SAMPLES))
def test_raw_input_from_tritonclient(datatype: str) -> None:
    request = decode_infer_request(client_request({"x": SAMPLES[datatype]}))
    assert_same(request.inputs["x"], SAMPLES[datatype])


@pytest.mark.parametrize("datatype", list(SAMPLES))
def test_raw_input_from_own_messages(datatype: str) -> None:
    array = SAMPLES[datatype]
    data = serialize_bytes(list(array.flat)) if datatype == "BYTES" else array.tobytes()
    assert_same(decode_infer_request(raw_request(datatype, list(array.shape), data)).inputs["x"], array)


@pytest.mark.parametrize("datatype", list(TYPED_FIELDS))
@pytest.mark.parametrize("messages", [pb, service_pb2], ids=["own", "tritonclient"])
def test_typed_input(datatype: str, messages: Any) -> None:
    assert_same(decode_infer_request(typed_request(datatype, SAMPLES[datatype], messages)).inputs["x"],
                SAMPLES[datatype])


def test_empty_tensors_raw_and_typed() -> None:
    request = decode_infer_request(client_request({"a": np.zeros((0, 3), np.float32), "b": np.array([], object)}))
    assert request.inputs["a"].shape == (0, 3) and request.inputs["b"].shape == (0,)
    message = pb.ModelInferRequest(model_name="m")
    message.inputs.add(name="x", datatype="INT8", shape=[2, 0], contents=pb.InferTensorContents())
    assert decode_infer_request(message).inputs["x"].shape == (2, 0)


def test_raw_inputs_are_read_only_views_of_the_message_bytes() -> None:
    message = client_request({"a": SAMPLES["FP32"], "b": SAMPLES["INT64"]})
    request = decode_infer_request(message)
    for index, name in enumerate(("a", "b")):
        array = request.inputs[name]
        assert not array.flags.writeable and not array.flags.owndata
        base: Any = array
        while isinstance(base, np.ndarray):
            base = base.base
        assert isinstance(base, memoryview) and isinstance(base.obj, bytes)
        assert base.obj == message.raw_input_contents[index]


def test_several_inputs_keep_their_order_and_data() -> None:
    arrays = {"ids": SAMPLES["INT64"], "text": SAMPLES["BYTES"], "mask": SAMPLES["BOOL"]}
    request = decode_infer_request(client_request(arrays))
    assert list(request.inputs) == ["ids", "text", "mask"]
    for name, array in arrays.items():
        assert_same(request.inputs[name], array)


def test_request_fields_outputs_and_parameters_from_tritonclient() -> None:
    message = client_request(
        {"x": SAMPLES["FP32"]}, model_name="rank", model_version="3", request_id="req-1",
        outputs=[InferRequestedOutput("y"), InferRequestedOutput("z")], priority=2, timeout=1500,
        sequence_id=7, sequence_start=True, parameters={"tag": "a", "flag": True, "n": -5, "f": 0.25},
    )
    request = decode_infer_request(message)
    assert (request.model_name, request.model_version, request.id) == ("rank", "3", "req-1")
    assert [(o.name, o.parameters) for o in request.outputs or ()] == [("y", {}), ("z", {})]
    assert request.parameters == {
        "priority": 2, "timeout": 1500, "sequence_id": 7, "sequence_start": True, "sequence_end": False,
        "tag": "a", "flag": True, "n": -5, "f": 0.25,
    }
    assert type(request.parameters["priority"]) is int and type(request.parameters["timeout"]) is int


def test_no_requested_outputs_means_all() -> None:
    assert decode_infer_request(client_request({"x": SAMPLES["FP32"]})).outputs is None


def test_output_parameters_pass_through_and_input_parameters_are_dropped() -> None:
    message = raw_request("FP32", [1], np.float32(1).tobytes())
    message.inputs[0].parameters["note"].string_param = "kept out of the request"
    output = message.outputs.add(name="y")
    output.parameters["binary_data"].bool_param = True
    output.parameters["top"].uint64_param = 3
    request = decode_infer_request(message)
    assert request.outputs is not None and request.outputs[0].parameters == {"binary_data": True, "top": 3}
    assert request.parameters == {}


# Input errors.


def test_raw_entry_count_must_match_inputs() -> None:
    message = client_request({"a": SAMPLES["FP32"], "b": SAMPLES["FP32"]})
    del message.raw_input_contents[1]
    rejects(message, r"raw_input_contents has 1 entries, but the request has 2 inputs")


def test_raw_and_typed_contents_cannot_mix() -> None:
    message = client_request({"a": SAMPLES["FP32"]})
    message.inputs.add(name="b", datatype="INT32", shape=[1]).contents.int_contents.append(1)
    message.raw_input_contents.append(b"\x00" * 4)
    rejects(message, r"input 'b' sets 'contents', but the request uses raw_input_contents")


def test_input_without_data() -> None:
    message = pb.ModelInferRequest(model_name="m")
    message.inputs.add(name="x", datatype="FP32", shape=[1])
    rejects(message, r"input 'x' has neither 'contents' nor an entry in raw_input_contents")


@pytest.mark.parametrize(
    ("name", "datatype", "shape", "match"),
    [
        ("", "FP32", [1], r"inputs\[0\] has no 'name'"),
        ("x", "", [1], r"input 'x' has no 'datatype'"),
        ("x", "FLOAT", [1], r"input 'x' has unknown datatype 'FLOAT'; known: BOOL"),
        ("x", "BF16", [1], r"input 'x' has unknown datatype 'BF16'"),
        ("x", "FP32", [2, -1], r"input 'x' needs 'shape' as a list of non-negative integers, got \[2, -1\]"),
    ],
)
def test_bad_tensor_header(name: str, datatype: str, shape: list[int], match: str) -> None:
    message = raw_request(datatype, shape, b"\x00" * 4)
    message.inputs[0].name = name
    rejects(message, match)


def test_duplicate_input() -> None:
    message = client_request({"x": SAMPLES["FP32"]})
    message.inputs.add().CopyFrom(message.inputs[0])
    message.raw_input_contents.append(message.raw_input_contents[0])
    rejects(message, r"input 'x' appears twice in the request")


@pytest.mark.parametrize(
    ("datatype", "shape", "raw", "match"),
    [
        ("FP32", [2, 2], b"\x00" * 12, r"input 'x' has 12 bytes of binary data, but shape \[2,2\] of FP32 needs 16"),
        ("FP16", [3], b"\x00" * 8, r"input 'x' has 8 bytes .* FP16 needs 6"),
        ("BYTES", [1], b"\x03\x00", r"input 'x': BYTES element 0 has a truncated 4-byte length prefix"),
        ("BYTES", [1], b"\x05\x00\x00\x00abc", r"input 'x': BYTES element 0 of 5 bytes runs past its data"),
        ("BYTES", [3], serialize_bytes([b"a", b"b"]), r"input 'x' has 2 BYTES elements, but its shape needs 3"),
    ],
)
def test_raw_size_must_match_shape(datatype: str, shape: list[int], raw: bytes, match: str) -> None:
    rejects(raw_request(datatype, shape, raw), match)


def test_typed_element_count_must_match_shape() -> None:
    message = typed_request("FP32", np.zeros((2, 2), np.float32))
    message.inputs[0].shape[:] = [2, 3]
    rejects(message, r"input 'x' has 4 elements, but shape \[2,3\] needs 6")


def test_typed_data_in_the_wrong_field() -> None:
    message = typed_request("FP32", np.zeros(2, np.float32))
    message.inputs[0].contents.int_contents.append(1)
    rejects(message, r"input 'x' is FP32, so its data goes in 'fp32_contents', not 'int_contents'")


def test_fp16_cannot_be_typed() -> None:
    message = pb.ModelInferRequest(model_name="m")
    message.inputs.add(name="x", datatype="FP16", shape=[1]).contents.fp32_contents.append(1.0)
    rejects(message, r"input 'x': FP16 data cannot be sent as typed contents; use raw_input_contents")


@pytest.mark.parametrize(("datatype", "values"), [("INT8", [1, 128]), ("INT16", [-32769]), ("UINT8", [256]),
                                                  ("UINT16", [0, 65536])])
def test_typed_values_out_of_range(datatype: str, values: list[int]) -> None:
    message = pb.ModelInferRequest(model_name="m")
    tensor = message.inputs.add(name="x", datatype=datatype, shape=[len(values)])
    getattr(tensor.contents, TYPED_FIELDS[datatype]).extend(values)
    rejects(message, rf"input 'x' has values outside the range of {datatype}")


def test_requested_output_without_name() -> None:
    message = client_request({"x": SAMPLES["FP32"]}, outputs=[InferRequestedOutput("y")])
    message.outputs.add()
    rejects(message, r"outputs\[1\] has no 'name'")


def test_classification_reaches_the_core() -> None:
    message = client_request({"x": SAMPLES["FP32"]}, outputs=[InferRequestedOutput("y", class_count=3)])
    assert decode_infer_request(message).outputs == [RequestedOutput("y", {"classification": 3})]


def test_parameter_without_value() -> None:
    message = client_request({"x": SAMPLES["FP32"]})
    message.parameters["empty"].CopyFrom(pb.InferParameter())
    rejects(message, r"request parameter 'empty' has no value")


# Responses, read back by tritonclient.grpc.


def tritonclient_result(message: pb.ModelInferResponse) -> InferResult:
    return InferResult(service_pb2.ModelInferResponse.FromString(message.SerializeToString()))


@pytest.mark.parametrize("datatype", list(SAMPLES))
def test_response_read_by_tritonclient(datatype: str) -> None:
    array = SAMPLES[datatype]
    response = InferResponse("m", "2", {"y": array, "z": array[:1]}, id="req-9")
    result = tritonclient_result(encode_infer_response(response, InferRequest("m", {})))
    for name, expected in (("y", array), ("z", array[:1])):
        assert_same(result.as_numpy(name), expected)
        output = result.get_output(name)
        assert (output.datatype, list(output.shape)) == (datatype, list(expected.shape))
    reply = result.get_response()
    assert (reply.model_name, reply.model_version, reply.id) == ("m", "2", "req-9")
    assert [o.name for o in reply.outputs] == ["y", "z"]


def test_response_of_non_contiguous_and_str_outputs() -> None:
    strings = np.array(["ab", "é"], dtype=np.str_)
    transposed = np.arange(6, dtype=np.int32).reshape(2, 3).T
    result = tritonclient_result(encode_infer_response(InferResponse("m", "1", {"s": strings, "t": transposed}),
                                                       InferRequest("m", {})))
    assert result.as_numpy("s").tolist() == [b"ab", "é".encode()]
    assert result.as_numpy("t").tolist() == transposed.tolist()


def test_response_parameters() -> None:
    response = InferResponse("m", "1", {}, parameters={"done": True, "n": 3, "big": 2**64 - 1, "f": 0.5, "s": "x"})
    message = tritonclient_result(encode_infer_response(response, InferRequest("m", {}))).get_response()
    assert {k: getattr(v, v.WhichOneof("parameter_choice")) for k, v in message.parameters.items()} == \
        response.parameters
    assert message.parameters["big"].WhichOneof("parameter_choice") == "uint64_param"


# Parameters.


def test_parameters_round_trip() -> None:
    values = {"b": True, "i": -(2**63), "u": 2**63, "f": 1.5, "s": "text", "np": np.int32(4), "nb": np.bool_(False)}
    message = pb.ModelInferRequest()
    parameters_to_proto(values, message.parameters)
    assert parameters_from_proto(message.parameters, "request") == {**values, "np": 4, "nb": False}
    assert message.parameters["nb"].WhichOneof("parameter_choice") == "bool_param"


@pytest.mark.parametrize(("value", "match"), [(2**64, r"parameter 'p' = 18446744073709551616 does not fit"),
                                              (-(2**63) - 1, r"does not fit in 64 bits"),
                                              ([1], r"parameter 'p' is a list; parameters are bool")])
def test_parameters_that_cannot_be_encoded(value: Any, match: str) -> None:
    with pytest.raises(ModelhostError, match=match):
        parameters_to_proto({"p": value}, pb.ModelInferResponse().parameters)


def test_repository_parameters_from_tritonclient_load() -> None:
    message = service_pb2.RepositoryModelLoadRequest(model_name="m")
    message.parameters["config"].string_param = "{}"
    message.parameters["file:1/model.onnx"].bytes_param = b"\x00\x01"
    ours = pb.RepositoryModelLoadRequest.FromString(message.SerializeToString())
    assert parameters_from_proto(ours.parameters, "load") == {"config": "{}", "file:1/model.onnx": b"\x00\x01"}


# Metadata, configuration, statistics and index.


def test_metadata_to_proto() -> None:
    metadata = ModelMetadata("m", ("1", "3"), "onnxruntime_onnx",
                             (TensorSpec("x", "FP32", (-1, 4)),), (TensorSpec("y", "BYTES", (-1,)),))
    theirs = service_pb2.ModelMetadataResponse.FromString(metadata_to_proto(metadata).SerializeToString())
    assert (theirs.name, list(theirs.versions), theirs.platform) == ("m", ["1", "3"], "onnxruntime_onnx")
    assert [(t.name, t.datatype, list(t.shape)) for t in theirs.inputs] == [("x", "FP32", [-1, 4])]
    assert [(t.name, t.datatype, list(t.shape)) for t in theirs.outputs] == [("y", "BYTES", [-1])]


def test_config_to_proto_round_trips_the_served_json() -> None:
    config = ModelConfig(name="m", platform="onnxruntime_onnx", max_batch_size=8)
    config.input.add(name="x", data_type=11, dims=[4])
    config.dynamic_batching.max_queue_delay_microseconds = 2**40
    response = config_to_proto(config_to_json(config))
    assert response.config == config
    theirs = service_pb2.ModelConfigResponse.FromString(response.SerializeToString())
    assert (theirs.config.name, theirs.config.max_batch_size, list(theirs.config.input[0].dims)) == ("m", 8, [4])
    assert theirs.config.dynamic_batching.max_queue_delay_microseconds == 2**40


def test_statistics_to_proto() -> None:
    statistics = ModelStatistics()
    statistics.record_execution(rows=4, requests=2, timing=ExecutionTiming([10, 30], 100, 2000, 300))
    statistics.record_request(True, 5000)
    statistics.record_request(False, 700)
    stats_json = [statistics.as_json("m", 1), ModelStatistics().as_json("m", 2)]
    theirs = service_pb2.ModelStatisticsResponse.FromString(statistics_to_proto(stats_json).SerializeToString())
    first, second = theirs.model_stats
    assert (first.name, first.version, first.inference_count, first.execution_count) == ("m", "1", 4, 1)
    assert first.last_inference == stats_json[0]["last_inference"] > 0
    stats = first.inference_stats
    assert [(d.count, d.ns) for d in (stats.success, stats.fail, stats.queue, stats.compute_infer)] == [
        (1, 5000), (1, 700), (2, 40), (2, 4000)]
    assert [(b.batch_size, b.compute_infer.count, b.compute_infer.ns) for b in first.batch_stats] == [(4, 1, 2000)]
    assert (second.version, second.inference_count, len(second.batch_stats)) == ("2", 0, 0)


def test_index_to_proto() -> None:
    entries = [IndexEntry("a", "1", "READY", ""), IndexEntry("broken", "", "UNAVAILABLE", "bad config")]
    theirs = service_pb2.RepositoryIndexResponse.FromString(index_to_proto(entries).SerializeToString())
    assert [(m.name, m.version, m.state, m.reason) for m in theirs.models] == [
        ("a", "1", "READY", ""), ("broken", "", "UNAVAILABLE", "bad config")]
