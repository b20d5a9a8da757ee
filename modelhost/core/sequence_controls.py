"""A sequence request's parameters, and the control tensors the server fills for a sequence model.

Clients name a sequence with the request parameters `sequence_id` (a non-zero integer below 2**64 or a
non-empty string), `sequence_start` and `sequence_end` (booleans), as tritonclient sends them over HTTP and
gRPC. A model's `sequence_batching.control_input` entries name inputs the server fills for each request:
START and END (this request's flags), READY (the row holds a request: true, but for the padding rows of a
`direct` model's batches, core/sequence_slots.py, whose controls are all false and CORRID 0 or "") and CORRID
(the sequence's id in the control's data_type). Each is [1, 1] per request for a batching model (the batch is
[rows, 1]) and [1] for one without a batch dimension.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from modelhost.config.datatypes import config_type_name, v2_datatype
from modelhost.config.model_config_pb2 import DataType, ModelConfig, ModelSequenceBatching
from modelhost.config.pbtxt import ConfigError
from modelhost.errors import invalid
from modelhost.types import DATATYPE_DTYPES

SEQUENCE_PARAMETERS = ("sequence_id", "sequence_start", "sequence_end")
MAX_STRING_ID_BYTES = 256  # a string id is kept per live sequence and copied into every CORRID tensor
_UINT64_LIMIT = 2**64
Control = ModelSequenceBatching.Control


@dataclass(frozen=True, slots=True)
class SequenceFlags:
    """One request's place in its sequence."""

    id: int | str
    start: bool
    end: bool


def sequence_flags(parameters: Mapping[str, Any]) -> SequenceFlags | None:
    """The request's sequence parameters; None when it has none. INVALID_INPUT when one has the wrong type."""
    if not any(name in parameters for name in SEQUENCE_PARAMETERS):
        return None
    value = parameters.get("sequence_id", 0)
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise invalid(f"request parameter 'sequence_id' must be an integer or a string, got {value!r}")
    if isinstance(value, int) and not 0 <= value < _UINT64_LIMIT:
        raise invalid(f"request parameter 'sequence_id' must be between 0 and 2**64-1, got {value}")
    if isinstance(value, str) and len(value.encode()) > MAX_STRING_ID_BYTES:
        raise invalid(f"request parameter 'sequence_id' is a string of more than {MAX_STRING_ID_BYTES} bytes")
    return SequenceFlags(value, _flag(parameters, "sequence_start"), _flag(parameters, "sequence_end"))


def refuse_sequence(model: str, parameters: Mapping[str, Any], kind: str = "model",
                    lacks: str = "has no sequence_batching in its configuration") -> None:
    """INVALID_INPUT when a request to a model without a sequence batcher (an ensemble without a sequence step)
    carries sequence parameters: running it statelessly would silently give wrong answers."""
    given = [name for name in SEQUENCE_PARAMETERS if name in parameters]
    if given:
        raise invalid(f"request parameter '{given[0]}' is for sequence models; {kind} '{model}' {lacks}")


def _flag(parameters: Mapping[str, Any], name: str) -> bool:
    value = parameters.get(name, False)
    if not isinstance(value, bool):
        raise invalid(f"request parameter '{name}' must be a boolean, got {value!r}")
    return value


