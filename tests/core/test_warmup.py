"""model_warmup: samples built from config.pbtxt text and files, run on fakes and on real onnxruntime instances."""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto

from modelhost.backends.base import InstanceSettings, Model
from modelhost.backends.onnx import OnnxBackend
from modelhost.config.completion import complete_config
from modelhost.config.model_config_pb2 import ModelConfig
from modelhost.config.pbtxt import ConfigError, parse_config
from modelhost.core.warmup import WarmupError, WarmupSample, run_warmup, warmup_samples
from tests.fakes import Echo
from tests.onnx_models import ADD_SUB_CONFIG, add_sub_model, identity_model, write_model

TYPES = """
max_batch_size: 8
input [
  { name: "F" data_type: TYPE_FP32 dims: [ 2, 3 ] },
  { name: "I" data_type: TYPE_INT8 dims: [ -1 ] },
  { name: "B" data_type: TYPE_BOOL dims: [ 64 ] },
  { name: "S" data_type: TYPE_STRING dims: [ 2 ] },
  { name: "H" data_type: TYPE_FP16 dims: [ 4 ] optional: true }
]
output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 1 ] } ]
"""
SAMPLE_INPUTS = {"F": "TYPE_FP32 dims: [ 2, 3 ]", "I": "TYPE_INT8 dims: [ 1000 ]", "B": "TYPE_BOOL dims: [ 64 ]",
                 "S": "TYPE_STRING dims: [ 2 ]"}


def samples(model_dir: Path, warmup: str, config: str = TYPES) -> list[WarmupSample]:
    return warmup_samples(parse_config(config + warmup), model_dir)


def every_input(data: str, batch_size: int) -> str:
    """A sample giving each required input of TYPES the same kind of `data`."""
    inputs = " ".join(f"inputs {{ key: '{k}' value: {{ data_type: {v} {data} }} }}" for k, v in SAMPLE_INPUTS.items())
    return f'model_warmup {{ name: "s" batch_size: {batch_size} {inputs} }}'


def config_error(model_dir: Path, warmup: str, config: str = TYPES) -> str:
    with pytest.raises(ConfigError) as caught:
        samples(model_dir, warmup, config)
    return str(caught.value)


def test_zero_data_of_every_kind(tmp_path: Path) -> None:
    [sample] = samples(tmp_path, every_input("zero_data: true", batch_size=3))
    inputs = sample.inputs
    assert set(inputs) == {"F", "I", "B", "S"}  # the optional input may be left out
    assert inputs["F"].dtype == np.float32 and inputs["F"].shape == (3, 2, 3) and not inputs["F"].any()
    assert inputs["I"].dtype == np.int8 and inputs["I"].shape == (3, 1000) and not inputs["I"].any()
    assert inputs["B"].dtype == np.bool_ and inputs["B"].shape == (3, 64) and not inputs["B"].any()
    assert inputs["S"].dtype == object and inputs["S"].shape == (3, 2)
    assert inputs["S"].tolist() == [[b"", b""]] * 3
    assert not any(array.flags.writeable for array in inputs.values())  # shared by every instance's runs


def test_random_data_is_seeded_and_in_range(tmp_path: Path) -> None:
    [first] = samples(tmp_path, every_input("random_data: true", batch_size=2))
    [again] = samples(tmp_path, every_input("random_data: true", batch_size=2))
    for name in first.inputs:
        np.testing.assert_array_equal(first.inputs[name], again.inputs[name])
    values = first.inputs["F"]
    assert values.dtype == np.float32 and ((values >= 0) & (values < 1)).all() and len(np.unique(values)) == 6
    ints = first.inputs["I"]
    assert ints.dtype == np.int8 and ints.min() < -100 and ints.max() > 100  # the whole range, as random bytes
    flags = first.inputs["B"]
    assert flags.dtype == np.bool_ and flags.any() and not flags.all()
    assert first.inputs["S"].tolist() == [[b"", b""]] * 2  # BYTES falls back to zero data, as Triton
    # Every row of a batch is the same sample (Triton duplicates one request batch_size times).
    np.testing.assert_array_equal(values[0], values[1])


