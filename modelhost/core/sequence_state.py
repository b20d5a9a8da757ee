"""Implicit state (`sequence_batching.state`): tensors the server keeps per sequence between its requests.

Each state pairs a model input with a model output, neither listed in the config's `input`/`output`: the
backend sees them as an ordinary input and output. A sequence's first request feeds the initial state
(`initial_state` with `zero_data`, or the tensor in its `data_file`, read at load from the model directory's
`initial_state/` folder as Triton reads it (core/tensor_files.py); without `initial_state`, zeros of the
state's dims, a variable dim counting 0; empty strings for a TYPE_STRING state); every request's state
output becomes the next request's state input. A sequence's state is dropped when it ends or idles out.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from modelhost.config.datatypes import v2_datatype
from modelhost.config.model_config_pb2 import ModelConfig, ModelSequenceBatching
from modelhost.config.pbtxt import ConfigError
from modelhost.core.tensor_files import read_tensor_file
from modelhost.errors import ErrorKind, ModelhostError
from modelhost.types import DATATYPE_DTYPES, format_shape

INITIAL_STATE_DIR = "initial_state"  # in the model's directory (not a version's), as Triton has it
State = dict[str, np.ndarray]  # state input name -> its tensor, batch dim included where the model batches


@dataclass(frozen=True, slots=True)
class StateTensor:
    input_name: str
    output_name: str
    dtype: np.dtype
    dims: tuple[int, ...]  # without the batch dim; -1 where variable
    initial: np.ndarray  # the first request's state input, batch dim included where the model batches


class ImplicitState:
    """A model's states, read once from its config."""

    def __init__(self, config: ModelConfig, model_dir: Path | None = None) -> None:
        """`model_dir`: where an `initial_state` `data_file` is read from (its `initial_state/` folder)."""
        batch = (1,) if config.max_batch_size > 0 else ()
        self.tensors = tuple(_tensor(state, batch, model_dir) for state in config.sequence_batching.state)
        self.output_names = tuple(t.output_name for t in self.tensors)

    def initial(self) -> State:
        return {t.input_name: t.initial for t in self.tensors}

    def take(self, label: str, results: dict[str, np.ndarray], asked: Sequence[str] = ()) -> State:
        """The next state from one request's results, removing the state outputs from them but those the request
        `asked` for (a state output the config also lists as an output); INTERNAL when the model gave a state
        output of the wrong type or rank."""
        state: State = {}
        for tensor in self.tensors:
            array = results[tensor.output_name] if tensor.output_name in asked else results.pop(tensor.output_name)
            if array.dtype != tensor.dtype or array.ndim != tensor.initial.ndim:
                raise ModelhostError(
                    ErrorKind.INTERNAL,
                    f"model {label}: state output '{tensor.output_name}' is {array.dtype} of shape "
                    f"{format_shape(array.shape)}, but its state is {tensor.dtype} of dims {format_shape(tensor.dims)}",
                )
            # A copy: the request's rows are a view into the whole batch's output, which it would keep alive.
            state[tensor.input_name] = array.copy()
        return state


def _tensor(state: ModelSequenceBatching.State, batch: tuple[int, ...], model_dir: Path | None) -> StateTensor:
    where = f"sequence_batching state '{state.input_name}'"
    if not state.input_name or not state.output_name:
        raise ConfigError(f"{where}: a state needs both input_name and output_name")
    try:
        datatype = v2_datatype(state.data_type)
        dtype = DATATYPE_DTYPES[datatype]
    except KeyError:
        raise ConfigError(f"{where} has no data_type") from None
    if not state.dims or any(d < -1 or d == 0 for d in state.dims):
        raise ConfigError(f"{where} needs dims, each -1 or positive")
    if len(state.initial_state) > 1:
        raise ConfigError(f"{where}: initial_state must have at most one entry")
    dims = tuple(state.dims)
    shape = tuple(1 if d == -1 else d for d in dims)  # as Triton: a variable dim starts at 1
    value = None
    if state.initial_state:
        initial = state.initial_state[0]
        if initial.data_type != state.data_type or len(initial.dims) != len(dims) or any(
                i < 1 or (d != -1 and i != d) for i, d in zip(initial.dims, dims)):
            raise ConfigError(f"{where}: initial_state must have the state's data_type and dims that fit its dims "
                              f"{format_shape(dims)}, none variable")
        shape = tuple(initial.dims)
        if initial.WhichOneof("state_data") == "data_file":
            if model_dir is None:
                raise ConfigError(f"{where}: initial_state data_file needs the model's directory")
            value = read_tensor_file(model_dir, INITIAL_STATE_DIR, initial.data_file, datatype, shape, where,
                                     "initial_state data_file")
        elif initial.WhichOneof("state_data") != "zero_data":
            raise ConfigError(f"{where}: initial_state needs zero_data or data_file")
    if value is None:
        value = np.full(shape, b"", dtype=np.object_) if dtype == np.object_ else np.zeros(shape, dtype)
    value = value.reshape(batch + shape)
    value.setflags(write=False)  # shared by every sequence's first request
    return StateTensor(state.input_name, state.output_name, dtype, dims, value)
