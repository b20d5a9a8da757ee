"""Property tests over every request decoder: whatever bytes, JSON document or protobuf message comes in,
the decoder returns arrays or raises ModelhostError(INVALID_INPUT) (UNSUPPORTED for a V2 extension it
lacks), never another exception, and never allocates more than the input and the request limits justify
(measured with tracemalloc, which sees numpy's buffers too).
"""

from __future__ import annotations

import json
import math
import tracemalloc
from collections.abc import Callable, Iterator
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from modelhost.errors import ErrorKind, ModelhostError
from modelhost.protocols.grpc_handlers import _parse
from modelhost.protocols.kserve_v2 import codec, grpc_codec
from modelhost.protocols.kserve_v2 import grpc_service_pb2 as pb
from modelhost.protocols.sagemaker.csv_payload import decode_csv
from modelhost.protocols.sagemaker.npy_payload import decode_npy
from modelhost.protocols.sagemaker.payloads import REQUEST_TYPES, decode_invocation
from modelhost.protocols.tfserving import predict_pb2 as tf
from modelhost.protocols.tfserving.json_codec import decode_predict
from modelhost.protocols.tfserving.tensor_proto import decode_predict_request, tensor_to_array
from modelhost.types import DATATYPE_DTYPES, RequestLimits, TensorSpec

LIMITS = RequestLimits(max_elements=4096, max_json_depth=8, max_output_bytes=1 << 20)
SPECS = [TensorSpec("x", "FP32", (-1, 4)), TensorSpec("s", "BYTES", (-1,), optional=True),
         TensorSpec("i", "INT64", (-1, -1), optional=True)]
ONE_SPEC = [TensorSpec("x", "FP32", (-1, 4))]
FAST = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
# What a decode may allocate beyond its input: every element of the limit as a Python object, plus slack.
OVERHEAD = LIMITS.max_elements * 64 + 256 * 1024


@pytest.fixture(autouse=True, scope="module")
def traced() -> Iterator[None]:
    tracemalloc.start()
    yield
    tracemalloc.stop()


def decodes_or_refuses(decode: Callable[[], Any], input_size: int) -> None:
    """Run `decode`: a result, or INVALID_INPUT/UNSUPPORTED; its peak allocation within what its input justifies."""
    tracemalloc.reset_peak()
    before, _ = tracemalloc.get_traced_memory()
    try:
        decode()
    except ModelhostError as exc:
        assert exc.kind in (ErrorKind.INVALID_INPUT, ErrorKind.UNSUPPORTED), exc
        assert exc.message
    _, peak = tracemalloc.get_traced_memory()
    assert peak - before <= 32 * input_size + OVERHEAD, (peak - before, input_size)


SHAPE_DIMS = st.sampled_from([0, 1, 2, 3, 4, 7, 2**31, 2**40, 2**62])
SHAPES = st.lists(SHAPE_DIMS, max_size=70) | st.lists(st.integers(0, 5), max_size=4)
DATATYPES = st.sampled_from([*DATATYPE_DTYPES, "BF16", "FLOAT", ""])
SCALARS = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=5)
JSON_VALUES = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=5)
                           | st.dictionaries(st.text(max_size=4), inner, max_size=3), max_leaves=40)
DEEP = st.integers(1, 70).map(lambda depth: json.loads("[" * depth + "1" + "]" * depth))
DATA = JSON_VALUES | DEEP | st.lists(st.floats(width=32) | st.integers(-(2**70), 2**70), max_size=40)


def dumps(document: Any) -> bytes:
    return json.dumps(document).encode()  # the standard library writes integers of any size


v2_tensor = st.fixed_dictionaries(
    {"name": st.sampled_from(["x", "y", ""]), "datatype": DATATYPES, "shape": SHAPES},
    optional={"data": DATA, "parameters": st.fixed_dictionaries({}, optional={
        "binary_data_size": st.integers(-2, 64) | JSON_VALUES})},
)
v2_document = st.fixed_dictionaries(
    {"inputs": st.lists(v2_tensor, max_size=3)},
    optional={"outputs": st.lists(st.fixed_dictionaries({"name": st.sampled_from(["y", "x"])}, optional={
        "parameters": st.dictionaries(st.sampled_from(["binary_data", "classification"]), SCALARS)}), max_size=3),
        "id": SCALARS, "parameters": JSON_VALUES},
)


