"""KServe V2 codec: JSON and binary-extension request bodies -> InferRequest, InferResponse -> body parts."""

from __future__ import annotations

import struct
from typing import Any

import numpy as np
import orjson
import pytest

from modelhost.errors import ErrorKind, ModelhostError
from modelhost.protocols.kserve_v2.codec import decode_infer_request, encode_infer_response
from modelhost.types import InferRequest, InferResponse, RequestedOutput


def json_body(document: dict[str, Any]) -> bytes:
    return orjson.dumps(document)


def binary_body(document: dict[str, Any], *chunks: bytes) -> tuple[bytes, int]:
    """JSON header followed by raw chunks, as tritonclient sends it; returns (body, header length)."""
    header = orjson.dumps(document)
    return header + b"".join(chunks), len(header)


def tensor(name: str, datatype: str, shape: list[int], **fields: Any) -> dict[str, Any]:
    return {"name": name, "datatype": datatype, "shape": shape, **fields}


def binary_tensor(name: str, datatype: str, shape: list[int], size: int) -> dict[str, Any]:
    return tensor(name, datatype, shape, parameters={"binary_data_size": size})


def serialize_bytes(elements: list[bytes]) -> bytes:
    """Triton's BYTES wire form: a 4-byte little-endian length before each element."""
    return b"".join(struct.pack("<I", len(e)) + e for e in elements)


def decode(body: bytes, header_length: int | None = None) -> InferRequest:
    return decode_infer_request(body, header_length, "m", "")


def invalid(body: bytes, header_length: int | None = None, match: str = "") -> ModelhostError:
    with pytest.raises(ModelhostError, match=match) as info:
        decode(body, header_length)
    assert info.value.kind is ErrorKind.INVALID_INPUT, info.value
    return info.value


def reaches(array: np.ndarray, body: bytes) -> bool:
    """Whether the array's base chain (ndarray -> memoryview -> ...) ends at the body object itself."""
    base: Any = array
    for _ in range(16):
        if base is body:
            return True
        if isinstance(base, memoryview):
            base = base.obj
        elif isinstance(base, np.ndarray):
            base = base.base
        else:
            return False
    return False


# --------------------------------------------------------------------------- JSON requests


