"""The tuner's knobs: read from a configuration, written back into it, and each dimension's alternatives."""

from __future__ import annotations

from dataclasses import replace

from google.protobuf import json_format

from modelhost.config.model_config_pb2 import ModelConfig
from modelhost.config.pbtxt import parse_config
from modelhost.tune.knobs import DIMENSIONS, NO_BATCHER, Knobs, Space, configured, knobs_of
from modelhost.tune.report import config_text

BASE = """
name: "rank" platform: "onnxruntime_onnx" max_batch_size: 1024
input [ { name: "features" data_type: TYPE_FP32 dims: [ 1000 ] } ]
output [ { name: "score" data_type: TYPE_FP32 dims: [ 1 ] } ]
instance_group [ { count: 1 kind: KIND_CPU } ]
"""


def as_json(text: str) -> dict:
    return json_format.MessageToDict(parse_config(text), preserving_proto_field_name=True)


def test_knobs_of_the_models_own_config() -> None:
    assert knobs_of(as_json(BASE)) == Knobs(1, 0, 1024, NO_BATCHER, False, 0, 1)
    batched = BASE + """dynamic_batching { max_queue_delay_microseconds: 500 preferred_batch_size: [ 1024 ] }
    parameters { key: "intra_op_thread_count" value: { string_value: "2" } }
    parameters { key: "request_split_size" value: { string_value: "250" } }"""
    assert knobs_of(as_json(batched)) == Knobs(1, 2, 1024, 500, True, 250, 1)


def test_knobs_written_into_a_config_read_back_the_same() -> None:
    knobs = Knobs(instances=2, threads=1, max_batch_size=2000, queue_delay_us=1000, preferred=True, split_size=250,
                  client_split=4)
    written = configured(as_json(BASE), knobs)
    assert knobs_of(written) == replace(knobs, client_split=1)
    message = parse_config(config_text(written))  # what the report writes parses as a config again
    assert message.instance_group[0].count == 2 and message.dynamic_batching.max_queue_delay_microseconds == 1000
    assert message.parameters["request_split_size"].string_value == "250"
    plain = configured(written, replace(knobs, queue_delay_us=NO_BATCHER, threads=0, split_size=0))
    assert "dynamic_batching" not in plain
    assert not set(plain["parameters"]) & {"intra_op_thread_count", "request_split_size"}
    assert isinstance(json_format.ParseDict(plain, ModelConfig()), ModelConfig)


def test_every_dimension_offers_alternatives_within_the_space() -> None:
    space = Space(rows=500, cores=2, budget_ms=50)
    knobs = knobs_of(as_json(BASE))
    offered = {dimension.name: dimension.values(knobs, space) for dimension in DIMENSIONS}
    assert {(k.instances, k.threads) for k in offered["instances x threads"]} == {(1, 2), (2, 1)}
    assert [k.max_batch_size for k in offered["max batch size"]] == [500, 1000, 2000, 4000]
    assert [k.queue_delay_us for k in offered["queue delay"]] == [NO_BATCHER, 0, 200, 1000, 5000]  # <= 12.5 ms
    assert offered["preferred batch size"] == []  # no batcher to prefer sizes
    assert [k.split_size for k in offered["server request split"]] == [0, 250, 125]
    assert [k.client_split for k in offered["client split"]] == [1, 2, 4, 10]
    unbatched = replace(knobs, max_batch_size=0)
    assert all(dimension.values(unbatched, space) == [] for dimension in DIMENSIONS[1:])
