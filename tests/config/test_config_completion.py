"""config.pbtxt completed against the model file (Triton's auto-complete), and configs that contradict the model."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from onnx import TensorProto

from modelhost.backends.base import ModelSignature
from modelhost.backends.onnx import OnnxBackend
from modelhost.config.completion import complete_config
from modelhost.config.model_config_pb2 import DataType, ModelConfig
from modelhost.config.pbtxt import ConfigError, parse_config
from modelhost.core.model_loading import load_version, plan_model
from modelhost.store.local import LocalStore
from tests.config.config_samples import (
    simple_config,
)
from tests.onnx_models import add_sub_model, identity_model, write_model

# --------------------------------------------------------------------------- completion against the ONNX model


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, ModelSignature]:
    """Model signatures as the onnxruntime backend describes them."""
    repo = tmp_path_factory.mktemp("models")
    built = {
        "add_sub": add_sub_model(),  # INPUT0/1, OUTPUT0/1: FP32 [batch, 16]
        "fixed_first": identity_model(TensorProto.INT32, batch=False, dims=(3, -1)),  # [3, d1]
        "batch_scalar": identity_model(TensorProto.FLOAT, batch=True, dims=()),  # [batch]
        "fixed_scalar": identity_model(TensorProto.INT64, batch=False, dims=()),  # []
        "strings": identity_model(TensorProto.STRING, batch=True, dims=(2,)),  # [batch, 2]
    }
    backend = OnnxBackend()
    return {
        name: backend.describe(write_model(repo, name, model, None) / "1" / "model.onnx")
        for name, model in built.items()
    }


def complete(text: str | None, signature: ModelSignature, default_max_batch_size: int = 4) -> ModelConfig:
    config = parse_config(text) if text is not None else ModelConfig()
    return complete_config(config, signature.inputs, signature.outputs, "1/model.onnx", default_max_batch_size)


def io(tensors) -> list[tuple[str, str, list[int], list[int] | None]]:  # type: ignore[no-untyped-def]
    return [
        (t.name, DataType.Name(t.data_type), list(t.dims), list(t.reshape.shape) if t.HasField("reshape") else None)
        for t in tensors
    ]


class TestComplete:
    def test_describe_reads_full_shapes(self, models: dict[str, ModelSignature]) -> None:
        sig = models["add_sub"]
        assert [(s.name, s.datatype, s.shape) for s in sig.inputs] == [
            ("INPUT0", "FP32", (-1, 16)), ("INPUT1", "FP32", (-1, 16))
        ]
        assert [s.name for s in sig.outputs] == ["OUTPUT0", "OUTPUT1"]
        assert models["fixed_first"].inputs[0].shape == (3, -1)

    def test_no_config_batching_model(self, models: dict[str, ModelSignature]) -> None:
        config = complete(None, models["add_sub"])
        assert config.max_batch_size == 4
        assert io(config.input) == [("INPUT0", "TYPE_FP32", [16], None), ("INPUT1", "TYPE_FP32", [16], None)]
        assert io(config.output) == [("OUTPUT0", "TYPE_FP32", [16], None), ("OUTPUT1", "TYPE_FP32", [16], None)]

    def test_default_max_batch_size_is_a_parameter(self, models: dict[str, ModelSignature]) -> None:
        assert complete(None, models["add_sub"], default_max_batch_size=32).max_batch_size == 32

    def test_explicit_max_batch_size_is_kept(self, models: dict[str, ModelSignature]) -> None:
        config = complete('platform: "onnxruntime_onnx"\nmax_batch_size: 16', models["add_sub"])
        assert config.max_batch_size == 16
        assert io(config.input)[0] == ("INPUT0", "TYPE_FP32", [16], None)

    def test_fixed_first_dim_stays_unbatched(self, models: dict[str, ModelSignature]) -> None:
        config = complete(None, models["fixed_first"])
        assert config.max_batch_size == 0
        assert io(config.input) == [("INPUT0", "TYPE_INT32", [3, -1], None)]
        assert io(config.output) == [("OUTPUT0", "TYPE_INT32", [3, -1], None)]

    def test_batch_only_tensor_becomes_dims_1_reshape_empty(self, models: dict[str, ModelSignature]) -> None:
        config = complete(None, models["batch_scalar"])
        assert config.max_batch_size == 4
        assert io(config.input) == [("INPUT0", "TYPE_FP32", [1], [])]
        assert io(config.output) == [("OUTPUT0", "TYPE_FP32", [1], [])]

    def test_scalar_model_is_unbatched(self, models: dict[str, ModelSignature]) -> None:
        config = complete(None, models["fixed_scalar"])
        assert config.max_batch_size == 0
        assert io(config.input) == [("INPUT0", "TYPE_INT64", [1], [])]

    def test_string_tensors_become_type_string(self, models: dict[str, ModelSignature]) -> None:
        config = complete(None, models["strings"])
        assert io(config.input) == [("INPUT0", "TYPE_STRING", [2], None)]

    def test_input_is_not_modified(self, models: dict[str, ModelSignature]) -> None:
        original = parse_config("max_batch_size: 0")
        complete_config(original, models["add_sub"].inputs, models["add_sub"].outputs, "1/model.onnx", 4)
        assert not original.input and original.max_batch_size == 0

    def test_matching_config_is_unchanged(self, models: dict[str, ModelSignature]) -> None:
        text = simple_config()
        assert complete(text, models["add_sub"]) == parse_config(text)

    def test_config_may_list_a_subset_of_outputs(self, models: dict[str, ModelSignature]) -> None:
        text = """
