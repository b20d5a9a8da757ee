"""TorchBackend on TorchScript (and torch.export) models the tests build, checked against torch run directly."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from modelhost.backends.base import InstanceSettings
from modelhost.backends.torch import TorchBackend, TorchModel
from modelhost.config.completion import complete_config
from modelhost.config.pbtxt import ConfigError, parse_config
from modelhost.errors import ErrorKind, ModelhostError
from modelhost.types import TensorSpec

BACKEND = TorchBackend()
# torch 2.13 deprecates torch.jit in favour of torch.export; TorchScript is what Triton's backend serves.
pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit:DeprecationWarning")


class Affine(torch.nn.Module):
    """features [batch, 4] @ W + shift [batch, 2] -> [batch, 2]."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.linear = torch.nn.Linear(4, 2)

    def forward(self, features: torch.Tensor, shift: torch.Tensor) -> torch.Tensor:
        return self.linear(features) + shift


class AddSub(torch.nn.Module):
    def forward(self, a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return a + b, a - b


class Scores(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"doubled": x * 2, "total": x.sum(dim=1, keepdim=True)}


class DictInput(torch.nn.Module):
    def forward(self, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        return inputs["left"] * inputs["right"]


class OptionalBias(torch.nn.Module):
    def forward(self, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        if bias is None:
            return x + 100
        return x + bias


class Shout(torch.nn.Module):
    def forward(self, words: list[str], count: torch.Tensor) -> tuple[list[str], torch.Tensor]:
        return [word.upper() + "!" for word in words], count + len(words)


class Words(torch.nn.Module):
    def forward(self, words: list[str]) -> list[str]:
        return words[::-1]


class Clone(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.clone()


class Identity(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x


def io(inputs: str, outputs: str, max_batch_size: int = 0, extra: str = "") -> str:
    """config.pbtxt text from ";"-separated "name TYPE dims [optional]" entries: io("x FP32 2,3", "y INT64 1")."""
    def tensors(kind: str, entries: str) -> str:
        specs = []
        for entry in entries.split(";"):
            name, datatype, dims, *flags = entry.split()
            optional = " optional: true" if flags == ["optional"] else ""
            specs.append(f'{{ name: "{name}" data_type: TYPE_{datatype} dims: [ {dims} ]{optional} }}')
        return f"{kind} [ {', '.join(specs)} ]"

    return f"max_batch_size: {max_batch_size}\n{tensors('input', inputs)}\n{tensors('output', outputs)}\n{extra}"


AFFINE_CONFIG = io("features FP32 4; shift FP32 2", "OUTPUT__0 FP32 2", max_batch_size=8)


def script(tmp_path: Path, module: torch.nn.Module, filename: str = "model.pt") -> Path:
    path = tmp_path / filename
    torch.jit.script(module).save(str(path))
    return path


def load(path: Path, config_text: str, threads: int = 1) -> TorchModel:
    config = parse_config(config_text)
    config.name = "m"
    model = BACKEND.load(path, config, InstanceSettings(0, threads))
    assert isinstance(model, TorchModel)
    return model


def direct(path: Path, *args: Any) -> Any:
    """Run the saved module with torch itself."""
    module = torch.jit.load(str(path))
    with torch.no_grad():
        return module(*(torch.from_numpy(np.array(a)) for a in args))


def frozen(array: np.ndarray) -> np.ndarray:
    """A read-only view like the data plane's np.frombuffer over a request body."""
    return np.frombuffer(array.tobytes(), dtype=array.dtype).reshape(array.shape)


# --------------------------------------------------------------------------- running batches


@pytest.mark.parametrize("batch", [1, 3, 8])
def test_traced_model_matches_torch_run_directly(tmp_path: Path, batch: int) -> None:
    path = tmp_path / "model.pt"
    torch.jit.trace(Affine(), (torch.zeros(2, 4), torch.zeros(2, 2))).save(str(path))
    model = load(path, AFFINE_CONFIG)
    rng = np.random.default_rng(batch)
    features = frozen(rng.random((batch, 4), dtype=np.float32))
    shift = frozen(rng.random((batch, 2), dtype=np.float32))
    out = model.infer({"features": features, "shift": shift}, ["OUTPUT__0"])
    assert out["OUTPUT__0"].dtype == np.float32 and out["OUTPUT__0"].shape == (batch, 2)
    np.testing.assert_allclose(out["OUTPUT__0"], direct(path, features, shift).numpy(), rtol=1e-6)


def test_inputs_bound_by_forward_argument_names_in_any_config_order(tmp_path: Path) -> None:
    path = script(tmp_path, Affine())
    swapped = io("shift FP32 2; features FP32 4", "OUTPUT__0 FP32 2", max_batch_size=8)
    model = load(path, swapped)  # lists shift first; forward(features, shift) still gets each by name
    features, shift = np.ones((2, 4), np.float32), np.full((2, 2), 10, np.float32)
    out = model.infer({"shift": shift, "features": features}, ["OUTPUT__0"])
    np.testing.assert_allclose(out["OUTPUT__0"], direct(path, features, shift).numpy(), rtol=1e-6)


def test_named_index_inputs_and_tuple_outputs(tmp_path: Path) -> None:
    path = script(tmp_path, AddSub())
    # Listed out of order on purpose: INPUT__1 is forward's b and OUTPUT__1 is a - b, whatever the order.
    model = load(path, io("INPUT__1 FP32 3; INPUT__0 FP32 3", "OUTPUT__1 FP32 3; OUTPUT__0 FP32 3", max_batch_size=4))
    a, b = np.arange(6, dtype=np.float32).reshape(2, 3), np.full((2, 3), 0.5, np.float32)
    out = model.infer({"INPUT__0": a, "INPUT__1": b}, ["OUTPUT__0", "OUTPUT__1"])
    expected_sum, expected_difference = direct(path, a, b)
    np.testing.assert_array_equal(out["OUTPUT__0"], expected_sum.numpy())
    np.testing.assert_array_equal(out["OUTPUT__1"], expected_difference.numpy())
    np.testing.assert_array_equal(out["OUTPUT__1"], a - b)


def test_other_names_bind_in_config_order(tmp_path: Path) -> None:
    path = script(tmp_path, AddSub())
    model = load(path, io("first INT64 2; second INT64 2", "plus INT64 2; minus INT64 2"))
    out = model.infer({"first": np.array([5, 7]), "second": np.array([1, 2])}, ["minus"])
    assert list(out) == ["minus"]
    np.testing.assert_array_equal(out["minus"], [4, 5])


def test_dict_output_maps_by_name(tmp_path: Path) -> None:
    path = script(tmp_path, Scores())
    model = load(path, io("x FP64 3", "total FP64 1; doubled FP64 3", max_batch_size=8))
    x = np.random.default_rng(1).random((5, 3))
    out = model.infer({"x": x}, ["total", "doubled"])
    expected = direct(path, x)
    np.testing.assert_array_equal(out["total"], expected["total"].numpy())
    np.testing.assert_array_equal(out["doubled"], expected["doubled"].numpy())


def test_dict_input_gets_every_input_by_config_name(tmp_path: Path) -> None:
    path = script(tmp_path, DictInput())
    model = load(path, io("left INT32 2; right INT32 2", "product INT32 2"))
    out = model.infer({"left": np.array([2, 3], np.int32), "right": np.array([4, 5], np.int32)}, ["product"])
    np.testing.assert_array_equal(out["product"], [8, 15])


def test_absent_optional_input_takes_forward_default(tmp_path: Path) -> None:
    path = script(tmp_path, OptionalBias())
    model = load(path, io("x FP32 2; bias FP32 2 optional", "y FP32 2"))
    x = np.array([1, 2], np.float32)
    np.testing.assert_array_equal(model.infer({"x": x}, ["y"])["y"], [101, 102])
    np.testing.assert_array_equal(model.infer({"x": x, "bias": np.ones(2, np.float32)}, ["y"])["y"], [2, 3])


@pytest.mark.parametrize(
    ("config_type", "dtype"),
    [("BOOL", np.bool_), ("UINT8", np.uint8), ("UINT16", np.uint16), ("UINT32", np.uint32), ("UINT64", np.uint64),
     ("INT8", np.int8), ("INT16", np.int16), ("INT32", np.int32), ("INT64", np.int64), ("FP16", np.float16),
     ("FP32", np.float32), ("FP64", np.float64)],
)
def test_datatypes_round_trip(tmp_path: Path, config_type: str, dtype: type) -> None:
    path = script(tmp_path, Clone())
    model = load(path, io(f"x {config_type} 3", f"y {config_type} 3", max_batch_size=4))
    x = frozen((np.arange(6).reshape(2, 3) % 2).astype(dtype))
    y = model.infer({"x": x}, ["y"])["y"]
    assert y.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(y, direct(path, x).numpy())


def test_inputs_and_outputs_are_not_copied(tmp_path: Path) -> None:
    model = load(script(tmp_path, Identity()), io("x FP32 4", "y FP32 4"))
    for x in (np.arange(4, dtype=np.float32), frozen(np.arange(4, dtype=np.float32))):
        y = model.infer({"x": x}, ["y"])["y"]
        assert np.shares_memory(x, y)


def test_torch_export_program(tmp_path: Path) -> None:
    batch = torch.export.Dim("batch", max=64)
    program = torch.export.export(Affine(), (torch.zeros(2, 4), torch.zeros(2, 2)),
                                  dynamic_shapes={"features": {0: batch}, "shift": {0: batch}})
    path = tmp_path / "model.pt2"
    torch.export.save(program, str(path))
    model = load(path, AFFINE_CONFIG)
    features, shift = np.random.default_rng(2).random((5, 4), dtype=np.float32), np.ones((5, 2), np.float32)
    out = model.infer({"features": features, "shift": shift}, ["OUTPUT__0"])
    with torch.no_grad():
        expected = Affine()(torch.from_numpy(features), torch.from_numpy(shift)).numpy()
    np.testing.assert_allclose(out["OUTPUT__0"], expected, rtol=1e-6)
    with pytest.raises(ModelhostError) as raised:
        model.infer({"features": np.ones((2, 5), np.float32), "shift": shift[:2]}, ["OUTPUT__0"])
    assert raised.value.kind is ErrorKind.INVALID_INPUT


# --------------------------------------------------------------------------- signature and threads


def test_signature_is_the_config_and_completion_agrees(tmp_path: Path) -> None:
    text = """
        max_batch_size: 4
        input [ { name: "x" data_type: TYPE_FP32 dims: [ 6 ] reshape: { shape: [ 2, 3 ] } } ]
        output [ { name: "y" data_type: TYPE_FP32 dims: [ 2, 3 ] } ]"""
    model = load(script(tmp_path, Clone()), text)
    signature = model.signature()
    assert signature is not None
    assert signature.inputs == (TensorSpec("x", "FP32", (-1, 2, 3)),)
    assert signature.outputs == (TensorSpec("y", "FP32", (-1, 2, 3)),)
    config = parse_config(text)
    assert complete_config(config, signature.inputs, signature.outputs, "1/model.pt", 8) == config


def test_describe_asks_for_the_config(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"model\.pt does not declare its inputs and outputs: config\.pbtxt must"):
        BACKEND.describe(script(tmp_path, Clone()))


@pytest.mark.skipif("OpenMP" not in torch.__config__.parallel_info(), reason="per-thread counts need OpenMP")
def test_each_instance_runs_with_its_thread_count(tmp_path: Path) -> None:
    path = script(tmp_path, Clone())
    one = load(path, io("x FP32 1", "y FP32 1"), threads=1)
    parameter = 'parameters: { key: "INTRA_OP_THREAD_COUNT" value: { string_value: "2" } }'
    two = load(path, io("x FP32 1", "y FP32 1", extra=parameter), threads=1)
    seen: dict[str, int] = {}

    def run(label: str, model: TorchModel) -> None:
        model.infer({"x": np.ones(1, np.float32)}, ["y"])
        seen[label] = torch.get_num_threads()

    for label, model in (("one", one), ("two", two)):
        thread = threading.Thread(target=run, args=(label, model))
        thread.start()
        thread.join()
    assert seen == {"one": 1, "two": 2}


# --------------------------------------------------------------------------- errors


def test_config_must_list_inputs_and_outputs(tmp_path: Path) -> None:
    path = script(tmp_path, Clone())
    with pytest.raises(ConfigError, match=r"config\.pbtxt must list every input and output of model\.pt"):
        load(path, 'input [ { name: "x" data_type: TYPE_FP32 dims: [ 1 ] } ]')
    with pytest.raises(ConfigError, match=r"must list every input and output of model\.pt"):
        load(path, "max_batch_size: 4")


def test_string_tensors_are_lists_of_str(tmp_path: Path) -> None:
    # As Triton's pytorch backend: a TYPE_STRING tensor of one dimension is a List[str] in and out.
    model = load(script(tmp_path, Shout()), io("INPUT__0 STRING -1; INPUT__1 INT64 1", "OUTPUT__0 STRING -1; "
                                                                                    "OUTPUT__1 INT64 1"))
    words = np.array([b"caf\xc3\xa9", b"", b"ok"], dtype=np.object_)
    result = model.infer({"INPUT__0": words, "INPUT__1": np.array([1])}, ["OUTPUT__0", "OUTPUT__1"])
    assert result["OUTPUT__0"].dtype == np.object_
    assert result["OUTPUT__0"].tolist() == [b"CAF\xc3\xa9!", b"!", b"OK!"]  # TorchScript's upper() is ASCII-only
    assert result["OUTPUT__1"].tolist() == [4]
    with pytest.raises(ModelhostError, match="input 'INPUT__0' holds an element that is not UTF-8") as caught:
        model.infer({"INPUT__0": np.array([b"\xff"], np.object_), "INPUT__1": np.array([1])}, ["OUTPUT__0"])
    assert caught.value.kind is ErrorKind.INVALID_INPUT


def test_a_list_of_str_result_is_the_one_string_output(tmp_path: Path) -> None:
    model = load(script(tmp_path, Words()), io("INPUT__0 STRING -1", "OUTPUT__0 STRING -1"))
    words = np.array([b"a", b"b"], dtype=np.object_)
    assert model.infer({"INPUT__0": words}, ["OUTPUT__0"])["OUTPUT__0"].tolist() == [b"b", b"a"]


def test_string_tensors_of_more_than_one_dimension_are_refused_at_load(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"input 'x' is TYPE_STRING of shape \[-1,1\]: a PyTorch model takes "
                                          r"strings as a List\[str\], of one dimension, batch included"):
        load(script(tmp_path, Clone()), io("x STRING 1", "y FP32 1", max_batch_size=4))


@pytest.mark.parametrize("content", ["garbage", "state_dict"])
def test_file_that_is_not_torchscript(tmp_path: Path, content: str) -> None:
    path = tmp_path / "model.pt"
    if content == "garbage":
        path.write_bytes(np.random.default_rng(3).bytes(2048))
    else:
        torch.save(Affine().state_dict(), str(path))
    with pytest.raises(ConfigError, match=r"cannot load .*model\.pt as TorchScript \(torch\.jit\.save\): Pytorch"):
        load(path, AFFINE_CONFIG)


def test_forward_argument_without_input_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"no input for argument\(s\) shift of forward\(features, shift\) of model"):
        load(script(tmp_path, Affine()), io("features FP32 4", "y FP32 2"))


def test_a_sequence_control_must_be_named_with_its_index(tmp_path: Path) -> None:
    control = ('sequence_batching { control_input [ { name: "start" control [ { kind: CONTROL_SEQUENCE_START '
               "int32_false_true: [ 0, 1 ] } ] } ] }")
    with pytest.raises(ConfigError, match=r"sequence_batching tensor 'start' does not follow the <name>__<index>"):
        load(script(tmp_path, AddSub()), io("a FP32 1", "y FP32 1", extra=control))


def test_input_index_beyond_forward_arguments(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"input 'INPUT__2' is argument 2 of forward\(a, b\)"):
        load(script(tmp_path, AddSub()), io("INPUT__0 FP32 1; INPUT__1 FP32 1; INPUT__2 FP32 1", "y FP32 1"))


def test_wrong_input_shape_at_run_time_is_invalid_input(tmp_path: Path) -> None:
    path = script(tmp_path, Affine())
    model = load(path, io("features FP32 -1; shift FP32 2", "OUTPUT__0 FP32 2", max_batch_size=8))
    with pytest.raises(ModelhostError) as raised:
        model.infer({"features": np.ones((2, 3), np.float32), "shift": np.ones((2, 2), np.float32)}, ["OUTPUT__0"])
    assert raised.value.kind is ErrorKind.INVALID_INPUT
    assert raised.value.message.startswith("pytorch model 'm' cannot run inputs features float32 [2,3]")
    assert raised.value.message.endswith("mat1 and mat2 shapes cannot be multiplied (2x3 and 4x2)")


def test_input_dtype_the_model_cannot_take_is_invalid_input(tmp_path: Path) -> None:
    model = load(script(tmp_path, Affine()), io("features FP64 4; shift FP32 2", "OUTPUT__0 FP32 2", max_batch_size=8))
    with pytest.raises(ModelhostError, match=r"\[2,4\], shift float32 \[2,2\]: mat1 and mat2 must have the same dtype"
                       ) as raised:
        model.infer({"features": np.ones((2, 4)), "shift": np.ones((2, 2), np.float32)}, ["OUTPUT__0"])
    assert raised.value.kind is ErrorKind.INVALID_INPUT


def test_output_dtype_other_than_config_is_internal(tmp_path: Path) -> None:
    model = load(script(tmp_path, Clone()), io("x FP32 1", "y INT32 1"))
    with pytest.raises(ModelhostError, match="output 'y' is torch.float32, but config.pbtxt declares INT32") as raised:
        model.infer({"x": np.ones(1, np.float32)}, ["y"])
    assert raised.value.kind is ErrorKind.INTERNAL


def test_output_the_result_lacks_is_internal(tmp_path: Path) -> None:
    model = load(script(tmp_path, Scores()), io("x FP32 2", "mean FP32 1", max_batch_size=2))
    with pytest.raises(ModelhostError, match="its dict result has no key 'mean' \\(keys: doubled, total\\)") as raised:
        model.infer({"x": np.ones((1, 2), np.float32)}, ["mean"])
    assert raised.value.kind is ErrorKind.INTERNAL
    model = load(script(tmp_path, AddSub()), io("a FP32 1; b FP32 1", "OUTPUT__0 FP32 1; OUTPUT__5 FP32 1"))
    with pytest.raises(ModelhostError, match="output 'OUTPUT__5' is position 5 of its result, which has 2"):
        model.infer({"a": np.ones(1, np.float32), "b": np.ones(1, np.float32)}, ["OUTPUT__5"])


def test_unload_drops_the_module(tmp_path: Path) -> None:
    model = load(script(tmp_path, Clone()), io("x FP32 1", "y FP32 1"))
    model.unload()
    with pytest.raises(AssertionError, match="after unload"):
        model.infer({"x": np.ones(1, np.float32)}, ["y"])