class TestJsonRequest:
    def test_flat_data(self) -> None:
        request = decode(json_body({"inputs": [tensor("x", "INT32", [2, 3], data=[1, 2, 3, 4, 5, 6])]}))
        x = request.inputs["x"]
        assert x.dtype == np.int32 and x.shape == (2, 3)
        np.testing.assert_array_equal(x, [[1, 2, 3], [4, 5, 6]])

    def test_nested_data(self) -> None:
        request = decode(json_body({"inputs": [tensor("x", "FP32", [2, 2], data=[[1.5, 2], [3, 4.25]])]}))
        x = request.inputs["x"]
        assert x.dtype == np.float32 and x.shape == (2, 2)
        np.testing.assert_array_equal(x, np.array([[1.5, 2], [3, 4.25]], np.float32))

    def test_deeply_nested_data(self) -> None:
        data = np.arange(24).reshape(2, 3, 4).tolist()
        request = decode(json_body({"inputs": [tensor("x", "INT64", [2, 3, 4], data=data)]}))
        np.testing.assert_array_equal(request.inputs["x"], np.arange(24).reshape(2, 3, 4))
        assert request.inputs["x"].dtype == np.int64

    @pytest.mark.parametrize(
        ("datatype", "data", "dtype"),
        [
            ("BOOL", [True, False], np.bool_),
            ("UINT8", [0, 255], np.uint8),
            ("UINT16", [0, 65535], np.uint16),
            ("UINT32", [0, 2**32 - 1], np.uint32),
            ("UINT64", [0, 2**63 - 1], np.uint64),
            ("INT8", [-128, 127], np.int8),
            ("INT16", [-(2**15), 2**15 - 1], np.int16),
            ("INT32", [-(2**31), 2**31 - 1], np.int32),
            ("INT64", [-(2**63), 2**63 - 1], np.int64),
            ("FP32", [1, 2.5], np.float32),
            ("FP64", [0.1, -3], np.float64),
        ],
    )
    def test_every_json_datatype(self, datatype: str, data: list[Any], dtype: type) -> None:
        x = decode(json_body({"inputs": [tensor("x", datatype, [2], data=data)]})).inputs["x"]
        assert x.dtype == np.dtype(dtype)
        np.testing.assert_array_equal(x, np.array(data, dtype=dtype))

    def test_uint64_above_int64_range(self) -> None:
        # 2^63 .. 2^64-1 are valid UINT64 values; JSON carries them exactly as integers.
        data = [1, 2**63, 2**64 - 1]
        x = decode(json_body({"inputs": [tensor("x", "UINT64", [3], data=data)]})).inputs["x"]
        assert x.dtype == np.uint64
        assert x.tolist() == data

    def test_bytes_from_strings(self) -> None:
        x = decode(json_body({"inputs": [tensor("s", "BYTES", [2, 2], data=[["a", "bc"], ["", "é"]])]})).inputs["s"]
        assert x.dtype == np.object_ and x.shape == (2, 2)
        assert x.tolist() == [[b"a", b"bc"], [b"", "é".encode()]]

    def test_empty_tensor(self) -> None:
        x = decode(json_body({"inputs": [tensor("x", "FP32", [0, 4], data=[])]})).inputs["x"]
        assert x.shape == (0, 4) and x.dtype == np.float32

    def test_several_inputs_keep_order_and_metadata(self) -> None:
        request = decode_infer_request(
            json_body({
                "id": "req-42",
                "parameters": {"priority": 1, "custom": "yes"},
                "inputs": [tensor("b", "INT8", [1], data=[1]), tensor("a", "INT8", [1], data=[2])],
                "outputs": [{"name": "y", "parameters": {"binary_data": True}}, {"name": "z"}],
            }),
            None, "model", "3",
        )
        assert request.model_name == "model" and request.model_version == "3"
        assert list(request.inputs) == ["b", "a"]
        assert request.id == "req-42"
        assert request.parameters == {"priority": 1, "custom": "yes"}
        assert request.outputs == [RequestedOutput("y", {"binary_data": True}), RequestedOutput("z", {})]

    def test_no_outputs_means_all(self) -> None:
        assert decode(json_body({"inputs": []})).outputs is None
        assert decode(json_body({"inputs": [], "outputs": []})).outputs is None