class ControlTensors:
    """The control inputs of one model, read once from its config; `fill` adds them to a request's feeds.

    The tensors are shared between requests (a sequence's CORRID between its requests), so they are read-only.
    """

    def __init__(self, config: ModelConfig) -> None:
        self._shape = (1, 1) if config.max_batch_size > 0 else (1,)
        self._ready: dict[str, np.ndarray] = {}
        # (input name, false tensor, true tensor) of the START and of the END controls
        self._start: list[tuple[str, np.ndarray, np.ndarray]] = []
        self._end: list[tuple[str, np.ndarray, np.ndarray]] = []
        self._corrid: tuple[str, np.dtype] | None = None
        self.not_ready: dict[str, np.ndarray] = {}  # a padding row's controls (core/sequence_slots.py)
        for entry in config.sequence_batching.control_input:
            if len(entry.control) != 1:
                raise ConfigError(f"sequence_batching control_input '{entry.name}' must have exactly one control")
            self._add(entry.name, entry.control[0])
        self._bounds = (0, 0)
        if self._corrid is not None and self._corrid[1] != np.object_:
            info = np.iinfo(self._corrid[1])
            self._bounds = (int(info.min), int(info.max))

    def _add(self, name: str, control: Control) -> None:
        where = f"sequence_batching control_input '{name}'"
        if control.kind == Control.CONTROL_SEQUENCE_CORRID:
            if control.data_type not in _CORRID_TYPES:
                raise ConfigError(f"{where}: CONTROL_SEQUENCE_CORRID data_type must be TYPE_UINT64, TYPE_INT64, "
                                  f"TYPE_UINT32, TYPE_INT32 or TYPE_STRING, got {config_type_name(control.data_type)}")
            self._corrid = (name, DATATYPE_DTYPES[v2_datatype(control.data_type)])
            zero = b"" if self._corrid[1] == np.object_ else 0
            self.not_ready[name] = _read_only(np.full(self._shape, zero, self._corrid[1]))
            return
        false, true = (_read_only(np.full(self._shape, value)) for value in _false_true(where, control))
        self.not_ready[name] = false
        if control.kind == Control.CONTROL_SEQUENCE_READY:
            self._ready[name] = true
        else:
            (self._start if control.kind == Control.CONTROL_SEQUENCE_START else self._end).append((name, false, true))

    def fill(self, feeds: dict[str, np.ndarray], flags: SequenceFlags, corrid: dict[str, np.ndarray]) -> None:
        """Add the controls of one request; `corrid` is what `corrid` gave for its sequence."""
        feeds.update(self._ready)
        for name, false, true in self._start:
            feeds[name] = true if flags.start else false
        for name, false, true in self._end:
            feeds[name] = true if flags.end else false
        feeds.update(corrid)

    def corrid(self, sequence_id: int | str) -> dict[str, np.ndarray]:
        """The CORRID input of a sequence ({} when the model has none); a numeric id becomes its decimal text for
        a TYPE_STRING CORRID. INVALID_INPUT when the id cannot be the model's CORRID: a string for a numeric
        one, or a number outside its type."""
        if self._corrid is None:
            return {}
        name, dtype = self._corrid
        if dtype != np.object_:
            if isinstance(sequence_id, str):
                raise invalid(f"sequence_id '{sequence_id}' is a string, but this model's CONTROL_SEQUENCE_CORRID "
                              f"is {dtype.name}: send an integer id")
            if not self._bounds[0] <= sequence_id <= self._bounds[1]:
                raise invalid(f"sequence_id {sequence_id} does not fit this model's CONTROL_SEQUENCE_CORRID "
                              f"data type ({dtype.name})")
        array = np.empty(self._shape, dtype)
        array[...] = str(sequence_id).encode() if dtype == np.object_ else sequence_id
        return {name: _read_only(array)}


def _read_only(array: np.ndarray) -> np.ndarray:
    array.setflags(write=False)
    return array


_CORRID_TYPES = (DataType.TYPE_UINT64, DataType.TYPE_INT64, DataType.TYPE_UINT32, DataType.TYPE_INT32,
                 DataType.TYPE_STRING)


def _false_true(where: str, control: Control) -> tuple[Any, Any]:
    """The control's (false, true) values in its type: int32, fp32 or bool, whichever pair the config gives."""
    pairs: list[tuple[list[Any], type]] = [(list(control.int32_false_true), np.int32),
                                           (list(control.fp32_false_true), np.float32),
                                           (list(control.bool_false_true), np.bool_)]
    given = [(values, dtype) for values, dtype in pairs if values]
    if len(given) != 1 or len(given[0][0]) != 2:
        raise ConfigError(f"{where}: give exactly one of int32_false_true, fp32_false_true or bool_false_true, "
                          "with two values")
    values, dtype = given[0]
    return dtype(values[0]), dtype(values[1])