def test_random_data_differs_between_samples_and_inputs(tmp_path: Path) -> None:
    config = """
max_batch_size: 0
input [ { name: "A" data_type: TYPE_INT64 dims: [ 8 ] }, { name: "C" data_type: TYPE_INT64 dims: [ 8 ] } ]
"""
    data = "value: { data_type: TYPE_INT64 dims: [ 8 ] random_data: true }"
    sample = f'model_warmup {{ name: "%s" batch_size: 1 inputs {{ key: "A" {data} }} inputs {{ key: "C" {data} }} }}'
    one, two = samples(tmp_path, sample % "one" + sample % "two", config)
    assert one.inputs["A"].shape == (8,)  # max_batch_size 0: no batch dim
    assert not np.array_equal(one.inputs["A"], one.inputs["C"])
    assert not np.array_equal(one.inputs["A"], two.inputs["A"])


def write_warmup_file(model_dir: Path, name: str, data: bytes) -> None:
    (model_dir / "warmup").mkdir(exist_ok=True)
    (model_dir / "warmup" / name).write_bytes(data)


def strings(*elements: bytes) -> bytes:
    return b"".join(struct.pack("<I", len(e)) + e for e in elements)


def test_file_data_of_every_kind(tmp_path: Path) -> None:
    floats = np.arange(6, dtype="<f4")
    write_warmup_file(tmp_path, "f.bin", floats.tobytes() + b"rest is ignored")
    write_warmup_file(tmp_path, "i.bin", (np.arange(1000) % 256 - 128).astype(np.int8).tobytes())
    write_warmup_file(tmp_path, "b.bin", bytes([0, 1, 2, 0] * 16))
    write_warmup_file(tmp_path, "s.bin", strings(b"hello", b"") + b"ignored")
    inputs = """
    key: "F" value: { data_type: TYPE_FP32 dims: [ 2, 3 ] input_data_file: "f.bin" } },
  inputs { key: "I" value: { data_type: TYPE_INT8 dims: [ 1000 ] input_data_file: "i.bin" } },
  inputs { key: "B" value: { data_type: TYPE_BOOL dims: [ 64 ] input_data_file: "b.bin" } },
  inputs { key: "S" value: { data_type: TYPE_STRING dims: [ 2 ] input_data_file: "s.bin" } """
    [sample] = samples(tmp_path, f"model_warmup {{ name: 'files' batch_size: 2 inputs {{ {inputs} }} }}")
    np.testing.assert_array_equal(sample.inputs["F"], np.stack([floats.reshape(2, 3)] * 2))
    np.testing.assert_array_equal(sample.inputs["I"][1], (np.arange(1000) % 256 - 128).astype(np.int8))
    assert sample.inputs["B"][0, :4].tolist() == [False, True, True, False]
    assert set(sample.inputs["B"].view(np.uint8).flat) == {0, 1}  # any nonzero byte is true, stored as 1
    assert sample.inputs["S"].tolist() == [[b"hello", b""]] * 2


def test_reshape_applies_to_the_sample(tmp_path: Path) -> None:
    config = """
max_batch_size: 4
input [ { name: "X" data_type: TYPE_FP32 dims: [ 6 ] reshape: { shape: [ 2, 3 ] } } ]
"""
    warmup = 'model_warmup { name: "r" batch_size: 4 inputs { key: "X" value: { data_type: TYPE_FP32 dims: [ 6 ] ' \
             'zero_data: true } } }'
    [sample] = samples(tmp_path, warmup, config)
    assert sample.inputs["X"].shape == (4, 2, 3)


