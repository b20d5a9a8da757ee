"""pb_utils.ModelConfig, what a Triton model's auto_complete_config gets: what it may add, and what it may not
change (Triton's ValueErrors). The config is the server's JSON form of a parsed config.pbtxt."""

from __future__ import annotations

import pytest

from modelhost.backends.python.triton_model_config import ModelConfig
from modelhost.config.pbtxt import config_to_json, parse_config


def config(text: str) -> ModelConfig:
    return ModelConfig(config_to_json(parse_config('name: "m"\nbackend: "python"\n' + text)))


def test_adds_tensors_and_fills_the_configs_own() -> None:
    model = config('input [ { name: "a" data_type: TYPE_FP32 dims: [ 2 ] } ]\noutput [ { name: "b" } ]')
    model.add_input({"name": "a", "data_type": "TYPE_FP32", "dims": [2]})
    model.add_input({"name": "c", "data_type": "TYPE_INT32", "dims": [-1], "optional": True})
    model.add_output({"name": "b", "data_type": "TYPE_FP32", "dims": [3]})
    document = model.as_dict()
    assert [(t["name"], t["dims"]) for t in document["input"]] == [("a", [2]), ("c", [-1])]
    assert document["output"][0]["data_type"] == "TYPE_FP32" and document["output"][0]["dims"] == [3]


@pytest.mark.parametrize(("text", "change", "message"), [
    ('input [ { name: "a" data_type: TYPE_INT32 dims: [ 2 ] } ]',
     lambda m: m.add_input({"name": "a", "data_type": "TYPE_FP32", "dims": [2]}),
     "configuration expects datatype TYPE_INT32 for input 'a', model provides TYPE_FP32"),
    ('output [ { name: "b" data_type: TYPE_FP32 dims: [ 2 ] } ]',
     lambda m: m.add_output({"name": "b", "data_type": "TYPE_FP32", "dims": [3]}),
     "the model expects dims [3] but the model configuration specifies dims [2]"),
    ("", lambda m: m.add_input({"name": "a", "data_type": "TYPE_FP32"}), "is missing 'dims' property"),
    ("", lambda m: m.add_output({"name": "a", "data_type": "TYPE_FP32", "dims": [1], "optional": True}),
     "contains property other than"),
    ("max_batch_size: 16", lambda m: m.set_max_batch_size(4),
     "configuration specified max_batch_size 16, but in auto-complete-config function for model 'm' specified "
     "max_batch_size 4"),
    ("sequence_batching { }", lambda m: m.set_dynamic_batching(), "scheduling_choice as 'sequence_batching'"),
    ("model_transaction_policy { decoupled: true }", lambda m: m.set_model_transaction_policy({"decoupled": False}),
     "trying to change decoupled property"),
    ("", lambda m: m.set_model_transaction_policy({"ordered": True}), "contains property other than 'decoupled'"),
])
def test_refuses_what_contradicts_the_config(text: str, change, message: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ValueError) as raised:
        change(config(text))
    assert message in str(raised.value)


def test_batching_and_decoupled() -> None:
    model = config("max_batch_size: 4")
    model.set_max_batch_size(8)
    model.set_dynamic_batching()
    model.set_model_transaction_policy({"decoupled": True})
    document = model.as_dict()
    assert document["max_batch_size"] == 8 and document["dynamic_batching"] == {}
    assert document["model_transaction_policy"] == {"decoupled": True}