@FAST
@given(st.binary(max_size=300), st.none() | st.integers(-5, 400))
def test_v2_http_codec_arbitrary_bytes(body: bytes, header_length: int | None) -> None:
    decodes_or_refuses(lambda: codec.decode_infer_request(body, header_length, "m", limits=LIMITS), len(body))


@FAST
@given(JSON_VALUES | v2_document)
def test_v2_http_codec_arbitrary_json(document: Any) -> None:
    body = dumps(document)
    decodes_or_refuses(lambda: codec.decode_infer_request(body, None, "m", limits=LIMITS), len(body))


@FAST
@given(v2_document, st.binary(max_size=200))
def test_v2_http_codec_binary_extension(document: dict[str, Any], tail: bytes) -> None:
    header = dumps(document)
    body = header + tail
    decodes_or_refuses(lambda: codec.decode_infer_request(body, len(header), "m", limits=LIMITS), len(body))


INT64S = st.integers(-(2**63), 2**63 - 1)
contents = st.builds(
    pb.InferTensorContents,
    bool_contents=st.lists(st.booleans(), max_size=8), int_contents=st.lists(st.integers(-(2**31), 2**31 - 1),
                                                                             max_size=8),
    int64_contents=st.lists(INT64S, max_size=8), uint_contents=st.lists(st.integers(0, 2**32 - 1), max_size=8),
    fp32_contents=st.lists(st.floats(width=32), max_size=8), bytes_contents=st.lists(st.binary(max_size=4), max_size=8),
)


@st.composite
def infer_messages(draw: st.DrawFn) -> pb.ModelInferRequest:
    message = pb.ModelInferRequest(model_name="m", id=draw(st.text(max_size=4)))
    for _ in range(draw(st.integers(0, 3))):
        tensor = message.inputs.add(name=draw(st.sampled_from(["x", "y", ""])), datatype=draw(DATATYPES),
                                    shape=draw(st.lists(st.sampled_from([-1, 0, 1, 2, 4, 2**40, 2**62]), max_size=70)))
        if draw(st.booleans()):
            tensor.contents.CopyFrom(draw(contents))
    for _ in range(draw(st.integers(0, 3))):
        message.raw_input_contents.append(draw(st.binary(max_size=40)))
    for name in draw(st.lists(st.sampled_from(["y", "x", ""]), max_size=3)):
        message.outputs.add(name=name)
    return message


@FAST
@given(infer_messages())
def test_grpc_codec_arbitrary_messages(message: pb.ModelInferRequest) -> None:
    decodes_or_refuses(lambda: grpc_codec.decode_infer_request(message, LIMITS), message.ByteSize())


@FAST
@given(st.binary(max_size=300) | infer_messages().map(lambda m: m.SerializeToString()).flatmap(
    lambda data: st.integers(0, len(data)).map(lambda cut: data[:cut])))
def test_grpc_arbitrary_and_truncated_bytes(data: bytes) -> None:
    decodes_or_refuses(lambda: grpc_codec.decode_infer_request(_parse(pb.ModelInferRequest, data), LIMITS),
                       len(data))


def npy_header(descr: str, shape: tuple[int, ...], fortran: bool) -> bytes:
    header = f"{{'descr': {descr!r}, 'fortran_order': {fortran}, 'shape': {shape}, }}".encode()
    header += b" " * (63 - (len(header) + 10) % 64) + b"\n"
    return b"\x93NUMPY\x01\x00" + len(header).to_bytes(2, "little") + header


NPY_DESCRS = st.sampled_from(["<f4", ">f8", "<i8", "|b1", "|u1", "<U3", "|S2", "|O", "<V4", "<c8", "<f2", "|S0"])


@FAST
@given(st.binary(max_size=200).map(lambda data: b"\x93NUMPY" + data)
       | st.builds(lambda descr, shape, fortran, data: npy_header(descr, tuple(shape), fortran) + data,
                   NPY_DESCRS, st.lists(SHAPE_DIMS, max_size=66), st.booleans(), st.binary(max_size=64)),
       st.sampled_from([TensorSpec("x", "FP32", (-1, 4)), TensorSpec("s", "BYTES", (-1,)),
                        TensorSpec("i", "INT8", (-1,)), TensorSpec("b", "BOOL", (-1,))]))
def test_npy_arbitrary_bodies(body: bytes, spec: TensorSpec) -> None:
    decodes_or_refuses(lambda: decode_npy(body, spec, LIMITS), len(body))


