"""The gRPC tests' repository, built here and served once for the package (conftest.py), and their helpers.
Triton's own clients (`tritonclient.grpc` and `.aio`, unmodified) speak to it; typed tensor contents go out in
tritonclient's generated messages over a plain grpc channel, since tritonclient itself always sends raw contents.

Models:
- `simple`: Triton's add/sub model (INPUT0, INPUT1 FP32 [batch, 16] -> OUTPUT0 = a + b, OUTPUT1 = a - b);
- `identity_<datatype>`: an Identity model per V2 datatype (INPUT0 -> OUTPUT0, dims [-1]);
- `shared`: the add/sub model with one instance and a 300 ms queue delay (HTTP and gRPC batched together);
- `slow`: a Loop of MatMuls as slow as each request asks, one instance, max_queue_size 1, timeouts overridable;
- `double`: OUTPUT0 is INPUT0 twice over (a response larger than its request).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from onnx import TensorProto, helper
from tritonclient.utils import InferenceServerException

from tests.onnx_models import (
    ADD_SUB_CONFIG,
    IR_VERSION,
    OPSET,
    add_sub_model,
    identity_model,
    slow_loop_config,
    slow_loop_model,
    write_model,
)
from tests.server import ServerProcess

# V2 datatype -> (ONNX element type, numpy dtype, InferTensorContents field or None when raw only)
DATATYPES: dict[str, tuple[int, type, str | None]] = {
    "BOOL": (TensorProto.BOOL, np.bool_, "bool_contents"),
    "UINT8": (TensorProto.UINT8, np.uint8, "uint_contents"),
    "UINT16": (TensorProto.UINT16, np.uint16, "uint_contents"),
    "UINT32": (TensorProto.UINT32, np.uint32, "uint_contents"),
    "UINT64": (TensorProto.UINT64, np.uint64, "uint64_contents"),
    "INT8": (TensorProto.INT8, np.int8, "int_contents"),
    "INT16": (TensorProto.INT16, np.int16, "int_contents"),
    "INT32": (TensorProto.INT32, np.int32, "int_contents"),
    "INT64": (TensorProto.INT64, np.int64, "int64_contents"),
    "FP16": (TensorProto.FLOAT16, np.float16, None),
    "FP32": (TensorProto.FLOAT, np.float32, "fp32_contents"),
    "FP64": (TensorProto.DOUBLE, np.float64, "fp64_contents"),
    "BYTES": (TensorProto.STRING, np.object_, "bytes_contents"),
}
S = 64  # the slow model's X is [batch, S, S]
BLOCK_SECONDS = 0.8  # how long a blocking request holds the slow model's only instance
SHARED_DELAY_US = 300_000
UNKNOWN = "Request for unknown model: 'nope' is not found"


def identity_config(datatype: str) -> str:
    config_type = "TYPE_STRING" if datatype == "BYTES" else f"TYPE_{datatype}"
    return (f'platform: "onnxruntime_onnx"\nmax_batch_size: 8\n'
            f'input [ {{ name: "INPUT0" data_type: {config_type} dims: [ -1 ] }} ]\n'
            f'output [ {{ name: "OUTPUT0" data_type: {config_type} dims: [ -1 ] }} ]\n')


def double_model() -> Any:
    graph = helper.make_graph(
        [helper.make_node("Concat", ["INPUT0", "INPUT0"], ["OUTPUT0"], axis=1)], "double",
        [helper.make_tensor_value_info("INPUT0", TensorProto.FLOAT, ["batch", "n"])],
        [helper.make_tensor_value_info("OUTPUT0", TensorProto.FLOAT, ["batch", "twice_n"])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = IR_VERSION
    return model


def build_repository(root: Path) -> Path:
    write_model(root, "simple", add_sub_model(), ADD_SUB_CONFIG)
    for datatype, (element_type, _, _) in DATATYPES.items():
        write_model(root, f"identity_{datatype.lower()}", identity_model(element_type), identity_config(datatype))
    shared = ADD_SUB_CONFIG + ("instance_group [ { count: 1 kind: KIND_CPU } ]\n"
                               f"dynamic_batching {{ max_queue_delay_microseconds: {SHARED_DELAY_US} }}\n")
    write_model(root, "shared", add_sub_model(), shared)
    queue = "dynamic_batching { default_queue_policy { max_queue_size: 1 allow_timeout_override: true } }"
    write_model(root, "slow", slow_loop_model(S, batched=True), slow_loop_config(S, max_batch_size=4, extra=queue))
    write_model(root, "double", double_model(), identity_config("FP32"))
    return root


@dataclass
class Served:
    server: ServerProcess
    client: grpcclient.InferenceServerClient
    block_iterations: int  # ITERATIONS that hold the slow instance ~BLOCK_SECONDS


def simple_inputs(a: np.ndarray, b: np.ndarray) -> list[grpcclient.InferInput]:
    return [grpcclient.InferInput("INPUT0", list(a.shape), "FP32").set_data_from_numpy(a),
            grpcclient.InferInput("INPUT1", list(b.shape), "FP32").set_data_from_numpy(b)]


def pair(seed: int, rows: int = 1) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.standard_normal((rows, 16)).astype(np.float32), rng.standard_normal((rows, 16)).astype(np.float32)


def slow_inputs(x: np.ndarray, iterations: int) -> list[grpcclient.InferInput]:
    counts = np.full((len(x), 1), iterations, np.int64)
    return [grpcclient.InferInput("X", list(x.shape), "FP32").set_data_from_numpy(x),
            grpcclient.InferInput("ITERATIONS", [len(x), 1], "INT64").set_data_from_numpy(counts)]


def infer_slow(client: grpcclient.InferenceServerClient, x: np.ndarray, iterations: int, **kwargs: Any) -> np.ndarray:
    result = client.infer("slow", slow_inputs(x, iterations), **kwargs).as_numpy("Y")
    assert result is not None
    return result


def unique_x(tag: int) -> np.ndarray:
    return np.full((1, S, S), float(tag), np.float32) + np.arange(S, dtype=np.float32) / 128


def grpc_error(call: Callable[[], Any]) -> InferenceServerException:
    with pytest.raises(InferenceServerException) as caught:
        call()
    return caught.value


def counts(client: grpcclient.InferenceServerClient, model: str) -> tuple[int, int]:
    (stat,) = client.get_inference_statistics(model).model_stats
    return stat.execution_count, stat.inference_count


def assert_same(actual: np.ndarray | None, expected: np.ndarray) -> None:
    assert actual is not None and actual.shape == expected.shape
    if expected.dtype == object:
        assert actual.tolist() == expected.tolist()
    else:  # bit for bit: -0.0 apart from 0.0, NaN equal to NaN
        assert actual.dtype == expected.dtype and actual.tobytes() == expected.tobytes()