def test_batch_size_and_count(tmp_path: Path) -> None:
    zero = "inputs { key: 'X' value: { data_type: TYPE_FP32 dims: [ 2 ] zero_data: true } }"
    batched = "max_batch_size: 4 input [ { name: 'X' data_type: TYPE_FP32 dims: [ 2 ] } ]"
    unbatched = "max_batch_size: 0 input [ { name: 'X' data_type: TYPE_FP32 dims: [ 2 ] } ]"
    once, thrice, last = samples(tmp_path, f"""
model_warmup {{ name: "skipped" batch_size: 0 {zero} }}
model_warmup {{ name: "once" batch_size: 4 count: 0 {zero} }}
model_warmup {{ batch_size: 1 count: 3 {zero} }}
model_warmup {{ name: "last" batch_size: 2 count: 1 {zero} }}
""", batched)
    # batch_size 0 is skipped (Triton's core does so); count 0 means once; an unnamed sample goes by index.
    assert (once.title, once.count, once.inputs["X"].shape) == ("config.pbtxt model_warmup 'once'", 1, (4, 2))
    assert (thrice.title, thrice.count, thrice.inputs["X"].shape) == ("config.pbtxt model_warmup [2]", 3, (1, 2))
    assert (last.title, last.count, last.batch_size) == ("config.pbtxt model_warmup 'last'", 1, 2)
    [plain] = samples(tmp_path, f"model_warmup {{ name: 'u' batch_size: 1 {zero} }}", unbatched)
    assert plain.inputs["X"].shape == (2,)
    assert "batch_size 5 exceeds max_batch_size 4" in config_error(
        tmp_path, f"model_warmup {{ name: 'big' batch_size: 5 {zero} }}", batched)
    assert "batch_size 2, but the model does not batch (max_batch_size 0)" in config_error(
        tmp_path, f"model_warmup {{ name: 'big' batch_size: 2 {zero} }}", unbatched)


def test_run_warmup_runs_each_sample_count_times_in_order(tmp_path: Path) -> None:
    config = "max_batch_size: 4 input [ { name: 'INPUT0' data_type: TYPE_FP32 dims: [ 2 ] } ]"
    data = "inputs { key: 'INPUT0' value: { data_type: TYPE_FP32 dims: [ 2 ] zero_data: true } }"
    built = samples(tmp_path, f"""
model_warmup {{ name: "a" batch_size: 1 count: 2 {data} }}
model_warmup {{ name: "b" batch_size: 3 {data} }}
""", config)
    instance = Echo()
    run_warmup(built, instance, ["OUTPUT0"], "m:1")
    assert instance.sizes == [1, 1, 3]
    run_warmup([], instance, ["OUTPUT0"], "m:1")  # no samples: nothing runs
    assert instance.finished == 3


class FailsOnCall(Echo):
    """An Echo whose call number `failing` (1-based) raises."""

    def __init__(self, failing: int) -> None:
        super().__init__()
        self.failing = failing

    def work(self) -> None:
        if self.started == self.failing:
            raise RuntimeError("device on fire")


def test_failing_instance_names_the_model_sample_and_run(tmp_path: Path) -> None:
    config = "max_batch_size: 4 input [ { name: 'INPUT0' data_type: TYPE_FP32 dims: [ 2 ] } ]"
    data = "inputs { key: 'INPUT0' value: { data_type: TYPE_FP32 dims: [ 2 ] zero_data: true } }"
    built = samples(tmp_path, f"""
model_warmup {{ name: "a" batch_size: 1 {data} }}
model_warmup {{ name: "b" batch_size: 1 count: 3 {data} }}
model_warmup {{ name: "c" batch_size: 1 {data} }}
""", config)
    instance = FailsOnCall(failing=3)
    with pytest.raises(WarmupError) as caught:
        run_warmup(built, instance, ["OUTPUT0"], "m:1")
    assert str(caught.value) == (
        "model 'm:1' failed warmup at config.pbtxt model_warmup 'b' (run 2 of 3): device on fire")
    assert isinstance(caught.value.__cause__, RuntimeError)
    assert instance.started == 3  # stopped at the first failure, as Triton


X0 = "inputs { key: 'X' value: { data_type: TYPE_FP32 dims: [ 2 ] zero_data: true } }"


def x_input(value: str) -> str:
    return f"inputs {{ key: 'X' value: {{ {value} }} }}"


def y_input(value: str) -> str:
    return f"inputs {{ key: 'Y' value: {{ {value} }} }} {X0}"


