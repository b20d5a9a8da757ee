"""The JSON form of a config, as Triton serves it at /v2/models/{m}/config."""

from __future__ import annotations

import pytest

from modelhost.config.pbtxt import ConfigError, config_from_json, config_to_json, parse_config
from tests.config.config_samples import (
    FULL_CONFIG,
)

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