class TestJsonRequestErrors:
    def test_too_few_elements(self) -> None:
        invalid(json_body({"inputs": [tensor("x", "FP32", [2, 2], data=[1, 2, 3])]}),
                match=r"input 'x' has 3 elements, but shape \[2,2\] needs 4")

    def test_too_many_elements(self) -> None:
        invalid(json_body({"inputs": [tensor("x", "INT32", [2], data=[1, 2, 3])]}), match="input 'x' has 3 elements")

    def test_bytes_wrong_count(self) -> None:
        invalid(json_body({"inputs": [tensor("s", "BYTES", [3], data=["a", "b"])]}), match="input 's' has 2 elements")

    @pytest.mark.parametrize("data", [[[1, 2], [3]], [[1, 2], 3, 4], [[1], [[2]], 3]])
    def test_ragged(self, data: list[Any]) -> None:
        invalid(json_body({"inputs": [tensor("x", "FP32", [2, 2], data=data)]}), match="input 'x'.*ragged")

    @pytest.mark.parametrize(("datatype", "value"), [("UINT8", 300), ("UINT8", -1), ("INT8", 128), ("INT16", -40000),
                                                      ("UINT32", 2**32), ("INT32", 2**31)])
    def test_out_of_range_integers(self, datatype: str, value: int) -> None:
        invalid(json_body({"inputs": [tensor("x", datatype, [2], data=[1, value])]}),
                match=f"input 'x' has values outside the range of {datatype}")

    def test_floats_for_int32(self) -> None:
        invalid(json_body({"inputs": [tensor("x", "INT32", [2], data=[1.5, 2])]}),
                match="input 'x' is INT32, so its data must be integers")

    def test_integral_floats_for_int32(self) -> None:
        invalid(json_body({"inputs": [tensor("x", "INT32", [1], data=[1.0])]}), match="must be integers")

    def test_booleans_for_int32(self) -> None:
        invalid(json_body({"inputs": [tensor("x", "INT32", [2], data=[True, False])]}), match="must be integers")

    def test_booleans_mixed_into_int32(self) -> None:
        # Triton's JSON parser wants integers for integer tensors; `true` is not one.
        invalid(json_body({"inputs": [tensor("x", "INT32", [2], data=[True, 1])]}), match="must be integers")

    def test_strings_for_fp32(self) -> None:
        invalid(json_body({"inputs": [tensor("x", "FP32", [2], data=["1.5", "2"])]}),
                match="input 'x' is FP32, so its data must be numbers")

    def test_mixed_strings_for_fp32(self) -> None:
        invalid(json_body({"inputs": [tensor("x", "FP32", [2], data=[1.5, "2"])]}), match="must be numbers")

    def test_null_for_fp32(self) -> None:
        invalid(json_body({"inputs": [tensor("x", "FP32", [1], data=[None])]}), match="must be numbers")

    def test_numbers_for_bool(self) -> None:
        invalid(json_body({"inputs": [tensor("x", "BOOL", [2], data=[1, 0])]}),
                match="BOOL, so its data must be true/false")

    def test_numbers_for_bytes(self) -> None:
        invalid(json_body({"inputs": [tensor("x", "BYTES", [2], data=["a", 1])]}),
                match="BYTES, so its data must be strings")
        invalid(json_body({"inputs": [tensor("x", "BYTES", [2, 1], data=[["a"], [None]])]}),
                match="BYTES, so its data must be strings, got NoneType")

    @pytest.mark.parametrize("data", [["a", "b", "c", "d"], [["a", "b"], ["c", "d"]], [[["a"], ["b"]], [["c"], ["d"]]],
                                      [["a", "b"], "c", "d"]])
    def test_strings_flat_or_nested_are_read_in_row_major_order(self, data: list[object]) -> None:
        request = decode_infer_request(json_body({"inputs": [tensor("x", "BYTES", [2, 2], data=data)]}), None, "m")
        assert request.inputs["x"].tolist() == [[b"a", b"b"], [b"c", b"d"]]

    def test_fp16_needs_binary(self) -> None:
        invalid(json_body({"inputs": [tensor("x", "FP16", [1], data=[1.0])]}),
                match="FP16 data cannot be sent as JSON; use binary tensor data")

    def test_bf16_is_not_served(self) -> None:
        invalid(json_body({"inputs": [tensor("x", "BF16", [1], data=[1.0])]}), match="unknown datatype 'BF16'")

    def test_no_data(self) -> None:
        invalid(json_body({"inputs": [tensor("x", "FP32", [1])]}), match="neither 'data' nor a binary_data_size")

    @pytest.mark.parametrize(
        ("document", "pattern"),
        [
            ({}, "no 'inputs' list"),
            ({"inputs": {"x": 1}}, "'inputs' must be a list"),
            ({"inputs": ["x"]}, r"inputs\[0\] must be an object"),
            ({"inputs": [{"datatype": "FP32", "shape": [1], "data": [1]}]}, r"inputs\[0\] has no 'name'"),
            ({"inputs": [{"name": "x", "shape": [1], "data": [1]}]}, "input 'x' has no 'datatype'"),
            ({"inputs": [tensor("x", "FLOAT", [1], data=[1])]}, "unknown datatype 'FLOAT'"),
            ({"inputs": [{"name": "x", "datatype": "FP32", "data": [1]}]}, "needs 'shape'"),
            ({"inputs": [tensor("x", "FP32", [-1], data=[1])]}, "non-negative integers"),
            ({"inputs": [tensor("x", "FP32", [1.5], data=[1])]}, "non-negative integers"),
            ({"inputs": [tensor("x", "FP32", [1], data=[1]), tensor("x", "FP32", [1], data=[2])]}, "appears twice"),
            ({"inputs": [], "id": 7}, "'id' must be a string"),
            ({"inputs": [], "parameters": [1]}, "'parameters' must be an object"),
            ({"inputs": [], "outputs": [{"parameters": {}}]}, r"outputs\[0\] must be an object with a 'name'"),
        ],
    )
    def test_malformed_documents(self, document: dict[str, Any], pattern: str) -> None:
        invalid(json_body(document), match=pattern)

    def test_not_json(self) -> None:
        invalid(b"{not json", match="not valid JSON")

    def test_not_an_object(self) -> None:
        invalid(b"[1, 2]", match="JSON object")

    def test_classification_reaches_the_core(self) -> None:
        # The codec carries the parameter; the core (core/classification.py) checks and applies it.
        body = json_body({"inputs": [], "outputs": [{"name": "y", "parameters": {"classification": 3}}]})
        assert decode(body).outputs == [RequestedOutput("y", {"classification": 3})]


