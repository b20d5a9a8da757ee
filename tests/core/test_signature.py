"""Signature: per-request input/output checks against a completed config, and reshape both ways."""

from __future__ import annotations

import numpy as np
import pytest

from modelhost.backends.base import ModelSignature
from modelhost.config.pbtxt import parse_config
from modelhost.core.signature import NamedSignature, Signature, named_signatures
from modelhost.types import RequestedOutput, TensorSpec
from tests.helpers import rejected
from tests.onnx_models import ADD_SUB_CONFIG


def signature(text: str, name: str = "m") -> Signature:
    config = parse_config(text)
    config.name = name
    return Signature.from_config(config)


ADD_SUB = signature(ADD_SUB_CONFIG, name="add_sub")

UNBATCHED = signature("""
max_batch_size: 0
input [
  { name: "image" data_type: TYPE_UINT8 dims: [ 3, -1, -1 ] },
  { name: "scale" data_type: TYPE_FP32 dims: [ 1 ] }
]
output [ { name: "label" data_type: TYPE_STRING dims: [ 1 ] } ]
""", name="unbatched")

SCALAR = signature("""
max_batch_size: 4
input [ { name: "x" data_type: TYPE_FP32 dims: [ 1 ] reshape: { shape: [ ] } } ]
output [ { name: "y" data_type: TYPE_FP32 dims: [ 1 ] reshape: { shape: [ ] } } ]
""", name="scalar")

OPTIONAL = signature("""
max_batch_size: 4
input [
  { name: "ids" data_type: TYPE_INT64 dims: [ -1 ] },
  { name: "mask" data_type: TYPE_INT64 dims: [ -1 ] optional: true },
  { name: "text" data_type: TYPE_STRING dims: [ 1 ] optional: true }
]
output [ { name: "logits" data_type: TYPE_FP32 dims: [ -1, 2 ] } ]
""", name="optional")


def f32(*shape: int) -> np.ndarray:
    return np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape)


class TestFromConfig:
    def test_rules(self) -> None:
        rule = OPTIONAL.inputs["mask"]
        assert (rule.name, rule.datatype, rule.dtype, rule.dims, rule.reshape, rule.optional) == (
            "mask", "INT64", np.dtype(np.int64), (-1,), None, True
        )
        assert OPTIONAL.inputs["text"].datatype == "BYTES" and OPTIONAL.inputs["text"].dtype == np.dtype(object)
        assert SCALAR.inputs["x"].reshape == ()
        assert ADD_SUB.max_batch_size == 8 and UNBATCHED.max_batch_size == 0

    def test_specs_include_batch_dim(self) -> None:
        assert ADD_SUB.specs(ADD_SUB.inputs) == (
            TensorSpec("INPUT0", "FP32", (-1, 16)), TensorSpec("INPUT1", "FP32", (-1, 16))
        )
        assert SCALAR.specs(SCALAR.outputs) == (TensorSpec("y", "FP32", (-1, 1)),)
        assert OPTIONAL.specs(OPTIONAL.inputs)[1] == TensorSpec("mask", "INT64", (-1, -1), True)

    def test_specs_unbatched(self) -> None:
        assert UNBATCHED.specs(UNBATCHED.inputs) == (
            TensorSpec("image", "UINT8", (3, -1, -1)), TensorSpec("scale", "FP32", (1,))
        )
        assert UNBATCHED.specs(UNBATCHED.outputs) == (TensorSpec("label", "BYTES", (1,)),)