@FAST
@given(st.binary(max_size=200) | st.text(alphabet="0123456789.,-e\n\" truefalsnaINF", max_size=200).map(str.encode),
       st.sampled_from([TensorSpec("x", "FP32", (-1, 4)), TensorSpec("s", "BYTES", (-1, -1)),
                        TensorSpec("i", "UINT8", (-1,)), TensorSpec("b", "BOOL", (-1, 2)),
                        TensorSpec("scalar", "FP32", ())]))
def test_csv_arbitrary_bodies(body: bytes, spec: TensorSpec) -> None:
    decodes_or_refuses(lambda: decode_csv(body, spec, LIMITS), len(body))


tf_document = st.fixed_dictionaries({}, optional={
    "instances": JSON_VALUES | DATA | st.lists(st.dictionaries(st.sampled_from(["x", "s", "i", "z"]), DATA,
                                                               max_size=3), max_size=3),
    "inputs": JSON_VALUES | DATA | st.dictionaries(st.sampled_from(["x", "s", "i", "z"]), DATA, max_size=3),
    "signature_name": SCALARS,
})


@FAST
@given(st.binary(max_size=200) | (JSON_VALUES | tf_document).map(dumps))
def test_tfserving_json_arbitrary_documents(body: bytes) -> None:
    decodes_or_refuses(lambda: decode_predict(body, SPECS, LIMITS), len(body))


@st.composite
def tensor_protos(draw: st.DrawFn) -> tf.TensorProto:
    proto = tf.TensorProto(dtype=draw(st.integers(0, 25)))
    for size in draw(st.lists(st.sampled_from([-1, 0, 1, 3, 2**20, 2**40, 2**62]), max_size=66)):
        proto.tensor_shape.dim.add(size=size)
    proto.tensor_shape.unknown_rank = draw(st.booleans()) and draw(st.booleans())
    choice = draw(st.sampled_from(["content", "float_val", "int_val", "int64_val", "string_val", "half_val",
                                   "bool_val", "uint64_val"]))
    if choice == "content":
        proto.tensor_content = draw(st.binary(max_size=64))
    elif choice == "float_val":
        proto.float_val.extend(draw(st.lists(st.floats(width=32), max_size=4)))
    elif choice == "string_val":
        proto.string_val.extend(draw(st.lists(st.binary(max_size=3), max_size=4)))
    elif choice == "bool_val":
        proto.bool_val.extend(draw(st.lists(st.booleans(), max_size=4)))
    elif choice == "uint64_val":
        proto.uint64_val.extend(draw(st.lists(st.integers(0, 2**64 - 1), max_size=4)))
    elif choice == "int64_val":
        proto.int64_val.extend(draw(st.lists(INT64S, max_size=4)))
    else:
        getattr(proto, choice).extend(draw(st.lists(st.integers(-(2**31), 2**31 - 1), max_size=4)))
    return proto


@FAST
@given(tensor_protos())
def test_tensor_proto_arbitrary_tensors(proto: tf.TensorProto) -> None:
    decodes_or_refuses(lambda: tensor_to_array(proto, "t", LIMITS.budget()), proto.ByteSize())


@FAST
@given(st.binary(max_size=300) | st.builds(
    lambda tensors: tf.PredictRequest(inputs=tensors).SerializeToString(),
    st.dictionaries(st.sampled_from(["x", "s", "i", "z"]), tensor_protos(), max_size=3)))
def test_predict_request_arbitrary_bytes(body: bytes) -> None:
    decodes_or_refuses(lambda: decode_predict_request(body, SPECS, LIMITS), len(body))


@settings(FAST, max_examples=30)
@given(st.binary(max_size=300) | (JSON_VALUES | v2_document | tf_document).map(dumps),
       st.sampled_from(REQUEST_TYPES), st.sampled_from([SPECS, ONE_SPEC]))
def test_sagemaker_invocations_arbitrary_bodies(body: bytes, content_type: str, specs: list[TensorSpec]) -> None:
    decodes_or_refuses(lambda: decode_invocation(body, content_type, specs, LIMITS), len(body))


def test_the_allocation_bound_catches_an_allocation_on_the_inputs_word() -> None:
    """The bound above is tight enough to fail a decoder that allocates what a header declares."""
    with pytest.raises(AssertionError):
        decodes_or_refuses(lambda: bytearray(math.prod((2**12, 2**12))), 100)
    assert orjson.loads(b"[]") == []
