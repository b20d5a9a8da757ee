"""Complete a model's config from its model file and check that the two agree.

Triton's auto-complete for ONNX: a missing config, or one without inputs/outputs,
takes names, datatypes and dims from the model, and max_batch_size > 0 when every
tensor's first dim is variable. A config that contradicts the model file is an error
that names both.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from modelhost.config.datatypes import config_datatype, config_type_name, v2_datatype
from modelhost.config.model_config_pb2 import ModelConfig, ModelInstanceGroup
from modelhost.config.pbtxt import CONFIG_FILENAME, ConfigError
from modelhost.types import TensorSpec, format_shape


def check_config(config: ModelConfig) -> None:
    """Checks that need no model file: names, datatypes, dims, reshape, batch size."""
    if config.max_batch_size < 0:
        raise ConfigError(f"{CONFIG_FILENAME}: max_batch_size must be >= 0, got {config.max_batch_size}")
    for kind, tensors in (("input", config.input), ("output", config.output)):
        seen: set[str] = set()
        for tensor in tensors:
            where = f"{CONFIG_FILENAME} {kind} '{tensor.name}'"
            if not tensor.name:
                raise ConfigError(f"{CONFIG_FILENAME}: an {kind} has no name")
            if tensor.name in seen:
                raise ConfigError(f"{where} is declared twice")
            seen.add(tensor.name)
            if tensor.data_type == 0:
                raise ConfigError(f"{where} has no data_type")
            if config_type_name(tensor.data_type) == "TYPE_BF16":
                raise ConfigError(f"{where}: data_type TYPE_BF16 is not supported")
            _check_dims(where, list(tensor.dims), tensor.reshape.shape if tensor.HasField("reshape") else None)
    for group in config.instance_group:
        if group.count < 0:
            raise ConfigError(f"{CONFIG_FILENAME} instance_group count must be >= 0, got {group.count}")


def _check_dims(where: str, dims: list[int], reshape: Sequence[int] | None) -> None:
    if not dims:
        raise ConfigError(f"{where} has no dims (use dims: [ 1 ] with reshape: {{ shape: [ ] }} for a scalar)")
    if any(d == 0 or d < -1 for d in dims):
        raise ConfigError(f"{where} has dims {format_shape(dims)}; each dim must be -1 or positive")
    if reshape is not None and any(d == 0 or d < -1 for d in reshape):
        raise ConfigError(f"{where} has reshape {format_shape(list(reshape))}; each dim must be -1 or positive")
    if reshape is not None and -1 not in dims and -1 not in reshape:
        if _count(dims) != _count(reshape):
            raise ConfigError(
                f"{where} reshape {format_shape(list(reshape))} has a different element count "
                f"than dims {format_shape(dims)}"
            )


def _count(shape: Sequence[int]) -> int:
    total = 1
    for d in shape:
        total *= d
    return total


def complete_config(
    config: ModelConfig,
    model_inputs: Sequence[TensorSpec],
    model_outputs: Sequence[TensorSpec],
    model_label: str,
    default_max_batch_size: int,
) -> ModelConfig:
    """Fill what the config leaves out from the model's own signature, then check they agree.

    `model_*` shapes are the model file's full shapes (-1 where variable). Returns a new config.
    """
    completed = ModelConfig()
    completed.CopyFrom(config)
    # Like Triton's onnxruntime backend: inputs and outputs are completed independently.
    fill_inputs, fill_outputs = not completed.input, not completed.output
    fed = _server_fed(completed)
    if fill_inputs or fill_outputs:
        if completed.max_batch_size == 0 and _supports_batching(model_inputs, model_outputs):
            completed.max_batch_size = default_max_batch_size
        skip = 1 if completed.max_batch_size > 0 else 0
        for spec in model_inputs if fill_inputs else ():
            if spec.name not in fed:
                _fill(completed.input.add(), spec, skip)
        for spec in model_outputs if fill_outputs else ():
            if spec.name not in fed:
                _fill(completed.output.add(), spec, skip)
    check_config(completed)
    _check_against_model(completed, "input", completed.input, [s for s in model_inputs if s.name not in fed],
                         model_label)
    _check_against_model(completed, "output", completed.output, model_outputs, model_label)
    return completed


def _server_fed(config: ModelConfig) -> set[str]:
    """A sequence model's tensors that are the server's, not the client's: control inputs, state inputs and
    outputs (core/sequences.py). The config lists none of them as inputs, nor controls and state inputs as outputs;
    a state output may be an output too (as in Triton: a client may then ask for it)."""
    sequences = config.sequence_batching
    states = sequences.state
    fed_inputs = {c.name for c in sequences.control_input} | {s.input_name for s in states}
    fed = fed_inputs | {s.output_name for s in states}
    listed = [t.name for t in config.input if t.name in fed] + [t.name for t in config.output if t.name in fed_inputs]
    if listed:
        raise ConfigError(f"{CONFIG_FILENAME}: '{listed[0]}' is a sequence_batching control or state tensor, which "
                          "the server fills and keeps: do not list it as an input or output")
    return fed


def _supports_batching(inputs: Sequence[TensorSpec], outputs: Sequence[TensorSpec]) -> bool:
    tensors = [*inputs, *outputs]
    return bool(tensors) and all(len(t.shape) >= 1 and t.shape[0] == -1 for t in tensors)


def _fill(tensor, spec: TensorSpec, skip: int) -> None:  # type: ignore[no-untyped-def]
    tensor.name = spec.name
    tensor.data_type = config_datatype(spec.datatype)
    dims = list(spec.shape[skip:])
    if dims:
        tensor.dims.extend(dims)
    else:
        tensor.dims.append(1)
        tensor.reshape.SetInParent()


def _check_against_model(
    config: ModelConfig, kind: str, declared: Sequence[Any], model: Sequence[TensorSpec], label: str
) -> None:
    by_name = {spec.name: spec for spec in model}
    names = ", ".join(by_name) or "none"
    for tensor in declared:
        where = f"{CONFIG_FILENAME} {kind} '{tensor.name}'"
        spec = by_name.get(tensor.name)
        if spec is None:
            raise ConfigError(f"{where} is not an {kind} of {label} (its {kind}s: {names})")
        datatype = v2_datatype(tensor.data_type)
        if datatype != spec.datatype:
            raise ConfigError(
                f"{where} has data_type {config_type_name(tensor.data_type)} but {label} declares {spec.datatype}"
            )
        body = list(tensor.reshape.shape) if tensor.HasField("reshape") else list(tensor.dims)
        expected = ([-1] if config.max_batch_size > 0 else []) + body
        if not _shapes_agree(expected, list(spec.shape)):
            batch = f" with max_batch_size {config.max_batch_size}" if config.max_batch_size > 0 else ""
            raise ConfigError(
                f"{where} has shape {format_shape(expected)}{batch} but {label} declares "
                f"{format_shape(list(spec.shape))}"
            )
    if kind == "input":
        declared_names = {t.name for t in declared}
        missing = [name for name in by_name if name not in declared_names]
        if missing:
            raise ConfigError(f"{CONFIG_FILENAME} lacks {label} input(s) {', '.join(repr(m) for m in missing)}")


def _shapes_agree(config_shape: list[int], model_shape: list[int]) -> bool:
    if len(config_shape) != len(model_shape):
        return False
    for ours, theirs in zip(config_shape, model_shape):
        if theirs != -1 and ours != theirs:
            return False
    return True


def apply_defaults(config: ModelConfig, name: str, platform: str, backend: str) -> None:
    """Fill the fields Triton fills for every model: name, platform/backend, version policy, instances."""
    if config.name and config.name != name:
        raise ConfigError(f"{CONFIG_FILENAME} name '{config.name}' does not match the model directory '{name}'")
    config.name = name
    config.platform = config.platform or platform
    config.backend = config.backend or backend
    if not config.HasField("version_policy"):
        config.version_policy.latest.num_versions = 1
    if not config.instance_group:
        config.instance_group.add(count=1, kind=ModelInstanceGroup.KIND_CPU)
    for group in config.instance_group:
        if group.count == 0:
            group.count = 1
        if group.kind == ModelInstanceGroup.KIND_AUTO:
            group.kind = ModelInstanceGroup.KIND_CPU  # KIND_GPU stays: core/devices.py places it
