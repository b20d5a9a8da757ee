"""config.pbtxt read and checked: parsing, static checks and the defaults filled in before completion."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from modelhost.config.completion import apply_defaults, check_config
from modelhost.config.model_config_pb2 import DataType, ModelInput, ModelInstanceGroup, ModelQueuePolicy
from modelhost.config.pbtxt import ConfigError, parse_config, read_config
from tests.config.config_samples import (
    DENSENET_CONFIG,
    FULL_CONFIG,
    simple_config,
)

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

    def test_gpu_instances_are_left_for_placement(self) -> None:
        config = parse_config("instance_group [ { kind: KIND_GPU } ]")
        apply_defaults(config, "m", "onnxruntime_onnx", "onnxruntime")  # core/devices.py decides (test_devices.py)
        assert [(g.count, g.kind) for g in config.instance_group] == [(1, ModelInstanceGroup.KIND_GPU)]
