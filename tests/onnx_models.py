"""Helpers for tests: build small ONNX models and lay them out as a Triton-style model repository."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

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


def slow_loop_model(size: int, batched: bool) -> onnx.ModelProto:
    """Y = X @ I^k + 1 with k = max(ITERATIONS): a Loop of identity MatMuls, exact in fp32 and as slow as asked.

    X is [size, size] (or [batch, size, size] when `batched`), ITERATIONS is [1] (or [batch, 1]).
    """
    lead: list[str | int] = ["batch"] if batched else []
    body = helper.make_graph(
        [helper.make_node("Identity", ["cond_in"], ["cond_out"]),
         helper.make_node("MatMul", ["state_in", "W"], ["state_out"])],
        "body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []),
         helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
         helper.make_tensor_value_info("state_in", TensorProto.FLOAT, [*lead, size, size])],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("state_out", TensorProto.FLOAT, [*lead, size, size])],
    )
    graph = helper.make_graph(
        [helper.make_node("ReduceMax", ["ITERATIONS"], ["trip_count"], keepdims=0),
         helper.make_node("Loop", ["trip_count", "true", "X"], ["final"], body=body),
         helper.make_node("Add", ["final", "one"], ["Y"])],
        "slow",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [*lead, size, size]),
         helper.make_tensor_value_info("ITERATIONS", TensorProto.INT64, [*lead, 1])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [*lead, size, size])],
        [numpy_helper.from_array(np.eye(size, dtype=np.float32), "W"),
         numpy_helper.from_array(np.array(True), "true"),
         numpy_helper.from_array(np.array(1.0, np.float32), "one")],
    )
    return _finish(graph)


def slow_loop_config(size: int, max_batch_size: int, extra: str = "") -> str:
    return f"""
platform: "onnxruntime_onnx"
max_batch_size: {max_batch_size}
input [
  {{ name: "X" data_type: TYPE_FP32 dims: [ {size}, {size} ] }},
  {{ name: "ITERATIONS" data_type: TYPE_INT64 dims: [ 1 ] }}
]
output [ {{ name: "Y" data_type: TYPE_FP32 dims: [ {size}, {size} ] }} ]
instance_group [ {{ count: 1 kind: KIND_CPU }} ]
# Its run time follows ITERATIONS's value, which the loop gate (sizes) cannot predict: never on the loop.
parameters {{ key: "inline_max_microseconds" value: {{ string_value: "0" }} }}
{extra}
"""


def loop_iterations_for(seconds: float, run: Callable[[int], object], probe: int = 10_000,
                        bounds: tuple[int, int] = (1000, 5_000_000)) -> int:
    """The ITERATIONS that make one run of the slow loop take about `seconds`, timed through `run`.

    The fastest of three probes: a probe slowed by a busy moment (the other xdist worker starting a server)
    would give a block too short to outlast the deadlines a test sets once the machine is quiet again.
    """
    run(100)  # warm-up
    timings = []
    for _ in range(3):
        started = time.monotonic()
        run(probe)
        timings.append(time.monotonic() - started)
    per_iteration = max(min(timings) / probe, 1e-7)
    return int(min(max(seconds / per_iteration, bounds[0]), bounds[1]))


def scale_model(factor: float, width: int = 4) -> onnx.ModelProto:
    """INPUT0 FP32 [batch, width] -> OUTPUT0 = INPUT0 * factor."""
    scale = numpy_helper.from_array(np.array(factor, np.float32), "factor")
    graph = helper.make_graph(
        [helper.make_node("Mul", ["INPUT0", "factor"], ["OUTPUT0"])], "scale",
        [helper.make_tensor_value_info("INPUT0", TensorProto.FLOAT, ["batch", width])],
        [helper.make_tensor_value_info("OUTPUT0", TensorProto.FLOAT, ["batch", width])],
        initializer=[scale])
    return _finish(graph)


# accumulator_model's control inputs and state, as a config's sequence_batching lists them.
ACCUMULATOR_CONTROLS = """
  control_input [
    { name: "START" control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] } ] },
    { name: "END" control [ { kind: CONTROL_SEQUENCE_END int32_false_true: [ 0, 1 ] } ] },
    { name: "READY" control [ { kind: CONTROL_SEQUENCE_READY int32_false_true: [ 0, 1 ] } ] },
    { name: "CORRID" control [ { kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_UINT64 } ] }
  ]
  state [ { input_name: "STATE_IN" output_name: "STATE_OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
"""


def accumulator_model(ready: int = 4) -> onnx.ModelProto:
    """A sequence model's accumulator (tests/core/test_sequences_e2e.py): int32 [batch, 1] INPUT with control
    inputs START, END, READY (int32) and CORRID (uint64) and the state STATE_IN -> OUTPUT = STATE_IN * (1 - START)
    + INPUT (also STATE_OUT, the next state), FLAGS = START + 2 END + `ready` READY, CORRID_OUT = CORRID."""
    def int32(name: str) -> onnx.ValueInfoProto:
        return helper.make_tensor_value_info(name, TensorProto.INT32, ["batch", 1])

    constants = [helper.make_node("Constant", [], [name], value=helper.make_tensor(name, TensorProto.INT32, [],
                                                                                    [value]))
                 for name, value in (("one", 1), ("two", 2), ("four", ready))]
    nodes = [
        *constants,
        helper.make_node("Sub", ["one", "START"], ["carry"]),
        helper.make_node("Mul", ["STATE_IN", "carry"], ["kept"]),
        helper.make_node("Add", ["kept", "INPUT"], ["OUTPUT"]),
        helper.make_node("Identity", ["OUTPUT"], ["STATE_OUT"]),
        helper.make_node("Mul", ["END", "two"], ["end2"]),
        helper.make_node("Mul", ["READY", "four"], ["ready4"]),
        helper.make_node("Add", ["START", "end2"], ["start_end"]),
        helper.make_node("Add", ["start_end", "ready4"], ["FLAGS"]),
        helper.make_node("Identity", ["CORRID"], ["CORRID_OUT"]),
    ]
    corrid = helper.make_tensor_value_info("CORRID", TensorProto.UINT64, ["batch", 1])
    corrid_out = helper.make_tensor_value_info("CORRID_OUT", TensorProto.UINT64, ["batch", 1])
    graph = helper.make_graph(
        nodes, "accumulator",
        [int32("INPUT"), int32("START"), int32("END"), int32("READY"), corrid, int32("STATE_IN")],
        [int32("OUTPUT"), int32("FLAGS"), corrid_out, int32("STATE_OUT")])
    return _finish(graph)