max_batch_size: 8
input [
  { name: "INPUT0" data_type: TYPE_FP32 dims: [ 16 ] },
  { name: "INPUT1" data_type: TYPE_FP32 dims: [ 16 ] }
]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 16 ] } ]
"""
        config = complete(text, models["add_sub"])
        assert [t.name for t in config.output] == ["OUTPUT0"]

    def test_config_with_inputs_only_gets_outputs_from_model(self, models: dict[str, ModelSignature]) -> None:
        # Triton's onnxruntime backend auto-completes inputs and outputs independently
        # (AutoCompleteConfig: `if (output_cnt == 0) AutoCompleteIO("output", ...)`).
        text = """
max_batch_size: 8
input [
  { name: "INPUT0" data_type: TYPE_FP32 dims: [ 16 ] },
  { name: "INPUT1" data_type: TYPE_FP32 dims: [ 16 ] }
]
"""
        config = complete(text, models["add_sub"])
        assert io(config.output) == [("OUTPUT0", "TYPE_FP32", [16], None), ("OUTPUT1", "TYPE_FP32", [16], None)]

    def test_config_with_outputs_only_gets_inputs_from_model(self, models: dict[str, ModelSignature]) -> None:
        text = 'max_batch_size: 8\noutput [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 16 ] } ]'
        config = complete(text, models["add_sub"])
        assert [t.name for t in config.input] == ["INPUT0", "INPUT1"]

    def test_reshape_is_compared_instead_of_dims(self, models: dict[str, ModelSignature]) -> None:
        text = """
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4, 4 ] reshape: { shape: [ 16 ] } },
        { name: "INPUT1" data_type: TYPE_FP32 dims: [ 16 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 2, 8 ] reshape: { shape: [ 16 ] } } ]