# --------------------------------------------------------------------------- binary requests


class TestBinaryRequest:
    def test_binary_inputs_are_views_of_the_body(self) -> None:
        a = np.arange(6, dtype=np.float32).reshape(2, 3)
        b = np.array([[1, -2, 3]], dtype=np.int64)
        body, length = binary_body(
            {"inputs": [binary_tensor("a", "FP32", [2, 3], a.nbytes), binary_tensor("b", "INT64", [1, 3], b.nbytes)]},
            a.tobytes(), b.tobytes(),
        )
        request = decode(body, length)
        whole = np.frombuffer(body, np.uint8)
        for name, expected in (("a", a), ("b", b)):
            x = request.inputs[name]
            np.testing.assert_array_equal(x, expected)
            assert x.dtype == expected.dtype and x.shape == expected.shape
            assert np.shares_memory(x, whole), f"{name} was copied"
            assert reaches(x, body), f"{name}'s base chain does not reach the body"
        # the first tensor starts right after the JSON header
        assert request.inputs["a"].__array_interface__["data"][0] == whole[length:].__array_interface__["data"][0]

    @pytest.mark.parametrize(
        ("datatype", "array"),
        [
            ("BOOL", np.array([True, False, True])),
            ("UINT8", np.array([0, 7, 255], np.uint8)),
            ("UINT16", np.array([1, 65535], np.uint16)),
            ("UINT32", np.array([1, 2**32 - 1], np.uint32)),
            ("UINT64", np.array([1, 2**64 - 1], np.uint64)),
            ("INT8", np.array([-128, 127], np.int8)),
            ("INT16", np.array([-1, 2], np.int16)),
            ("INT32", np.array([-1, 2], np.int32)),
            ("INT64", np.array([-(2**63), 2**63 - 1], np.int64)),
            ("FP16", np.array([0.5, -2], np.float16)),
            ("FP32", np.array([0.1, 3], np.float32)),
            ("FP64", np.array([0.1, 3], np.float64)),
        ],
    )
    def test_every_binary_datatype(self, datatype: str, array: np.ndarray) -> None:
        document = {"inputs": [binary_tensor("x", datatype, [array.size], array.nbytes)]}
        body, length = binary_body(document, array.tobytes())
        x = decode(body, length).inputs["x"]
        assert x.dtype == array.dtype
        np.testing.assert_array_equal(x, array)
        assert np.shares_memory(x, np.frombuffer(body, np.uint8))

    def test_mixed_json_and_binary_inputs(self) -> None:
        chunk = np.array([1, 2], np.int32).tobytes()
        body, length = binary_body(
            {"inputs": [tensor("j", "FP32", [1], data=[0.5]), binary_tensor("b", "INT32", [2], 8)]}, chunk
        )
        request = decode(body, length)
        assert request.inputs["j"].tolist() == [0.5]
        assert request.inputs["b"].tolist() == [1, 2]

    def test_bytes_elements_with_length_prefixes(self) -> None:
        elements = [b"hello", b"", b"\x00\xff binary", "é".encode()]
        chunk = serialize_bytes(elements)
        assert chunk[:4] == b"\x05\x00\x00\x00"  # little-endian length of b"hello"
        body, length = binary_body({"inputs": [binary_tensor("s", "BYTES", [2, 2], len(chunk))]}, chunk)
        s = decode(body, length).inputs["s"]
        assert s.dtype == np.object_ and s.shape == (2, 2)
        assert s.reshape(-1).tolist() == elements
        assert all(type(e) is bytes for e in s.flat)

    def test_bytes_followed_by_numeric(self) -> None:
        strings = serialize_bytes([b"ab", b"cde"])
        numbers = np.array([7, 8], np.int16).tobytes()
        body, length = binary_body(
            {"inputs": [binary_tensor("s", "BYTES", [2], len(strings)), binary_tensor("n", "INT16", [2], 4)]},
            strings, numbers,
        )
        request = decode(body, length)
        assert request.inputs["s"].tolist() == [b"ab", b"cde"]
        assert request.inputs["n"].tolist() == [7, 8]

    def test_empty_binary_tensor(self) -> None:
        body, length = binary_body({"inputs": [binary_tensor("x", "FP32", [0], 0),
                                               binary_tensor("s", "BYTES", [0], 0)]})
        request = decode(body, length)
        assert request.inputs["x"].shape == (0,) and request.inputs["s"].shape == (0,)


