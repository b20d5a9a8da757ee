"""Triton's raw binary request, read against the model's metadata."""

from __future__ import annotations

import numpy as np
import pytest

from modelhost.protocols.kserve_v2.raw_codec import decode_raw_request
from modelhost.types import ModelMetadata
from tests.core.test_signature import signature
from tests.helpers import rejected


def metadata(text: str) -> ModelMetadata:
    sig = signature(text)
    return ModelMetadata("m", ("1",), "onnxruntime_onnx", sig.specs(sig.inputs), sig.specs(sig.outputs),
                         sig.max_batch_size)


class TestRawInputs:
    """Triton's raw binary request: the body is all of the only input, batch 1."""

    def test_variable_dim_is_decided_by_the_data(self) -> None:
        sig = metadata('max_batch_size: 8 input [{ name: "x" data_type: TYPE_FP32 dims: [ 2, -1 ] }] '
                        'output [{ name: "y" data_type: TYPE_FP32 dims: [ 2, -1 ] }]')
        data = np.arange(6, dtype=np.float32).tobytes()
        [(name, array)] = decode_raw_request(data, sig).inputs.items()
        assert name == "x" and array.shape == (1, 2, 3)
        np.testing.assert_array_equal(array.reshape(-1), np.arange(6, dtype=np.float32))

    def test_unbatched_fixed_shape(self) -> None:
        sig = metadata('input [{ name: "x" data_type: TYPE_INT32 dims: [ 3 ] }] '
                        'output [{ name: "y" data_type: TYPE_INT32 dims: [ 3 ] }]')
        assert decode_raw_request(np.arange(3, dtype=np.int32).tobytes(), sig).inputs["x"].shape == (3,)

    def test_bytes_input_takes_the_body_as_one_element(self) -> None:
        sig = metadata('max_batch_size: 4 input [{ name: "s" data_type: TYPE_STRING dims: [ 1 ] }] '
                        'output [{ name: "y" data_type: TYPE_STRING dims: [ 1 ] }]')
        array = decode_raw_request(b"hello world", sig).inputs["s"]
        assert array.shape == (1, 1) and array[0, 0] == b"hello world"

    @pytest.mark.parametrize(
        ("config", "size", "match"),
        [
            ('input [{ name: "x" data_type: TYPE_FP32 dims: [ -1, -1 ] }]', 16, "more than one variable"),
            ('input [{ name: "x" data_type: TYPE_FP32 dims: [ 4 ] }]', 12, "12 bytes does not fit"),
            ('input [{ name: "x" data_type: TYPE_FP32 dims: [ 3, -1 ] }]', 16, "16 bytes does not fit"),
            ('input [{ name: "x" data_type: TYPE_FP32 dims: [ 4 ] }]', 15, "15 bytes does not fit"),
            ('input [{ name: "a" data_type: TYPE_FP32 dims: [ 4 ] }, { name: "b" data_type: TYPE_FP32 dims: [ 4 ] }]',
             16, "exactly one input"),
            ('max_batch_size: 4 input [{ name: "s" data_type: TYPE_STRING dims: [ -1 ] }]', 3,
             r"For BYTE datatype raw input 's', the model must have input shape \[1\]"),  # as Triton's qa/L0_http
            ('input [{ name: "s" data_type: TYPE_STRING dims: [ 1, 1 ] }]', 3, r"shape \[1\]; 'm' has \[1,1\]"),
        ],
    )
    def test_data_that_does_not_fit(self, config: str, size: int, match: str) -> None:
        sig = metadata(config + ' output [{ name: "y" data_type: TYPE_FP32 dims: [ 4 ] }]')
        rejected(lambda: decode_raw_request(b"\0" * size, sig), match)


def test_outputs_go_back_binary_and_the_input_views_the_body() -> None:
    body = bytearray(np.arange(4, dtype=np.float32).tobytes())
    request = decode_raw_request(memoryview(body), metadata(
        'max_batch_size: 8 input [{ name: "x" data_type: TYPE_FP32 dims: [ 4 ] }] '
        'output [{ name: "y" data_type: TYPE_FP32 dims: [ 4 ] }]'))
    assert request.parameters == {"binary_data_output": True}
    body[:4] = np.float32(9).tobytes()
    assert request.inputs["x"][0, 0] == 9  # a view of the body, not a copy
