"""ONNX Runtime backend: one InferenceSession per instance (or per device, shared), on CPU (or CUDA for a KIND_GPU
group's, core/devices.py).

Session options come from config `parameters` (Triton's onnxruntime names or ORT's own):
intra_op_thread_count / intra_op_num_threads, inter_op_thread_count / inter_op_num_threads,
execution_mode (0 sequential, the default | 1 parallel: independent operators run at once on the
inter-op pool, which ORT uses only in this mode), graph_optimization_level
(disable_all | basic | extended | all), or Triton's
`optimization { graph { level } }` (-1 basic, 0 all, 1 extended), and allow_spinning
(0 | 1, default 0), and Triton's share_session_between_instances (true | false, default false: the model's
instances on one device run on one session, its weights held once, its intra-op pool of all their threads).
Spinning is off by default: on a server, threads that spin after a
run take the cores the event loop needs to read the next request (rank x 500 rows at
concurrency 1: p99 2.0-2.8 ms without spinning, 4.9-6.2 ms with it; p50 the same).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort

from modelhost.backends.base import Backend, InstanceSettings, Model, ModelSignature
from modelhost.backends.row_split import RowSplitter
from modelhost.config.model_config_pb2 import ModelConfig
from modelhost.config.overrides import EXECUTION_MODE_PARAMETER, INTER_OP_PARAMETERS, INTRA_OP_PARAMETERS
from modelhost.config.parameters import natural_parameter, string_parameters
from modelhost.config.pbtxt import ConfigError
from modelhost.core.devices import visible_gpus
from modelhost.errors import ErrorKind, ModelhostError
from modelhost.types import TensorSpec

_ONNX_TYPES = {
    "tensor(bool)": "BOOL",
    "tensor(uint8)": "UINT8",
    "tensor(uint16)": "UINT16",
    "tensor(uint32)": "UINT32",
    "tensor(uint64)": "UINT64",
    "tensor(int8)": "INT8",
    "tensor(int16)": "INT16",
    "tensor(int32)": "INT32",
    "tensor(int64)": "INT64",
    "tensor(float16)": "FP16",
    "tensor(float)": "FP32",
    "tensor(double)": "FP64",
    "tensor(string)": "BYTES",
}
_LEVELS = {
    "disable_all": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
    "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
    "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
    "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
}
_TRITON_LEVELS = {-1: "basic", 0: "all", 1: "extended"}
_EXECUTION_MODES = {"0": ort.ExecutionMode.ORT_SEQUENTIAL, "1": ort.ExecutionMode.ORT_PARALLEL}
_ORT_ERROR = ort.capi.onnxruntime_pybind11_state
_ORT_LOG_ERRORS_ONLY = 3
SHARE_SESSION_PARAMETER = "share_session_between_instances"


class OnnxBackend(Backend):
    name = "onnxruntime"
    platform = "onnxruntime_onnx"
    default_filename = "model.onnx"
    pool_per_instance = True

    def describe(self, path: Path) -> ModelSignature:
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        options.log_severity_level = _ORT_LOG_ERRORS_ONLY
        session = ort.InferenceSession(_model_file(path), options, providers=["CPUExecutionProvider"])
        return ModelSignature(
            inputs=tuple(_spec(arg) for arg in session.get_inputs()),
            outputs=tuple(_spec(arg) for arg in session.get_outputs()),
        )

    def warm_up(self) -> None:
        from onnx import TensorProto, helper

        graph = helper.make_graph(
            [helper.make_node("Identity", ["x"], ["y"])], "warm_up",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])])
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
        model.ir_version = 8
        session = ort.InferenceSession(model.SerializeToString(), session_options(ModelConfig(), 1),
                                       providers=["CPUExecutionProvider"])
        session.run(None, {"x": np.zeros(1, np.float32)})

    def load(self, path: Path, config: ModelConfig, instance: InstanceSettings) -> Model:
        shared = _shares_session(config)
        # A shared session runs every instance's batches at once on its one intra-op pool: the threads of them all.
        instances = max(1, sum(group.count for group in config.instance_group)) if shared else 1
        options = session_options(config, instance.threads * instances)
        if instance.gpu is not None:
            return OnnxModel(_cuda_session(path, options, instance.gpu), gpu=instance.gpu, shared=shared)
        session = ort.InferenceSession(_model_file(path), options, providers=["CPUExecutionProvider"])
        # A session runs from several threads at once: a batching model's large batch may run as parts on cores
        # idle beyond its own (none when it has them all: one instance in one process).
        lender = instance.lender
        splitter = None
        if lender is not None and config.max_batch_size > 0:
            threads = options.intra_op_num_threads or lender.total  # 0: ONNX Runtime's default, every core
            splitter = RowSplitter(lender, threads) if threads < lender.total else None
        return OnnxModel(session, splitter, shared=shared)


    def gpu_devices(self) -> tuple[int, str]:
        if "CUDAExecutionProvider" not in ort.get_available_providers():
            return 0, "onnxruntime here has no CUDAExecutionProvider (onnxruntime-gpu runs on GPUs)"
        return visible_gpus(), "no GPU is visible to this process (CUDA_VISIBLE_DEVICES)"


def _cuda_session(path: Path, options: ort.SessionOptions, gpu: int) -> ort.InferenceSession:
    """A session on CUDA device `gpu` (CPU for the ops CUDA lacks). ONNX Runtime quietly drops a CUDA provider it
    cannot start (libraries missing): that is a load failure here, not a GPU model running on CPU unannounced."""
    providers: list[Any] = [("CUDAExecutionProvider", {"device_id": gpu}), "CPUExecutionProvider"]
    session = ort.InferenceSession(_model_file(path), options, providers=providers)
    if "CUDAExecutionProvider" not in session.get_providers():
        raise ConfigError(f"onnxruntime could not start its CUDA provider on GPU {gpu} (see its log for the "
                          "missing library)")
    return session


class OnnxModel(Model):
    """`shared`: the model's instances on one device share this session (Triton's share_session_between_instances)."""

    def __init__(self, session: ort.InferenceSession, splitter: RowSplitter | None = None, gpu: int | None = None,
                 shared: bool = False) -> None:
        self._session: ort.InferenceSession | None = session
        self._string_inputs = {arg.name for arg in session.get_inputs() if arg.type == "tensor(string)"}
        self._splitter = splitter
        self._gpu = gpu
        self._shared = shared

    def sibling(self, instance: InstanceSettings) -> OnnxModel | None:
        """An instance on this one's session, where the config shares it and the instance runs on the same device:
        ONNX Runtime's runs may go on at once on one session, whose weights are then held once."""
        if not self._shared or self._session is None or instance.gpu != self._gpu:
            return None
        return OnnxModel(self._session, self._splitter, self._gpu, shared=True)

    def infer(self, inputs: dict[str, np.ndarray], outputs: Sequence[str]) -> dict[str, np.ndarray]:
        assert self._session is not None, "instance used after unload"
        feeds = inputs
        if self._string_inputs:
            feeds = {name: _to_str(name, a) if name in self._string_inputs else a for name, a in inputs.items()}
        session, names = self._session, list(outputs)
        try:
            if self._splitter is None:
                results = session.run(names, feeds)
            else:
                results = self._splitter.run(lambda part: session.run(names, part), feeds)
        except _ORT_ERROR.InvalidArgument as exc:
            raise ModelhostError(ErrorKind.INVALID_INPUT, f"onnxruntime: {exc}") from exc
        except Exception as exc:  # onnxruntime raises several unrelated types for run-time failures
            raise ModelhostError(ErrorKind.INTERNAL, f"onnxruntime: {exc}") from exc
        return {name: _from_ort(result) for name, result in zip(outputs, results)}

    def signature(self) -> ModelSignature | None:
        if self._session is None:
            return None
        return ModelSignature(
            inputs=tuple(_spec(arg) for arg in self._session.get_inputs()),
            outputs=tuple(_spec(arg) for arg in self._session.get_outputs()),
        )

    def unload(self) -> None:
        self._session = None