class TestBinaryRequestErrors:
    def test_truncated_bytes_prefix(self) -> None:
        chunk = serialize_bytes([b"abc"]) + b"\x02\x00"  # second prefix has 2 of its 4 bytes
        body, length = binary_body({"inputs": [binary_tensor("s", "BYTES", [2], len(chunk))]}, chunk)
        invalid(body, length, match="input 's': BYTES element 1 has a truncated 4-byte length prefix")

    def test_bytes_element_runs_past_its_data(self) -> None:
        chunk = struct.pack("<I", 10) + b"short"
        body, length = binary_body({"inputs": [binary_tensor("s", "BYTES", [1], len(chunk))]}, chunk)
        invalid(body, length, match="BYTES element 0 of 10 bytes runs past its data")

    def test_bytes_too_few_elements(self) -> None:
        chunk = serialize_bytes([b"a", b"b"])
        body, length = binary_body({"inputs": [binary_tensor("s", "BYTES", [3], len(chunk))]}, chunk)
        invalid(body, length, match="input 's' has 2 BYTES elements, but its shape needs 3")

    def test_bytes_too_many_elements(self) -> None:
        chunk = serialize_bytes([b"a", b"b", b"c"])
        body, length = binary_body({"inputs": [binary_tensor("s", "BYTES", [2], len(chunk))]}, chunk)
        invalid(body, length, match="has 3 BYTES elements, but its shape needs 2")

    def test_numeric_size_does_not_match_shape(self) -> None:
        body, length = binary_body({"inputs": [binary_tensor("x", "FP32", [3], 8)]}, b"\x00" * 8)
        invalid(body, length, match=r"input 'x' has 8 bytes of binary data, but shape \[3\] of FP32 needs 12")

    def test_size_beyond_body(self) -> None:
        body, length = binary_body({"inputs": [binary_tensor("x", "FP32", [4], 16)]}, b"\x00" * 12)
        invalid(body, length, match="binary_data_size 16 exceeds the 12 bytes")

    def test_unclaimed_trailing_bytes(self) -> None:
        body, length = binary_body({"inputs": [binary_tensor("x", "FP32", [1], 4)]}, b"\x00" * 6)
        invalid(body, length, match="2 bytes of binary data that no input claims")

    def test_binary_without_header_length(self) -> None:
        # Without Inference-Header-Content-Length the whole body must be JSON.
        body, _ = binary_body({"inputs": [binary_tensor("x", "FP32", [1], 4)]}, b"\x00" * 4)
        with pytest.raises(ModelhostError) as info:
            decode(body, None)
        assert info.value.kind is ErrorKind.INVALID_INPUT

    @pytest.mark.parametrize("size", [-4, 1.5, "4", True])
    def test_bad_binary_data_size(self, size: Any) -> None:
        body, length = binary_body({"inputs": [binary_tensor("x", "FP32", [1], size)]}, b"\x00" * 4)
        invalid(body, length, match="binary_data_size must be a non-negative integer")

    @pytest.mark.parametrize("delta", [1, 1000])
    def test_header_length_beyond_body(self, delta: int) -> None:
        body = json_body({"inputs": []})
        invalid(body, len(body) + delta, match="outside the request body")

    def test_negative_header_length(self) -> None:
        invalid(json_body({"inputs": []}), -1, match="outside the request body")

    def test_header_length_cutting_the_json(self) -> None:
        body = json_body({"inputs": [tensor("x", "FP32", [1], data=[1])]})
        invalid(body, len(body) - 3, match="not valid JSON")

    def test_a_raw_binary_request_is_not_read_here(self) -> None:
        # Inference-Header-Content-Length 0 is read against the model's metadata (raw_codec); the route sends it there.
        invalid(b"\x01" * 8, 0, match="outside the request body")