@pytest.mark.parametrize(("warmup", "message"), [
    (f"inputs {{ key: 'nope' value: {{ data_type: TYPE_FP32 dims: [ 2 ] zero_data: true }} }} {X0}",
     "model_warmup 'w': input 'nope' is not an input of the model; its inputs are 'X', 'Y'"),
    (x_input("data_type: TYPE_INT32 dims: [ 2 ] zero_data: true"),
     "model_warmup 'w' input 'X' has TYPE_INT32, but the model's input is TYPE_FP32"),
    (x_input("dims: [ 2 ] zero_data: true"),
     "model_warmup 'w' input 'X' has no data_type, but the model's input is TYPE_FP32"),
    (x_input("data_type: TYPE_FP32 dims: [ 3 ] zero_data: true"),
     "model_warmup 'w' input 'X' has dims [3], but the model's input has dims [2]"),
    (x_input("data_type: TYPE_FP32 dims: [ 1, 2 ] zero_data: true"),
     "model_warmup 'w' input 'X' has dims [1,2], but the model's input has dims [2] (dims leave out the batch"),
    (y_input("data_type: TYPE_STRING dims: [ -1 ] zero_data: true"),
     "model_warmup 'w' input 'Y' has dims [-1]: warmup needs every dim given (no -1)"),
    (x_input("data_type: TYPE_FP32 dims: [ 2 ]"),
     "model_warmup 'w' input 'X' sets none of zero_data, random_data, input_data_file"),
    ("inputs { key: 'Y' value: { data_type: TYPE_STRING dims: [ 1 ] zero_data: true } }",
     "model_warmup 'w' gives no data for input(s) 'X'"),
    (x_input("data_type: TYPE_FP32 dims: [ 2 ] input_data_file: 'absent.bin'"),
     "model_warmup 'w' input 'X': cannot read input_data_file "),
    (x_input("data_type: TYPE_FP32 dims: [ 2 ] input_data_file: 'short.bin'"),
     "short.bin has 7 bytes; dims [2] of FP32 need 8"),
    (x_input("data_type: TYPE_FP32 dims: [ 2 ] input_data_file: '../config.pbtxt'"),
     "input_data_file '../config.pbtxt' must name a file inside "),
    (x_input("data_type: TYPE_FP32 dims: [ 2 ] input_data_file: '/etc/hostname'"),
     "input_data_file '/etc/hostname' must name a file inside "),
    (x_input("data_type: TYPE_FP32 dims: [ 2 ] input_data_file: ''"),
     "input_data_file '' must name a file inside "),
    (y_input("data_type: TYPE_STRING dims: [ 3 ] input_data_file: 'two.bin'"),
     "two.bin holds 2 BYTES element(s); dims need 3"),
    (y_input("data_type: TYPE_STRING dims: [ 2 ] input_data_file: 'cut.bin'"),
     "cut.bin: element 1 says 9 bytes, but only 3 follow"),
])
def test_config_errors_name_the_sample_and_input(tmp_path: Path, warmup: str, message: str) -> None:
    config = """
max_batch_size: 2
input [ { name: "X" data_type: TYPE_FP32 dims: [ 2 ] },
        { name: "Y" data_type: TYPE_STRING dims: [ -1 ] optional: true } ]
"""
    write_warmup_file(tmp_path, "short.bin", bytes(7))
    write_warmup_file(tmp_path, "two.bin", strings(b"a", b"b"))
    write_warmup_file(tmp_path, "cut.bin", strings(b"a") + struct.pack("<I", 9) + b"abc")
    (tmp_path / "config.pbtxt").write_text(config)
    error = config_error(tmp_path, f"model_warmup {{ name: 'w' batch_size: 1 {warmup} }}", config)
    assert message in error
    assert error.startswith("config.pbtxt model_warmup 'w'")


def onnx_instance(tmp_path: Path, model: onnx.ModelProto, config_text: str) -> tuple[ModelConfig, Path, Model]:
    """A real onnxruntime instance of `model`, its completed config (as the loader completes it) and directory."""
    model_dir = write_model(tmp_path, "m", model, config_text)
    backend = OnnxBackend()
    path = model_dir / "1" / "model.onnx"
    config = parse_config(config_text)
    instance = backend.load(path, config, InstanceSettings(0, 1))
    signature = instance.signature()
    assert signature is not None
    return complete_config(config, signature.inputs, signature.outputs, "1/model.onnx", 4), model_dir, instance