def session_options(config: ModelConfig, default_threads: int) -> ort.SessionOptions:
    params = string_parameters(config)
    options = ort.SessionOptions()
    options.log_severity_level = _ORT_LOG_ERRORS_ONLY
    options.intra_op_num_threads = natural_parameter(params, INTRA_OP_PARAMETERS, default_threads)
    options.inter_op_num_threads = natural_parameter(params, INTER_OP_PARAMETERS, 1)
    mode = params.get(EXECUTION_MODE_PARAMETER, "0")
    if mode not in _EXECUTION_MODES:
        raise ValueError(f"parameter {EXECUTION_MODE_PARAMETER} must be 0 (sequential) or 1 (parallel), got '{mode}'")
    options.execution_mode = _EXECUTION_MODES[mode]
    spinning = params.get("allow_spinning", "0")
    if spinning not in ("0", "1"):
        raise ValueError(f"parameter allow_spinning must be 0 or 1, got '{spinning}'")
    options.add_session_config_entry("session.intra_op.allow_spinning", spinning)
    options.add_session_config_entry("session.inter_op.allow_spinning", spinning)
    level = params.get("graph_optimization_level")
    if level is None and config.optimization.HasField("graph"):
        level = _TRITON_LEVELS.get(config.optimization.graph.level, "all")
    if level is not None:
        if level.lower() not in _LEVELS:
            raise ValueError(f"parameter graph_optimization_level '{level}' is not one of {', '.join(_LEVELS)}")
        options.graph_optimization_level = _LEVELS[level.lower()]
    return options