# --------------------------------------------------------------------------- responses


def parse_response(parts: list[bytes], header_length: int | None) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """Decode a response the way tritonclient does: JSON header, then chunks by binary_data_size."""
    body = b"".join(parts)
    header = body if header_length is None else body[:header_length]
    document = orjson.loads(header)
    offset = len(header)
    binary: dict[str, np.ndarray] = {}
    dtypes = {"FP32": np.float32, "INT64": np.int64, "BOOL": np.bool_, "FP16": np.float16, "UINT8": np.uint8}
    for output in document["outputs"]:
        size = output.get("parameters", {}).get("binary_data_size")
        if size is None:
            continue
        chunk = body[offset : offset + size]
        offset += size
        if output["datatype"] == "BYTES":
            elements, at = [], 0
            while at < len(chunk):
                (n,) = struct.unpack_from("<I", chunk, at)
                elements.append(chunk[at + 4 : at + 4 + n])
                at += 4 + n
            binary[output["name"]] = np.array(elements, dtype=object).reshape(output["shape"])
        else:
            binary[output["name"]] = np.frombuffer(chunk, dtypes[output["datatype"]]).reshape(output["shape"])
    assert offset == len(body)
    return document, binary


def response(**outputs: np.ndarray) -> InferResponse:
    return InferResponse("m", "2", dict(outputs), id="")


