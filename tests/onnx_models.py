"""Helpers for tests: build small ONNX models and lay them out as a Triton-style model repository."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import onnx
from onnx import TensorProto, helper

OPSET = 17
IR_VERSION = 8


def _finish(graph: onnx.GraphProto) -> onnx.ModelProto:
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="modelhost-tests")
    model.ir_version = IR_VERSION
    onnx.checker.check_model(model, full_check=True)
    return model


def write_model(repo: Path, name: str, model: onnx.ModelProto, config: str | None,
                version: int = 1, filename: str = "model.onnx") -> Path:
    """Write repo/name/<version>/<filename> (and repo/name/config.pbtxt unless config is None); return repo/name."""
    model_dir = Path(repo) / name
    version_dir = model_dir / str(version)
    version_dir.mkdir(parents=True, exist_ok=True)
    onnx.save_model(model, str(version_dir / filename))
    if config is not None:
        (model_dir / "config.pbtxt").write_text(config)
    return model_dir


def identity_model(onnx_elem_type: int, batch: bool = True, dims: Sequence[int] = (-1,)) -> onnx.ModelProto:
    """INPUT0 -> Identity -> OUTPUT0; -1 dims become symbolic, plus a leading "batch" dim when batch is True."""
    shape: list[int | str] = (["batch"] if batch else []) + [f"d{i}" if d == -1 else d for i, d in enumerate(dims)]
    graph = helper.make_graph(
        [helper.make_node("Identity", ["INPUT0"], ["OUTPUT0"])], "identity",
        [helper.make_tensor_value_info("INPUT0", onnx_elem_type, shape)],
        [helper.make_tensor_value_info("OUTPUT0", onnx_elem_type, shape)])
    return _finish(graph)


ADD_SUB_CONFIG = """
platform: "onnxruntime_onnx"
max_batch_size: 8
input [
  { name: "INPUT0" data_type: TYPE_FP32 dims: [ 16 ] },
  { name: "INPUT1" data_type: TYPE_FP32 dims: [ 16 ] }
]
output [
  { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 16 ] },
  { name: "OUTPUT1" data_type: TYPE_FP32 dims: [ 16 ] }
]
"""


def add_sub_model() -> onnx.ModelProto:
    """Triton's "simple" model: INPUT0, INPUT1 FP32 [batch, 16] -> OUTPUT0 = a + b, OUTPUT1 = a - b."""
    def info(name: str) -> onnx.ValueInfoProto:
        return helper.make_tensor_value_info(name, TensorProto.FLOAT, ["batch", 16])

    graph = helper.make_graph(
        [helper.make_node("Add", ["INPUT0", "INPUT1"], ["OUTPUT0"]),
         helper.make_node("Sub", ["INPUT0", "INPUT1"], ["OUTPUT1"])], "add_sub",
        [info("INPUT0"), info("INPUT1")], [info("OUTPUT0"), info("OUTPUT1")])
    return _finish(graph)
