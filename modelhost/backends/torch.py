"""PyTorch backend on CPU: TorchScript (`model.pt`) or a torch.export program (`*.pt2`), one copy per instance.

Neither file declares its tensors' types and shapes, so config.pbtxt must list every input and output.
Names follow Triton's pytorch backend. Inputs: when every config input is named like an argument of
forward(), by that name; else when every one is `<name>__<index>` (INPUT__0), by that position; else in
config order. A sequence model's control inputs and state tensors go by `<name>__<index>` (START__1)
alone. A forward() whose one argument is a Dict[str, Tensor] gets every input under its config name.
Outputs: forward() returns a tensor (position 0), a tuple or list (positions: `<name>__<index>` when every
output is named so, else config order), or a dict (by config name).

TYPE_STRING tensors are `List[str]` on the model's side, as in Triton's pytorch backend: one dimension, batch
included; each element UTF-8.

Inputs reach forward() as tensors that share the request's memory (torch.from_numpy, no copy), read-only
ones included: a model must not write its inputs in place.

Threads: torch's intra-op thread count is process-wide in its API, but with the OpenMP build (the pip CPU
wheels) it takes effect per calling thread. An instance sets its count on the thread that runs it (its own,
or the event loop for a cheap request) before each run, so a model's instances together use about the cores
the core gave them. Other builds keep torch's default. The inter-op pool (only torch.jit.fork uses it) is
left as torch sets it.
"""

from __future__ import annotations

import inspect
import io
import re
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeGuard

import numpy as np
import torch

from modelhost.backends.base import Backend, InstanceSettings, Model, ModelSignature, config_signature
from modelhost.config.datatypes import v2_datatype
from modelhost.config.model_config_pb2 import ModelConfig
from modelhost.config.overrides import INTRA_OP_PARAMETERS
from modelhost.config.parameters import natural_parameter, string_parameters
from modelhost.config.pbtxt import CONFIG_FILENAME, ConfigError
from modelhost.errors import ErrorKind, ModelhostError
from modelhost.types import format_shape

_TORCH_DTYPES = {
    "BOOL": torch.bool,
    "UINT8": torch.uint8,
    "UINT16": torch.uint16,
    "UINT32": torch.uint32,
    "UINT64": torch.uint64,
    "INT8": torch.int8,
    "INT16": torch.int16,
    "INT32": torch.int32,
    "INT64": torch.int64,
    "FP16": torch.float16,
    "FP32": torch.float32,
    "FP64": torch.float64,
}
_ERROR_PREFIX = re.compile(r"^\w+(Error|Exception): ")
_DATATYPES: dict[torch.dtype | None, str] = {dtype: name for name, dtype in _TORCH_DTYPES.items()}
_DATATYPES[None] = "BYTES (List[str])"
_REQUIRED = object()  # a forward() argument without a default value
_PER_THREAD_COUNTS = "parallel backend: OpenMP" in torch.__config__.parallel_info()
# Inputs are lent read-only by contract (module docstring), so torch's once-per-process warning that a
# read-only array (np.frombuffer over a request body) becomes a writable tensor tells nothing new.
warnings.filterwarnings("ignore", message="The given NumPy array is not writable", category=UserWarning)


