"""config.pbtxt: parsing Triton's text format, static checks, completion from the ONNX model, JSON form."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import pytest
from onnx import TensorProto

from modelhost.backends.base import ModelSignature
from modelhost.backends.onnx import OnnxBackend
from modelhost.config.completion import apply_defaults, check_config, complete_config
from modelhost.config.model_config_pb2 import (
    DataType,
    ModelConfig,
    ModelInput,
    ModelInstanceGroup,
    ModelQueuePolicy,
)
from modelhost.config.pbtxt import ConfigError, config_from_json, config_to_json, parse_config, read_config
from modelhost.core.model_loading import load_version, plan_model
from modelhost.store.local import LocalStore
from tests.onnx_models import add_sub_model, identity_model, write_model

# A config written the way people write them for Triton: comments, `key : value` spacing,
# list and block forms, enums, maps, every scheduling/instance knob modelhost parses.
FULL_CONFIG = """
# The "simple" model from Triton's quickstart, with every common section.
name: "simple"
platform: "onnxruntime_onnx"   # or backend: "onnxruntime"
max_batch_size : 8
version_policy: { specific: { versions: [ 1, 3 ] } }
input [
  {
    name: "INPUT0"
    data_type: TYPE_FP32
    format: FORMAT_NONE
    dims: [ 16 ]
  },
  {
    name: "INPUT1"
    data_type: TYPE_FP32
    dims: [ 16 ]
    optional: true
  }
]
output [
  {
    name: "OUTPUT0"
    data_type: TYPE_FP32
    dims: [ 4, 4 ]
    reshape: { shape: [ 16 ] }
    label_filename: "labels.txt"
  }
]
output {
  name: "OUTPUT1"
  data_type: TYPE_STRING
  dims: [ -1 ]
}
instance_group [
  { name: "cpu_pool" count: 2 kind: KIND_CPU },
  { count: 1 kind: KIND_AUTO }
]
dynamic_batching {
  preferred_batch_size: [ 4, 8 ]
  max_queue_delay_microseconds: 100
  preserve_ordering: true
  priority_levels: 2
  default_priority_level: 1
  default_queue_policy {
    timeout_action: DELAY
    default_timeout_microseconds: 5000
    allow_timeout_override: true
    max_queue_size: 16
  }
  priority_queue_policy { key: 1 value: { max_queue_size: 4 } }
}
optimization { graph { level: 1 } }
parameters { key: "intra_op_thread_count" value: { string_value: "2" } }
parameters [
  { key: "graph_optimization_level" value: { string_value: "basic" } }
]
model_warmup [
  {
    name: "zeros"
    batch_size: 1
    inputs { key: "INPUT0" value: { data_type: TYPE_FP32 dims: [ 16 ] zero_data: true } }
  }
]
"""

# Triton's densenet_onnx example config, verbatim in substance.
DENSENET_CONFIG = """
name: "densenet_onnx"
platform: "onnxruntime_onnx"
max_batch_size : 0
input [
  {
    name: "data_0"
    data_type: TYPE_FP32
    format: FORMAT_NCHW
    dims: [ 3, 224, 224 ]
    reshape { shape: [ 1, 3, 224, 224 ] }
  }
]
output [
  {
    name: "fc6_1"
    data_type: TYPE_FP32
    dims: [ 1000 ]
    reshape { shape: [ 1, 1000, 1, 1 ] }
    label_filename: "densenet_labels.txt"
  }
]
"""


def simple_config(
    max_batch_size: int = 8, in_type: str = "TYPE_FP32", in_dims: str = "16", extra_input: str = ""
) -> str:
    return f"""