def test_real_onnx_instance_runs_the_samples(tmp_path: Path) -> None:
    warmup = """
model_warmup [
  { name: "zeros" batch_size: 8 count: 2 inputs [
      { key: "INPUT0" value: { data_type: TYPE_FP32 dims: [ 16 ] zero_data: true } },
      { key: "INPUT1" value: { data_type: TYPE_FP32 dims: [ 16 ] random_data: true } } ] },
  { name: "from file" batch_size: 1 inputs [
      { key: "INPUT0" value: { data_type: TYPE_FP32 dims: [ 16 ] input_data_file: "in.bin" } },
      { key: "INPUT1" value: { data_type: TYPE_FP32 dims: [ 16 ] input_data_file: "in.bin" } } ] }
]"""
    config, model_dir, instance = onnx_instance(tmp_path, add_sub_model(), ADD_SUB_CONFIG + warmup)
    write_warmup_file(model_dir, "in.bin", np.arange(16, dtype="<f4").tobytes())
    built = warmup_samples(config, model_dir)
    assert [s.inputs["INPUT0"].shape for s in built] == [(8, 16), (1, 16)]
    run_warmup(built, instance, [o.name for o in config.output], "m:1")
    # The samples are what the model computes on: the file's row gives a + a and a - a.
    out = instance.infer(built[1].inputs, ["OUTPUT0", "OUTPUT1"])
    np.testing.assert_array_equal(out["OUTPUT0"], 2 * np.arange(16, dtype=np.float32)[np.newaxis])
    assert not out["OUTPUT1"].any()


def test_real_onnx_string_model_takes_bytes_samples(tmp_path: Path) -> None:
    config_text = """
platform: "onnxruntime_onnx"
max_batch_size: 4
input [ { name: "INPUT0" data_type: TYPE_STRING dims: [ -1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_STRING dims: [ -1 ] } ]
model_warmup [
  { name: "empty" batch_size: 2
    inputs { key: "INPUT0" value: { data_type: TYPE_STRING dims: [ 3 ] random_data: true } } },
  { name: "words" batch_size: 1
    inputs { key: "INPUT0" value: { data_type: TYPE_STRING dims: [ 2 ] input_data_file: "w" } } }
]"""
    config, model_dir, instance = onnx_instance(tmp_path, identity_model(TensorProto.STRING), config_text)
    write_warmup_file(model_dir, "w", strings("naïve".encode(), b"x"))
    built = warmup_samples(config, model_dir)
    run_warmup(built, instance, ["OUTPUT0"], "m:1")
    out = instance.infer(built[1].inputs, ["OUTPUT0"])
    assert out["OUTPUT0"].tolist() == [["naïve".encode(), b"x"]]


def test_real_onnx_failure_fails_the_warmup(tmp_path: Path) -> None:
    # A BYTES file that is not UTF-8: onnxruntime cannot take it, and the warmup names the sample.
    config_text = """
platform: "onnxruntime_onnx"
max_batch_size: 4
input [ { name: "INPUT0" data_type: TYPE_STRING dims: [ -1 ] } ]
model_warmup { name: "latin-1" batch_size: 1
  inputs { key: "INPUT0" value: { data_type: TYPE_STRING dims: [ 1 ] input_data_file: "bad" } } }
"""
    config, model_dir, instance = onnx_instance(tmp_path, identity_model(TensorProto.STRING), config_text)
    write_warmup_file(model_dir, "bad", strings(b"caf\xe9"))
    with pytest.raises(WarmupError, match=r"model 'm:1' failed warmup at config.pbtxt model_warmup 'latin-1' "
                                          r"\(run 1 of 1\): input 'INPUT0': onnxruntime needs UTF-8"):
        run_warmup(warmup_samples(config, model_dir), instance, ["OUTPUT0"], "m:1")