"""
        config = complete(text, models["add_sub"])
        assert io(config.input)[0] == ("INPUT0", "TYPE_FP32", [4, 4], [16])

    def test_config_may_be_stricter_than_model(self, models: dict[str, ModelSignature]) -> None:
        # model: [3, d1]; config fixes d1 to 5.
        config = complete('input [ { name: "INPUT0" data_type: TYPE_INT32 dims: [ 3, 5 ] } ]'
                          'output [ { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 3, 5 ] } ]',
                          models["fixed_first"])
        assert config.max_batch_size == 0


class TestConfigContradictsModel:
    """Each error names config.pbtxt and the model file, so the user knows which two disagree."""

    @pytest.mark.parametrize(
        ("text", "pattern"),
        [
            (simple_config(in_type="TYPE_INT32"),
             r"config.pbtxt input 'INPUT0' has data_type TYPE_INT32 but 1/model.onnx declares FP32"),
            (simple_config(in_dims="8"),
             r"config.pbtxt input 'INPUT0' has shape \[-1,8\] with max_batch_size 8 "
             r"but 1/model.onnx declares \[-1,16\]"),
            (simple_config(in_dims="4, 4"), r"input 'INPUT0' has shape \[-1,4,4\].*1/model.onnx declares \[-1,16\]"),
            (simple_config(max_batch_size=0),
             r"input 'INPUT0' has shape \[16\] but 1/model.onnx declares \[-1,16\]"),
            (simple_config(extra_input=', { name: "INPUT9" data_type: TYPE_FP32 dims: [ 16 ] }'),
             r"config.pbtxt input 'INPUT9' is not an input of 1/model.onnx \(its inputs: INPUT0, INPUT1\)"),
            (simple_config().replace('{ name: "OUTPUT1"', '{ name: "OUTPUT7"'),
             r"config.pbtxt output 'OUTPUT7' is not an output of 1/model.onnx"),
            (simple_config().replace(',\n  { name: "INPUT1" data_type: TYPE_FP32 dims: [ 16 ] }', ""),
             r"config.pbtxt lacks 1/model.onnx input\(s\) 'INPUT1'"),
            (simple_config().replace('"OUTPUT0" data_type: TYPE_FP32', '"OUTPUT0" data_type: TYPE_FP64'),
             r"output 'OUTPUT0' has data_type TYPE_FP64 but 1/model.onnx declares FP32"),
        ],
    )
    def test_add_sub(self, models: dict[str, ModelSignature], text: str, pattern: str) -> None:
        with pytest.raises(ConfigError, match=pattern) as info:
            complete(text, models["add_sub"])
        assert "config.pbtxt" in str(info.value) and "1/model.onnx" in str(info.value)

    def test_fixed_batch_dim_with_max_batch_size(self, models: dict[str, ModelSignature]) -> None:
        # The model's first dim is fixed (3), so it cannot batch; max_batch_size 4 contradicts it.
        with pytest.raises(ConfigError) as info:
            complete("max_batch_size: 4", models["fixed_first"])
        message = str(info.value)
        assert "config.pbtxt" in message and "1/model.onnx" in message
        assert "max_batch_size 4" in message and "[3,-1]" in message

    def test_fixed_batch_dim_with_explicit_io(self, models: dict[str, ModelSignature]) -> None:
        text = ('max_batch_size: 2 input [ { name: "INPUT0" data_type: TYPE_INT32 dims: [ -1 ] } ]'
                'output [ { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ -1 ] } ]')
        with pytest.raises(ConfigError, match=r"with max_batch_size 2 but 1/model.onnx declares \[3,-1\]"):
            complete(text, models["fixed_first"])

    def test_static_errors_still_apply_after_completion(self, models: dict[str, ModelSignature]) -> None:
        with pytest.raises(ConfigError, match="declared twice"):
            complete(simple_config(extra_input=', { name: "INPUT1" data_type: TYPE_FP32 dims: [ 16 ] }'),
                     models["add_sub"])

    def test_through_the_loader(self, tmp_path: Path) -> None:
        """The real path: config.pbtxt + 1/model.onnx read by the loader; the error names both files."""
        write_model(tmp_path, "m", add_sub_model(), simple_config(in_type="TYPE_INT64"))
        source = LocalStore(tmp_path).fetch("m")
        plan = plan_model(source)
        with pytest.raises(ConfigError) as info:
            load_version(source, 1, plan, cpu_count=1, default_max_batch_size=4)
        message = str(info.value)
        assert "config.pbtxt" in message and "1/model.onnx" in message and "TYPE_INT64" in message

    def test_loader_completes_missing_config(self, tmp_path: Path) -> None:
        write_model(tmp_path, "auto", add_sub_model(), None)
        source = LocalStore(tmp_path).fetch("auto")
        served = load_version(source, 1, plan_model(source), cpu_count=1, default_max_batch_size=4)
        try:
            assert served.config.name == "auto"
            assert served.config.platform == "onnxruntime_onnx"
            assert served.config.max_batch_size == 4
            assert io(served.config.input)[0] == ("INPUT0", "TYPE_FP32", [16], None)
        finally:
            asyncio.run(served.scheduler.stop())