class TestEncodeResponse:
    OUTPUTS = {
        "y": np.array([[1.5, 2.0], [3.0, 4.0]], np.float32),
        "s": np.array([b"ab", b"", b"\xc3\xa9"], dtype=object),
    }

    def test_json_by_default(self) -> None:
        parts, length = encode_infer_response(response(**self.OUTPUTS), InferRequest("m", {}))
        assert length is None and len(parts) == 1
        document = orjson.loads(parts[0])
        assert document["model_name"] == "m" and document["model_version"] == "2"
        assert "id" not in document
        y, s = document["outputs"]
        assert y == {"name": "y", "datatype": "FP32", "shape": [2, 2], "data": [1.5, 2.0, 3.0, 4.0]}  # flattened
        assert s == {"name": "s", "datatype": "BYTES", "shape": [3], "data": ["ab", "", "é"]}

    def test_id_is_echoed(self) -> None:
        out = InferResponse("m", "1", {"y": np.zeros(1, np.float32)}, id="abc-1")
        parts, _ = encode_infer_response(out, InferRequest("m", {}, id="abc-1"))
        assert orjson.loads(parts[0])["id"] == "abc-1"

    def test_id_round_trip_through_decode(self) -> None:
        request = decode(json_body({"id": "r7", "inputs": []}))
        parts, _ = encode_infer_response(InferResponse("m", "1", {}, id=request.id), request)
        assert orjson.loads(parts[0])["id"] == "r7"

    def test_binary_data_output_makes_all_outputs_binary(self) -> None:
        request = InferRequest("m", {}, parameters={"binary_data_output": True})
        parts, length = encode_infer_response(response(**self.OUTPUTS), request)
        assert length == len(parts[0])
        document, binary = parse_response(parts, length)
        for entry in document["outputs"]:
            assert "data" not in entry
        y, s = document["outputs"]
        assert y["parameters"] == {"binary_data_size": 16}
        assert s["parameters"] == {"binary_data_size": 4 * 3 + 2 + 0 + 2}
        np.testing.assert_array_equal(binary["y"], self.OUTPUTS["y"])
        assert binary["s"].tolist() == [b"ab", b"", b"\xc3\xa9"]
        assert parts[2] == struct.pack("<I", 2) + b"ab" + struct.pack("<I", 0) + struct.pack("<I", 2) + b"\xc3\xa9"

    def test_per_output_binary_overrides_request_default(self) -> None:
        request = InferRequest(
            "m", {}, outputs=[RequestedOutput("y", {"binary_data": False}), RequestedOutput("s")],
            parameters={"binary_data_output": True},
        )
        parts, length = encode_infer_response(response(**self.OUTPUTS), request)
        document, binary = parse_response(parts, length)
        y, s = document["outputs"]
        assert y["data"] == [1.5, 2.0, 3.0, 4.0] and "parameters" not in y
        assert "data" not in s and list(binary) == ["s"]

    def test_per_output_binary_without_request_default(self) -> None:
        request = InferRequest("m", {}, outputs=[RequestedOutput("y", {"binary_data": True}), RequestedOutput("s")])
        parts, length = encode_infer_response(response(**self.OUTPUTS), request)
        assert length is not None
        document, binary = parse_response(parts, length)
        assert list(binary) == ["y"]
        assert document["outputs"][1]["data"] == ["ab", "", "é"]

    def test_binary_data_output_false(self) -> None:
        request = InferRequest("m", {}, parameters={"binary_data_output": False})
        _, length = encode_infer_response(response(**self.OUTPUTS), request)
        assert length is None

    def test_header_length_counts_only_the_json(self) -> None:
        request = InferRequest("m", {}, parameters={"binary_data_output": True})
        parts, length = encode_infer_response(response(y=self.OUTPUTS["y"]), request)
        header = parts[0]
        assert length == len(header)
        assert header.endswith(b"}") and orjson.loads(header)["outputs"][0]["name"] == "y"
        assert parts[1] == self.OUTPUTS["y"].tobytes()

    def test_binary_output_of_non_contiguous_array(self) -> None:
        array = np.arange(12, dtype=np.int64).reshape(3, 4)[:, ::2]
        parts, length = encode_infer_response(response(y=array),
                                              InferRequest("m", {}, parameters={"binary_data_output": True}))
        _, binary = parse_response(parts, length)
        np.testing.assert_array_equal(binary["y"], array)

    def test_json_bool_and_fp16(self) -> None:
        parts, _ = encode_infer_response(
            response(b=np.array([True, False]), h=np.array([0.5], np.float16)), InferRequest("m", {})
        )
        b, h = orjson.loads(parts[0])["outputs"]
        assert b["datatype"] == "BOOL" and b["data"] == [True, False]
        assert h["datatype"] == "FP16" and h["data"] == [0.5]

    def test_non_utf8_bytes_output_needs_binary(self) -> None:
        with pytest.raises(ModelhostError, match="binary_data") as info:
            encode_infer_response(response(s=np.array([b"\xff"], dtype=object)), InferRequest("m", {}))
        assert info.value.kind is ErrorKind.INVALID_INPUT

    def test_response_parameters(self) -> None:
        out = InferResponse("m", "1", {}, parameters={"sequence_id": 3})
        parts, _ = encode_infer_response(out, InferRequest("m", {}))
        assert orjson.loads(parts[0])["parameters"] == {"sequence_id": 3}

    def test_round_trip_binary_request_to_binary_response(self) -> None:
        a = np.linspace(0, 1, 8, dtype=np.float32).reshape(2, 4)
        body, length = binary_body(
            {"inputs": [binary_tensor("a", "FP32", [2, 4], a.nbytes)], "parameters": {"binary_data_output": True}},
            a.tobytes(),
        )
        request = decode(body, length)
        parts, out_length = encode_infer_response(InferResponse("m", "1", {"y": request.inputs["a"] * 2}), request)
        _, binary = parse_response(parts, out_length)
        np.testing.assert_array_equal(binary["y"], a * 2)

    @pytest.mark.parametrize("binary", [True, False])
    def test_bytes_output_held_as_numpy_bytes_array(self, binary: bool) -> None:
        # datatype_of() reports numpy 'S' arrays as BYTES, so the encoder must write them as BYTES:
        # 4-byte length prefixes in binary, strings in JSON (not raw fixed-width bytes, not a crash).
        array = np.array([b"ab", b"c"])
        assert array.dtype.kind == "S"
        request = InferRequest("m", {}, parameters={"binary_data_output": binary})
        parts, length = encode_infer_response(response(s=array), request)
        document, decoded = parse_response(parts, length)
        assert document["outputs"][0]["datatype"] == "BYTES"
        if binary:
            assert decoded["s"].tolist() == [b"ab", b"c"]
        else:
            assert document["outputs"][0]["data"] == ["ab", "c"]