class TestCheckInputs:
    def test_valid_batch(self) -> None:
        a, b = f32(3, 16), f32(3, 16)
        feeds, batch = ADD_SUB.check_inputs({"INPUT1": b, "INPUT0": a})
        assert batch == 3
        assert list(feeds) == ["INPUT0", "INPUT1"]  # config order
        assert feeds["INPUT0"] is a and feeds["INPUT1"] is b  # no copies

    def test_batch_at_max(self) -> None:
        _, batch = ADD_SUB.check_inputs({"INPUT0": f32(8, 16), "INPUT1": f32(8, 16)})
        assert batch == 8

    def test_batch_above_max(self) -> None:
        rejected(lambda: ADD_SUB.check_inputs({"INPUT0": f32(9, 16), "INPUT1": f32(9, 16)}),
                 r"input 'INPUT0' has batch size 9, above max_batch_size 8 of model 'add_sub'")

    def test_batch_mismatch_between_inputs(self) -> None:
        rejected(lambda: ADD_SUB.check_inputs({"INPUT0": f32(2, 16), "INPUT1": f32(3, 16)}),
                 r"input 'INPUT1' has batch size 3, but other inputs have 2")

    def test_scalar_for_batching_model(self) -> None:
        rejected(lambda: ADD_SUB.check_inputs({"INPUT0": np.float32(1.0) * np.ones((), np.float32),
                                               "INPUT1": f32(1, 16)}),
                 r"input 'INPUT0' is a scalar, but model 'add_sub' needs a batch dimension")

    def test_missing_batch_dim(self) -> None:
        rejected(lambda: ADD_SUB.check_inputs({"INPUT0": f32(4), "INPUT1": f32(4, 16)}),
                 r"input 'INPUT0' has shape \[4\], but model 'add_sub' expects \[-1,16\]")

    def test_wrong_dims(self) -> None:
        rejected(lambda: ADD_SUB.check_inputs({"INPUT0": f32(1, 15), "INPUT1": f32(1, 16)}),
                 r"input 'INPUT0' has shape \[1,15\], but model 'add_sub' expects \[-1,16\]")

    def test_wrong_rank(self) -> None:
        rejected(lambda: ADD_SUB.check_inputs({"INPUT0": f32(1, 16, 1), "INPUT1": f32(1, 16)}),
                 r"has shape \[1,16,1\]")

    def test_wrong_datatype(self) -> None:
        rejected(lambda: ADD_SUB.check_inputs({"INPUT0": f32(1, 16).astype(np.float64), "INPUT1": f32(1, 16)}),
                 r"input 'INPUT0' has datatype FP64, but model 'add_sub' expects FP32")

    def test_unknown_input(self) -> None:
        error = rejected(lambda: ADD_SUB.check_inputs({"INPUT0": f32(1, 16), "INPUT1": f32(1, 16), "X": f32(1)}),
                         r"unexpected inference input 'X' for model 'add_sub'")
        assert "'INPUT0', 'INPUT1'" in error.message

    def test_missing_input(self) -> None:  # in Triton's words, as its qa/L0_input_validation checks them
        rejected(lambda: ADD_SUB.check_inputs({"INPUT0": f32(1, 16)}),
                 r"expected 2 inputs but got 1 inputs for model 'add_sub'\. Got input\(s\) \['INPUT0'\], but "
                 r"missing required input\(s\) \['INPUT1'\]\. Please provide all required input\(s\)\.")
        rejected(lambda: ADD_SUB.check_inputs({}), r"got 0 inputs .* Got input\(s\) \[\], .* \['INPUT0','INPUT1'\]")

    def test_empty_batch(self) -> None:
        feeds, batch = ADD_SUB.check_inputs({"INPUT0": f32(0, 16), "INPUT1": f32(0, 16)})
        assert feeds["INPUT0"].shape == (0, 16)
        assert batch == 0  # zero rows stay zero: the scheduler slices batches by rows


class TestOptionalInputs:
    def test_optional_may_be_omitted(self) -> None:
        ids = np.zeros((2, 5), np.int64)
        feeds, batch = OPTIONAL.check_inputs({"ids": ids})
        assert list(feeds) == ["ids"] and batch == 2

    def test_optional_given_is_checked(self) -> None:
        ids = np.zeros((2, 5), np.int64)
        feeds, _ = OPTIONAL.check_inputs({"ids": ids, "mask": np.ones((2, 5), np.int64)})
        assert list(feeds) == ["ids", "mask"]
        rejected(lambda: OPTIONAL.check_inputs({"ids": ids, "mask": np.ones((2, 5), np.int32)}),
                 "input 'mask' has datatype INT32")
        rejected(lambda: OPTIONAL.check_inputs({"ids": ids, "mask": np.ones((3, 5), np.int64)}),
                 "input 'mask' has batch size 3, but other inputs have 2")

    def test_required_still_required(self) -> None:
        rejected(lambda: OPTIONAL.check_inputs({"mask": np.ones((1, 5), np.int64)}),
                 r"expected number of inputs between 1 and 3 but got 1 inputs .* missing required input\(s\) \['ids'\]")

    def test_variable_dims(self) -> None:
        for length in (1, 7, 300):
            feeds, _ = OPTIONAL.check_inputs({"ids": np.zeros((1, length), np.int64)})
            assert feeds["ids"].shape == (1, length)

    @pytest.mark.parametrize("array", [
        np.array([[b"a"], [b"b"]], dtype=object),
        np.array([[b"a"], [b"bc"]]),  # numpy bytes ('S')
        np.array([["a"], ["bc"]]),  # numpy str ('U')
    ])
    def test_bytes_accepts_object_bytes_and_str_arrays(self, array: np.ndarray) -> None:
        feeds, _ = OPTIONAL.check_inputs({"ids": np.zeros((2, 1), np.int64), "text": array})
        assert feeds["text"] is array

    def test_bytes_rejects_numbers(self) -> None:
        rejected(lambda: OPTIONAL.check_inputs({"ids": np.zeros((1, 1), np.int64), "text": np.zeros((1, 1), np.int64)}),
                 "input 'text' has datatype INT64, but model 'optional' expects BYTES")