class _WarmUp(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + 1


class TorchBackend(Backend):
    name = "pytorch"
    platform = "pytorch_libtorch"
    default_filename = "model.pt"

    def code_in(self, filename: str) -> str | None:
        # torch.export.load unpickles the program's constants with weights_only=False: a pickle runs code.
        # TorchScript (torch.jit.load) runs no Python, though its ops can read files (torch.from_file).
        if filename.endswith(".pt2"):
            return f"{filename} (torch.export.load unpickles it, and a pickle can run any code)"
        return None

    def describe(self, path: Path) -> ModelSignature:
        raise ConfigError(
            f"{path.name} does not declare its inputs and outputs: {CONFIG_FILENAME} must list them "
            "(name, data_type, dims)"
        )

    def warm_up(self) -> None:
        # Importing torch (this module) is most of it; the first TorchScript load sets up the JIT's registries.
        buffer = io.BytesIO()
        torch.jit.save(torch.jit.script(_WarmUp()), buffer)
        buffer.seek(0)
        with torch.inference_mode():
            torch.jit.load(buffer, map_location="cpu")(torch.zeros(1))  # type: ignore[no-untyped-call]

    def load(self, path: Path, config: ModelConfig, instance: InstanceSettings) -> Model:
        signature = _config_signature(path, config)
        device = "cpu" if instance.gpu is None else f"cuda:{instance.gpu}"
        module, arguments = _load_module(path, device)
        binding = _bind(path, config, arguments)
        threads = _intra_op_threads(config, instance.threads)
        label = f"pytorch model '{config.name or path.name}'"
        return TorchModel(module, binding, signature, threads, label, None if instance.gpu is None else device)

    def gpu_devices(self) -> tuple[int, str]:
        if not torch.cuda.is_available():
            return 0, "torch here has no usable CUDA (torch.cuda.is_available() is False)"
        return torch.cuda.device_count(), ""


@dataclass(frozen=True, slots=True)
class _Argument:
    name: str
    default: Any  # _REQUIRED when forward() has no default for it
    type: str


@dataclass(frozen=True, slots=True)
class _Binding:
    """How config inputs become forward()'s arguments and its result becomes config outputs."""

    dict_input: bool
    positions: dict[str, int]  # config input -> forward() argument position
    defaults: tuple[Any, ...]  # the arguments passed where an optional input is absent
    outputs: dict[str, int]  # config output -> position in a tuple result
    dtypes: dict[str, torch.dtype | None]  # config output -> the dtype its tensor must have (None: List[str])


class TorchModel(Model):
    def __init__(self, module: Any, binding: _Binding, signature: ModelSignature, threads: int, label: str,
                 device: str | None = None) -> None:
        self._module: Any = module
        self._device = device  # "cuda:N" for a KIND_GPU instance: inputs go there, outputs come back
        self._binding = binding
        self._signature = signature
        self._threads = threads
        self._label = label

    def infer(self, inputs: dict[str, np.ndarray], outputs: Sequence[str]) -> dict[str, np.ndarray]:
        module = self._module
        assert module is not None, "instance used after unload"
        if _PER_THREAD_COUNTS and torch.get_num_threads() != self._threads:
            torch.set_num_threads(self._threads)  # this thread's OpenMP team only (module docstring)
        tensors = {name: _to_torch(name, array) for name, array in inputs.items()}
        if self._device is not None:
            tensors = {name: tensor.to(self._device) if isinstance(tensor, torch.Tensor) else tensor
                       for name, tensor in tensors.items()}
        try:
            with torch.inference_mode():
                result = module(tensors) if self._binding.dict_input else module(*self._arguments(tensors))
        except (RuntimeError, AssertionError, ValueError, TypeError) as exc:  # torch's errors for bad inputs
            described = ", ".join(f"{n} {a.dtype} {format_shape(list(a.shape))}" for n, a in inputs.items())
            message = f"{self._label} cannot run inputs {described}: {_last_line(exc)}"
            raise ModelhostError(ErrorKind.INVALID_INPUT, message) from exc
        return {name: self._output(result, name) for name in outputs}

    def _arguments(self, tensors: dict[str, torch.Tensor | list[str]]) -> list[Any]:
        arguments = list(self._binding.defaults)
        for name, position in self._binding.positions.items():
            if name in tensors:
                arguments[position] = tensors[name]
        return arguments

    def _output(self, result: Any, name: str) -> np.ndarray:
        position = self._binding.outputs[name]
        if isinstance(result, dict):
            tensor = result.get(name)
            where = f"its dict result has no key '{name}' (keys: {', '.join(map(str, result))})"
        elif isinstance(result, (tuple, list)) and not (result and _strings(result)):
            tensor = result[position] if position < len(result) else None
            where = f"output '{name}' is position {position} of its result, which has {len(result)}"
        else:
            tensor = result if position == 0 else None
            where = f"output '{name}' is position {position}, but it returned one {type(result).__name__}"
        expected = self._binding.dtypes[name]
        if expected is None and _strings(tensor):
            strings = np.empty(len(tensor), np.object_)
            strings[:] = [item.encode() for item in tensor]
            return strings
        if not isinstance(tensor, torch.Tensor):
            found = "" if tensor is None else f" (found {type(tensor).__name__})"
            raise ModelhostError(ErrorKind.INTERNAL, f"{self._label}: {where}{found}")
        if tensor.dtype != expected:
            declared = _DATATYPES[expected]
            raise ModelhostError(
                ErrorKind.INTERNAL,
                f"{self._label}: output '{name}' is {tensor.dtype}, but {CONFIG_FILENAME} declares {declared}",
            )
        return tensor.detach().cpu().numpy()

    def signature(self) -> ModelSignature | None:
        return self._signature

    def unload(self) -> None:
        self._module = None


def _config_signature(path: Path, config: ModelConfig) -> ModelSignature:
    """The config's tensors (the backend's view: reshape where given), checked for torch types."""
    if not config.input or not config.output:
        raise ConfigError(
            f"{CONFIG_FILENAME} must list every input and output of {path.name}: a PyTorch model file does not "
            "declare their names, data types and shapes"
        )
    signature = config_signature(config, CONFIG_FILENAME, (*_TORCH_DTYPES, "BYTES"), TorchBackend.name)
    for kind, specs in (("input", signature.inputs), ("output", signature.outputs)):
        for spec in specs:
            if spec.datatype == "BYTES" and len(spec.shape) != 1:
                raise ConfigError(
                    f"{CONFIG_FILENAME} {kind} '{spec.name}' is TYPE_STRING of shape {format_shape(spec.shape)}: a "
                    "PyTorch model takes strings as a List[str], of one dimension, batch included (Triton only "
                    "supports 1 dimensional List of String)")
    return signature


def _load_module(path: Path, device: str = "cpu") -> tuple[Any, list[_Argument]]:
    """The module (TorchScript in eval mode) and its forward() arguments, self left out."""
    try:
        if path.suffix == ".pt2":
            module = torch.export.load(str(path)).module().to(device)
            parameters = inspect.signature(module.forward).parameters.values()
            arguments = [_Argument(p.name, _REQUIRED if p.default is p.empty else p.default, "") for p in parameters]
        else:
            # An exported program has no eval(); torch.jit.load has no annotations.
            module = torch.jit.load(str(path), map_location=device).eval()  # type: ignore[no-untyped-call]
            arguments = [
                _Argument(a.name, a.default_value if a.has_default_value() else _REQUIRED, str(a.type))
                for a in module.forward.schema.arguments[1:]
            ]
    except Exception as exc:  # torch raises several unrelated types for unreadable archives
        kind = "a torch.export program (torch.export.save)" if path.suffix == ".pt2" else "TorchScript (torch.jit.save)"
        raise ConfigError(f"cannot load {path} as {kind}: {_last_line(exc)}") from exc
    return module, arguments


def _bind(path: Path, config: ModelConfig, arguments: list[_Argument]) -> _Binding:
    states = config.sequence_batching.state
    outputs = _positions([t.name for t in config.output], []) | _sequence_positions([s.output_name for s in states])
    dtypes = {t.name: _TORCH_DTYPES.get(v2_datatype(t.data_type)) for t in config.output}
    dtypes |= {s.output_name: _TORCH_DTYPES.get(v2_datatype(s.data_type)) for s in states}
    sequence_inputs = [c.name for c in config.sequence_batching.control_input] + [s.input_name for s in states]
    if len(arguments) == 1 and arguments[0].type.startswith("Dict[str, Tensor]"):
        return _Binding(True, {}, (), outputs, dtypes)
    names = [a.name for a in arguments]
    positions = _positions([t.name for t in config.input], names) | _sequence_positions(sequence_inputs)
    where = f"forward({', '.join(names)}) of {path.name}"
    for name, position in positions.items():
        if position >= len(arguments):
            raise ConfigError(f"{CONFIG_FILENAME} input '{name}' is argument {position} of {where}, which has none")
    shared = [name for name, position in positions.items() if list(positions.values()).count(position) > 1]
    if shared:
        raise ConfigError(f"{CONFIG_FILENAME} inputs {', '.join(shared)} name the same argument of {where}")
    covered = set(positions.values())
    missing = [a.name for i, a in enumerate(arguments) if i not in covered and a.default is _REQUIRED]
    if missing:
        raise ConfigError(
            f"{CONFIG_FILENAME} has no input for argument(s) {', '.join(missing)} of {where} (inputs match "
            "arguments by name, by <name>__<index>, or else in config order)"
        )
    defaults = tuple(None if a.default is _REQUIRED else a.default for a in arguments[: max(covered) + 1])
    return _Binding(False, positions, defaults, outputs, dtypes)


def _positions(names: list[str], arguments: list[str]) -> dict[str, int]:
    """Triton's naming conventions: forward() argument names, then <name>__<index>, then config order."""
    if arguments and all(name in arguments for name in names):
        return {name: arguments.index(name) for name in names}
    indices = [_named_index(name) for name in names]
    if all(index is not None for index in indices):
        return dict(zip(names, indices))  # type: ignore[arg-type]
    return {name: position for position, name in enumerate(names)}


def _sequence_positions(names: list[str]) -> dict[str, int]:
    """The positions of a sequence model's control inputs and state tensors: as in Triton's pytorch backend, each
    named <name>__<index> (START__1), whatever convention the config's inputs and outputs follow."""
    positions = {}
    for name in names:
        index = _named_index(name)
        if index is None:
            raise ConfigError(f"sequence_batching tensor '{name}' does not follow the <name>__<index> naming "
                              "convention, which a PyTorch model's sequence controls and states need (START__1)")
        positions[name] = index
    return positions


def _strings(value: Any) -> TypeGuard[list[str]]:
    """Whether `value` is a List[str] (a TYPE_STRING output; a whole result that is one, when not empty, is the
    model's one output rather than a list of outputs)."""
    return isinstance(value, list) and all(isinstance(item, str) for item in value)


def _named_index(name: str) -> int | None:
    _, separator, index = name.partition("__")
    return int(index) if separator and index.isascii() and index.isdigit() else None


def _intra_op_threads(config: ModelConfig, default: int) -> int:
    # Triton's pytorch backend spells it INTRA_OP_THREAD_COUNT; 0 leaves the choice to the core.
    return natural_parameter(string_parameters(config, lower=True), INTRA_OP_PARAMETERS, 0) or default


def _to_torch(name: str, array: np.ndarray) -> torch.Tensor | list[str]:
    if array.dtype == np.object_:  # a TYPE_STRING tensor (one dimension: _config_signature)
        try:
            return [item.decode() if isinstance(item, bytes) else str(item) for item in array.reshape(-1).tolist()]
        except UnicodeDecodeError:
            raise ModelhostError(ErrorKind.INVALID_INPUT, f"input '{name}' holds an element that is not UTF-8: a "
                                 "PyTorch model takes strings as a List[str]") from None
    if any(stride < 0 for stride in array.strides):  # torch.from_numpy refuses negative strides
        array = np.ascontiguousarray(array)
    return torch.from_numpy(array)


def _last_line(exc: BaseException) -> str:
    # TorchScript errors carry the script's traceback; the cause is on the last line ("RuntimeError: ...").
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return _ERROR_PREFIX.sub("", lines[-1]) if lines else type(exc).__name__