def _shares_session(config: ModelConfig) -> bool:
    value = string_parameters(config).get(SHARE_SESSION_PARAMETER, "false").strip().lower()
    if value not in ("true", "false", "1", "0"):
        raise ConfigError(f"parameter {SHARE_SESSION_PARAMETER} must be true or false, got '{value}'")
    return value in ("true", "1")


def _model_file(path: Path) -> str:
    # Triton also accepts a directory model.onnx/ holding model.onnx plus external data.
    return str(path / path.name if path.is_dir() else path)


def _spec(arg: ort.NodeArg) -> TensorSpec:
    datatype = _ONNX_TYPES.get(arg.type)
    if datatype is None:
        raise ValueError(f"tensor '{arg.name}' has type {arg.type}, which modelhost does not serve")
    shape = tuple(d if isinstance(d, int) and d >= 0 else -1 for d in (arg.shape or []))
    return TensorSpec(arg.name, datatype, shape)


def _to_str(name: str, array: np.ndarray) -> np.ndarray:
    # onnxruntime string tensors take str objects; bytes would be stringified as "b'...'".
    items = array.reshape(-1).tolist()
    try:
        if set(map(type, items)) == {bytes}:
            return _objects(list(map(bytes.decode, items)), array.shape)
        return _objects([b.decode("utf-8") if isinstance(b, bytes) else b for b in items], array.shape)
    except UnicodeDecodeError as exc:
        message = f"input '{name}': onnxruntime needs UTF-8 strings: {exc}"
        raise ModelhostError(ErrorKind.INVALID_INPUT, message) from exc


def _from_ort(result: np.ndarray) -> np.ndarray:
    if result.dtype == np.object_:
        return _objects(list(map(str.encode, result.reshape(-1).tolist())), result.shape)
    return result


def _objects(items: list[object], shape: tuple[int, ...]) -> np.ndarray:
    array = np.empty(len(items), dtype=object)  # np.array(items) would read equal-length lists as another axis
    array[:] = items
    return array.reshape(shape)