class TestUnbatched:
    def test_shape_is_the_full_shape(self) -> None:
        image = np.zeros((3, 32, 48), np.uint8)
        feeds, batch = UNBATCHED.check_inputs({"image": image, "scale": np.ones(1, np.float32)})
        assert batch == 1
        assert feeds["image"] is image

    def test_leading_batch_dim_is_rejected(self) -> None:
        rejected(lambda: UNBATCHED.check_inputs({"image": np.zeros((1, 3, 8, 8), np.uint8),
                                                 "scale": np.ones(1, np.float32)}),
                 r"input 'image' has shape \[1,3,8,8\], but model 'unbatched' expects \[3,-1,-1\]")

    def test_first_dim_is_not_a_batch_dim(self) -> None:
        # With max_batch_size 0 the first dim is checked like any other, and no batch limit applies.
        rejected(lambda: UNBATCHED.check_inputs({"image": np.zeros((4, 8, 8), np.uint8),
                                                 "scale": np.ones(1, np.float32)}),
                 r"expects \[3,-1,-1\]")

    def test_inputs_need_not_share_a_first_dim(self) -> None:
        _, batch = UNBATCHED.check_inputs({"image": np.zeros((3, 100, 2), np.uint8), "scale": np.ones(1, np.float32)})
        assert batch == 1


class TestReshape:
    def test_dims_1_reshape_empty_gives_backend_a_batch_vector(self) -> None:
        x = np.array([[1.0], [2.0], [3.0]], np.float32)
        feeds, batch = SCALAR.check_inputs({"x": x})
        assert batch == 3
        assert feeds["x"].shape == (3,)
        np.testing.assert_array_equal(feeds["x"], [1.0, 2.0, 3.0])
        assert np.shares_memory(feeds["x"], x)  # a view, not a copy

    def test_request_must_use_the_api_dims_not_the_reshape(self) -> None:
        rejected(lambda: SCALAR.check_inputs({"x": np.zeros(3, np.float32)}),
                 r"input 'x' has shape \[3\], but model 'scalar' expects \[-1,1\]")

    def test_output_reshaped_back_to_dims(self) -> None:
        out = SCALAR.shape_outputs({"y": np.array([5.0, 6.0], np.float32)}, ["y"])
        assert out["y"].shape == (2, 1)
        np.testing.assert_array_equal(out["y"], [[5.0], [6.0]])

    def test_unbatched_reshape_both_ways(self) -> None:
        sig = signature("""
max_batch_size: 0
input [ { name: "data_0" data_type: TYPE_FP32 dims: [ 3, 2, 2 ] reshape { shape: [ 1, 3, 2, 2 ] } } ]
output [ { name: "fc" data_type: TYPE_FP32 dims: [ 10 ] reshape { shape: [ 1, 10, 1, 1 ] } } ]
""")
        feeds, _ = sig.check_inputs({"data_0": f32(3, 2, 2)})
        assert feeds["data_0"].shape == (1, 3, 2, 2)
        out = sig.shape_outputs({"fc": f32(1, 10, 1, 1)}, ["fc"])
        assert out["fc"].shape == (10,)

    def test_batched_reshape_keeps_batch_dim(self) -> None:
        sig = signature("""
max_batch_size: 8
input [ { name: "x" data_type: TYPE_FP32 dims: [ 4, 4 ] reshape { shape: [ 16 ] } } ]
output [ { name: "y" data_type: TYPE_FP32 dims: [ 2, 8 ] reshape { shape: [ 16 ] } } ]
""")
        feeds, batch = sig.check_inputs({"x": f32(5, 4, 4)})
        assert batch == 5 and feeds["x"].shape == (5, 16)
        np.testing.assert_array_equal(feeds["x"], f32(5, 16))
        assert sig.shape_outputs({"y": f32(5, 16)}, ["y"])["y"].shape == (5, 2, 8)

    def test_reshape_with_one_variable_dim(self) -> None:
        sig = signature("""
max_batch_size: 4
input [ { name: "x" data_type: TYPE_FP32 dims: [ 2, -1 ] reshape { shape: [ 2, -1, 1 ] } } ]
output [ { name: "y" data_type: TYPE_FP32 dims: [ 2, -1 ] reshape { shape: [ 2, -1, 1 ] } } ]
""")
        feeds, _ = sig.check_inputs({"x": f32(3, 2, 5)})
        assert feeds["x"].shape == (3, 2, 5, 1)
        assert sig.shape_outputs({"y": f32(3, 2, 5, 1)}, ["y"])["y"].shape == (3, 2, 5)

    def test_reshape_with_two_variable_dims(self) -> None:
        # Valid in Triton (each -1-separated trunk has the same element count: [1,1,1] vs [1,1,1]),
        # so the variable sizes must be carried over from the request, not left to numpy's single -1.
        sig = signature("""
max_batch_size: 4
input [ { name: "x" data_type: TYPE_FP32 dims: [ -1, -1 ] reshape { shape: [ -1, -1, 1 ] } } ]
output [ { name: "y" data_type: TYPE_FP32 dims: [ -1, -1 ] reshape { shape: [ -1, -1, 1 ] } } ]
""")
        feeds, _ = sig.check_inputs({"x": f32(2, 3, 5)})
        assert feeds["x"].shape == (2, 3, 5, 1)
        assert sig.shape_outputs({"y": f32(2, 3, 5, 1)}, ["y"])["y"].shape == (2, 3, 5)