max_batch_size: {max_batch_size}
input [
  {{ name: "INPUT0" data_type: {in_type} dims: [ {in_dims} ] }},
  {{ name: "INPUT1" data_type: TYPE_FP32 dims: [ 16 ] }}
  {extra_input}
]
output [
  {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 16 ] }},
  {{ name: "OUTPUT1" data_type: TYPE_FP32 dims: [ 16 ] }}
]
"""


# --------------------------------------------------------------------------- parsing


class TestParse:
    def test_full_triton_config(self) -> None:
        config = parse_config(FULL_CONFIG)
        assert config.name == "simple"
        assert config.platform == "onnxruntime_onnx"
        assert config.max_batch_size == 8
        assert config.version_policy.WhichOneof("policy_choice") == "specific"
        assert list(config.version_policy.specific.versions) == [1, 3]

        assert [t.name for t in config.input] == ["INPUT0", "INPUT1"]
        assert config.input[0].data_type == DataType.TYPE_FP32
        assert config.input[0].format == ModelInput.FORMAT_NONE
        assert list(config.input[0].dims) == [16]
        assert config.input[1].optional is True
        assert not config.input[0].HasField("reshape")

        # `output [ ... ]` and a later `output { ... }` block both append to the repeated field.
        assert [t.name for t in config.output] == ["OUTPUT0", "OUTPUT1"]
        assert list(config.output[0].dims) == [4, 4]
        assert config.output[0].HasField("reshape")
        assert list(config.output[0].reshape.shape) == [16]
        assert config.output[0].label_filename == "labels.txt"
        assert config.output[1].data_type == DataType.TYPE_STRING
        assert list(config.output[1].dims) == [-1]

        groups = config.instance_group
        assert [(g.name, g.count, g.kind) for g in groups] == [
            ("cpu_pool", 2, ModelInstanceGroup.KIND_CPU),
            ("", 1, ModelInstanceGroup.KIND_AUTO),
        ]

        assert config.WhichOneof("scheduling_choice") == "dynamic_batching"
        batching = config.dynamic_batching
        assert list(batching.preferred_batch_size) == [4, 8]
        assert batching.max_queue_delay_microseconds == 100
        assert batching.preserve_ordering is True
        assert batching.priority_levels == 2
        assert batching.default_priority_level == 1
        policy = batching.default_queue_policy
        assert policy.timeout_action == ModelQueuePolicy.DELAY
        assert policy.default_timeout_microseconds == 5000
        assert policy.allow_timeout_override is True
        assert policy.max_queue_size == 16
        assert batching.priority_queue_policy[1].max_queue_size == 4

        assert config.optimization.graph.level == 1
        assert {k: v.string_value for k, v in config.parameters.items()} == {
            "intra_op_thread_count": "2",
            "graph_optimization_level": "basic",
        }
        warmup = config.model_warmup[0]
        assert warmup.name == "zeros" and warmup.batch_size == 1
        assert warmup.inputs["INPUT0"].zero_data is True
        assert list(warmup.inputs["INPUT0"].dims) == [16]

    def test_densenet_example(self) -> None:
        config = parse_config(DENSENET_CONFIG)
        assert config.max_batch_size == 0
        assert config.input[0].format == ModelInput.FORMAT_NCHW
        assert list(config.input[0].reshape.shape) == [1, 3, 224, 224]
        assert list(config.output[0].reshape.shape) == [1, 1000, 1, 1]
        check_config(config)

    @pytest.mark.parametrize(
        ("text", "choice", "check"),
        [
            ("version_policy: { latest: { num_versions: 2 } }", "latest", lambda p: p.latest.num_versions == 2),
            ("version_policy { latest { } }", "latest", lambda p: p.latest.num_versions == 0),
            ("version_policy: { all: { } }", "all", lambda p: True),
            ("version_policy { all {} }", "all", lambda p: True),
            ("version_policy { specific { versions: 2 versions: 5 } }", "specific",
             lambda p: list(p.specific.versions) == [2, 5]),
            ("version_policy: { specific: { versions: [ 4 ] } }", "specific",
             lambda p: list(p.specific.versions) == [4]),
        ],
    )
    def test_version_policy_variants(self, text: str, choice: str, check) -> None:  # type: ignore[no-untyped-def]
        policy = parse_config(text).version_policy
        assert policy.WhichOneof("policy_choice") == choice
        assert check(policy)

    def test_no_version_policy_means_unset(self) -> None:
        assert parse_config('name: "x"').version_policy.WhichOneof("policy_choice") is None

    def test_empty_dynamic_batching_block_selects_it(self) -> None:
        config = parse_config("max_batch_size: 4\ndynamic_batching { }")
        assert config.WhichOneof("scheduling_choice") == "dynamic_batching"

    def test_backend_instead_of_platform(self) -> None:
        config = parse_config('backend: "onnxruntime"\nmax_batch_size: 2')
        assert config.backend == "onnxruntime" and config.platform == ""

    def test_syntax_error_names_the_line(self) -> None:
        text = 'name: "m"\nmax_batch_size: 8\ninput [\n  {\n    name: "x" data_type: TYPE_FP32 dims: [ 16 \n  }\n]\n'
        with pytest.raises(ConfigError) as info:
            parse_config(text)
        message = str(info.value)
        assert message.startswith("config.pbtxt")
        assert re.search(r"\b6:\d+", message), message  # the `}` on line 6 is where `]` was expected

    def test_unknown_enum_names_line_and_value(self) -> None:
        text = 'name: "m"\n\n\ninput [ { name: "x" data_type: TYPE_FP33 dims: [ 1 ] } ]\n'
        with pytest.raises(ConfigError, match=r"4:\d+") as info:
            parse_config(text)
        assert "TYPE_FP33" in str(info.value)

    def test_unknown_field_names_line_and_field(self) -> None:
        with pytest.raises(ConfigError, match=r"2:\d+") as info:
            parse_config('name: "m"\nmax_batch: 8\n')
        assert "max_batch" in str(info.value)

    def test_wrong_value_type(self) -> None:
        with pytest.raises(ConfigError, match=r"1:\d+"):
            parse_config('max_batch_size: "eight"')

    def test_read_config_names_the_file(self, tmp_path: Path) -> None:
        (tmp_path / "config.pbtxt").write_text('name: "m"\nmax_batch_size: 8\noops\n')
        with pytest.raises(ConfigError) as info:
            read_config(tmp_path)
        assert str(tmp_path / "config.pbtxt") in str(info.value)
        assert re.search(r"\b3:\d+", str(info.value))

    def test_read_config_missing_file_is_none(self, tmp_path: Path) -> None:
        assert read_config(tmp_path) is None

    def test_read_config_not_utf8(self, tmp_path: Path) -> None:
        (tmp_path / "config.pbtxt").write_bytes(b'name: "\xff\xfe"\n')
        with pytest.raises(ConfigError, match="cannot read"):
            read_config(tmp_path)

    def test_read_config_parses_file(self, tmp_path: Path) -> None:
        (tmp_path / "config.pbtxt").write_text(FULL_CONFIG)
        config = read_config(tmp_path)
        assert config is not None and config.name == "simple" and len(config.input) == 2


# --------------------------------------------------------------------------- static checks


class TestCheckConfig:
    def test_valid_configs_pass(self) -> None:
        check_config(parse_config(FULL_CONFIG))
        check_config(parse_config(simple_config()))
        check_config(parse_config('input [ { name: "s" data_type: TYPE_FP32 dims: [ 1 ] reshape: { shape: [ ] } } ]'))

    @pytest.mark.parametrize(
        ("text", "pattern"),
        [
            (simple_config(extra_input=', { name: "INPUT0" data_type: TYPE_FP32 dims: [ 16 ] }'),
             r"input 'INPUT0' is declared twice"),
            ('output [ { name: "y" data_type: TYPE_FP32 dims: [ 1 ] },'
             '         { name: "y" data_type: TYPE_FP32 dims: [ 2 ] } ]',
             r"output 'y' is declared twice"),
            ('input [ { name: "x" dims: [ 4 ] } ]', r"input 'x' has no data_type"),
            ('output [ { name: "y" dims: [ 4 ] } ]', r"output 'y' has no data_type"),
            ('input [ { name: "x" data_type: TYPE_FP32 } ]', r"input 'x' has no dims"),
            ('input [ { name: "x" data_type: TYPE_FP32 dims: [ ] } ]', r"input 'x' has no dims"),
            ('input [ { name: "x" data_type: TYPE_FP32 dims: [ 0 ] } ]', r"input 'x' has dims \[0\]"),
            ('input [ { name: "x" data_type: TYPE_FP32 dims: [ 4, -2 ] } ]', r"input 'x' has dims \[4,-2\]"),
            ('output [ { name: "y" data_type: TYPE_INT64 dims: [ -1, 0 ] } ]', r"output 'y' has dims \[-1,0\]"),
            ('input [ { name: "x" data_type: TYPE_FP32 dims: [ 2, 3 ] reshape: { shape: [ 5 ] } } ]',
             r"input 'x' reshape \[5\] has a different element count than dims \[2,3\]"),
            ('input [ { name: "x" data_type: TYPE_FP32 dims: [ 2 ] reshape: { shape: [ ] } } ]',
             r"input 'x' reshape \[\] has a different element count than dims \[2\]"),
            ('input [ { data_type: TYPE_FP32 dims: [ 1 ] } ]', r"an input has no name"),
            ("max_batch_size: -1", r"max_batch_size must be >= 0"),
            ('input [ { name: "x" data_type: TYPE_BF16 dims: [ 1 ] } ]', r"TYPE_BF16 is not supported"),
            ("instance_group [ { count: -1 } ]", r"instance_group count must be >= 0"),
        ],
    )
    def test_errors(self, text: str, pattern: str) -> None:
        config = parse_config(text)
        with pytest.raises(ConfigError, match=pattern) as info:
            check_config(config)
        assert "config.pbtxt" in str(info.value)

    def test_same_name_for_an_input_and_an_output_is_allowed(self) -> None:
        check_config(parse_config(
            'input [ { name: "t" data_type: TYPE_FP32 dims: [ 1 ] } ] '
            'output [ { name: "t" data_type: TYPE_FP32 dims: [ 1 ] } ]'
        ))

    @pytest.mark.parametrize("reshape", ["[ 0 ]", "[ -2 ]", "[ 4, -3 ]"])
    def test_reshape_dims_must_be_positive_or_minus_one(self, reshape: str) -> None:
        # Triton (ValidateIOShape): "reshape dimensions must be integer >= 1, or -1".
        config = parse_config(
            f'max_batch_size: 4 input [ {{ name: "x" data_type: TYPE_FP32 dims: [ -1 ] '
            f"reshape: {{ shape: {reshape} }} }} ]"
        )
        with pytest.raises(ConfigError, match="reshape"):
            check_config(config)


class TestApplyDefaults:
    def test_fills_name_platform_policy_instances(self) -> None:
        config = parse_config("max_batch_size: 2")
        apply_defaults(config, "m", "onnxruntime_onnx", "onnxruntime")
        assert config.name == "m"
        assert config.platform == "onnxruntime_onnx" and config.backend == "onnxruntime"
        assert config.version_policy.latest.num_versions == 1
        assert [(g.count, g.kind) for g in config.instance_group] == [(1, ModelInstanceGroup.KIND_CPU)]

    def test_auto_kind_and_zero_count(self) -> None:
        config = parse_config("instance_group [ { kind: KIND_AUTO } ]")
        apply_defaults(config, "m", "onnxruntime_onnx", "onnxruntime")
        assert [(g.count, g.kind) for g in config.instance_group] == [(1, ModelInstanceGroup.KIND_CPU)]

    def test_keeps_explicit_policy(self) -> None:
        config = parse_config("version_policy { all { } }")
        apply_defaults(config, "m", "onnxruntime_onnx", "onnxruntime")
        assert config.version_policy.WhichOneof("policy_choice") == "all"

    def test_name_must_match_directory(self) -> None:
        with pytest.raises(ConfigError, match="'other' does not match the model directory 'm'"):
            apply_defaults(parse_config('name: "other"'), "m", "onnxruntime_onnx", "onnxruntime")

    def test_gpu_instances_rejected(self) -> None:
        with pytest.raises(ConfigError, match="KIND_GPU"):
            config = parse_config("instance_group [ { kind: KIND_GPU } ]")
            apply_defaults(config, "m", "onnxruntime_onnx", "onnxruntime")


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


# --------------------------------------------------------------------------- JSON form (/config)


class TestConfigJson:
    def test_triton_field_names_and_enum_names(self) -> None:
        document = config_to_json(parse_config(FULL_CONFIG))
        for key in ("name", "platform", "backend", "max_batch_size", "input", "output", "instance_group",
                    "version_policy", "dynamic_batching", "parameters", "optimization", "model_warmup",
                    "default_model_filename"):
            assert key in document, key
        assert document["max_batch_size"] == 8
        first = document["input"][0]
        assert first["name"] == "INPUT0"
        assert first["data_type"] == "TYPE_FP32"
        assert first["format"] == "FORMAT_NONE"
        assert document["input"][1]["optional"] is True
        assert document["output"][1]["data_type"] == "TYPE_STRING"
        assert document["output"][0]["label_filename"] == "labels.txt"
        assert document["instance_group"][0] == {
            "name": "cpu_pool", "count": 2, "kind": "KIND_CPU", "gpus": [], "profile": [], "passive": False,
            "secondary_devices": [], "host_policy": "",
        }
        assert document["dynamic_batching"]["default_queue_policy"]["timeout_action"] == "DELAY"
        assert document["dynamic_batching"]["default_queue_policy"]["max_queue_size"] == 16
        assert document["parameters"] == {
            "intra_op_thread_count": {"string_value": "2"},
            "graph_optimization_level": {"string_value": "basic"},
        }
        # no camelCase anywhere
        assert "maxBatchSize" not in document and "dataType" not in first

    def test_default_fields_are_present(self) -> None:
        document = config_to_json(parse_config('name: "m"'))
        assert document["max_batch_size"] == 0
        assert document["input"] == [] and document["output"] == []
        assert document["platform"] == ""

    def test_int64_fields_are_json_numbers(self) -> None:
        # Triton's ModelConfigToJson turns protobuf's int64-as-string back into numbers
        # ("dims": [16], not ["16"]); clients index and compare them as integers.
        document = config_to_json(parse_config(FULL_CONFIG))
        assert document["input"][0]["dims"] == [16]
        assert document["output"][0]["dims"] == [4, 4]
        assert document["output"][0]["reshape"]["shape"] == [16]
        assert document["output"][1]["dims"] == [-1]
        assert document["version_policy"]["specific"]["versions"] == [1, 3]
        batching = document["dynamic_batching"]
        assert batching["max_queue_delay_microseconds"] == 100
        assert batching["priority_levels"] == 2
        assert batching["default_priority_level"] == 1
        assert batching["default_queue_policy"]["default_timeout_microseconds"] == 5000

    def test_round_trip_through_json(self) -> None:
        config = parse_config(FULL_CONFIG)
        assert config_from_json(config_to_json(config)) == config

    def test_config_from_json_accepts_triton_load_override(self) -> None:
        # What tritonclient's load_model(config=json.dumps(...)) sends: numbers for dims.
        config = config_from_json(
            '{"name": "m", "max_batch_size": 4, "input": [{"name": "x", "data_type": "TYPE_FP32", "dims": [16]}]}'
        )
        assert config.max_batch_size == 4 and list(config.input[0].dims) == [16]

    def test_config_from_json_error(self) -> None:
        with pytest.raises(ConfigError, match="override"):
            config_from_json('{"max_batch_size": "many"}', origin="override")