class TestOutputs:
    def test_none_or_empty_means_all_in_config_order(self) -> None:
        assert ADD_SUB.check_outputs(None) == ["OUTPUT0", "OUTPUT1"]
        assert ADD_SUB.check_outputs([]) == ["OUTPUT0", "OUTPUT1"]

    def test_requested_order_is_kept(self) -> None:
        assert ADD_SUB.check_outputs([RequestedOutput("OUTPUT1"), RequestedOutput("OUTPUT0")]) == ["OUTPUT1", "OUTPUT0"]
        assert ADD_SUB.check_outputs([RequestedOutput("OUTPUT1", {"binary_data": True})]) == ["OUTPUT1"]

    def test_unknown_output(self) -> None:
        error = rejected(lambda: ADD_SUB.check_outputs([RequestedOutput("OUTPUT9")]),
                         r"unexpected inference output 'OUTPUT9' for model 'add_sub'")
        assert "'OUTPUT0', 'OUTPUT1'" in error.message

    def test_shape_outputs_follows_names_and_drops_the_rest(self) -> None:
        results = {"OUTPUT0": f32(2, 16), "OUTPUT1": f32(2, 16) + 1}
        shaped = ADD_SUB.shape_outputs(results, ["OUTPUT1"])
        assert list(shaped) == ["OUTPUT1"]
        assert shaped["OUTPUT1"] is results["OUTPUT1"]

    def test_shape_outputs_order(self) -> None:
        results = {"OUTPUT0": f32(1, 16), "OUTPUT1": f32(1, 16)}
        assert list(ADD_SUB.shape_outputs(results, ["OUTPUT1", "OUTPUT0"])) == ["OUTPUT1", "OUTPUT0"]

    def test_unbatched_output_without_reshape_is_untouched(self) -> None:
        label = np.array([b"cat"], dtype=object)
        assert UNBATCHED.shape_outputs({"label": label}, ["label"])["label"] is label


def test_as_model_declares_shows_reshaped_tensors_in_the_model_files_shape() -> None:
    native = SCALAR.as_model_declares()
    assert native.specs(native.inputs) == (TensorSpec("x", "FP32", (-1,)),)
    feeds, rows = native.check_inputs({"x": np.ones(3, np.float32)})
    assert rows == 3 and feeds["x"].shape == (3,)
    assert native.shape_outputs({"y": np.ones(3, np.float32)}, ["y"])["y"].shape == (3,)
    assert ADD_SUB.as_model_declares() is ADD_SUB  # nothing reshaped: the same object


def test_named_signatures_batch_the_others_only_where_every_first_dim_varies() -> None:
    others = {
        "rows": ModelSignature((TensorSpec("s", "BYTES", (-1,)),), (TensorSpec("n", "INT32", (-1, 2)),),
                               "tensorflow/serving/classify"),
        "whole": ModelSignature((TensorSpec("t", "FP32", (4, 2)),), (TensorSpec("u", "FP32", (-1,)),)),
    }
    named = named_signatures(SCALAR, "", "tensorflow/serving/predict", others)
    assert list(named) == ["serving_default", "rows", "whole"]
    assert named["serving_default"] == NamedSignature(SCALAR.as_model_declares(), "", "tensorflow/serving/predict")
    rows = named["rows"]
    assert (rows.entry, rows.method, rows.signature.max_batch_size) == ("rows", "tensorflow/serving/classify", 4)
    assert rows.spec().inputs == (TensorSpec("s", "BYTES", (-1,)),)
    whole = named["whole"].signature
    assert whole.max_batch_size == 0 and whole.specs(whole.inputs) == (TensorSpec("t", "FP32", (4, 2)),)
    rejected(lambda: whole.check_inputs({"t": np.ones((3, 2), np.float32)}),
             r"has shape \[3,2\], but model 'scalar' expects \[4,2\]")
    # A served signature the model file names keeps that name; an "other" of the same name does not replace it.
    assert list(named_signatures(SCALAR, "upper", "", {"upper": others["rows"]})) == ["upper"]
