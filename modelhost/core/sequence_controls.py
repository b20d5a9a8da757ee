"""A sequence request's parameters, and the control tensors the server fills for a sequence model.

Clients name a sequence with the request parameters `sequence_id` (a non-zero integer below 2**64 or a
non-empty string), `sequence_start` and `sequence_end` (booleans), as tritonclient sends them over HTTP and
gRPC. A model's `sequence_batching.control_input` entries name inputs the server fills for each request:
START and END (this request's flags), READY (the row holds a request: always true here, since batches are
formed of real requests only) and CORRID (the sequence's id in the control's data_type). Each is [1, 1] per
request for a batching model (the batch is [rows, 1]) and [1] for one without a batch dimension.
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


def refuse_sequence(model: str, parameters: Mapping[str, Any]) -> None:
    """INVALID_INPUT when a request to a model without a sequence batcher carries sequence parameters: running
    it statelessly would silently give wrong answers."""
    given = [name for name in SEQUENCE_PARAMETERS if name in parameters]
    if given:
        raise invalid(f"request parameter '{given[0]}' is for sequence models; model '{model}' has no "
                      "sequence_batching in its configuration")


def _flag(parameters: Mapping[str, Any], name: str) -> bool:
    value = parameters.get(name, False)
    if not isinstance(value, bool):
        raise invalid(f"request parameter '{name}' must be a boolean, got {value!r}")
    return value


class ControlTensors:
    """The control inputs of one model, read once from its config; `fill` adds them to a request's feeds."""

    def __init__(self, config: ModelConfig) -> None:
        self._batching = config.max_batch_size > 0
        self._shape = (1, 1) if self._batching else (1,)
        # (input name, kind, false array, true array) for START/END/READY; (name, dtype) for CORRID.
        self._flags: list[tuple[str, int, np.ndarray, np.ndarray]] = []
        self._corrid: tuple[str, np.dtype] | None = None
        for entry in config.sequence_batching.control_input:
            if len(entry.control) != 1:
                raise ConfigError(f"sequence_batching control_input '{entry.name}' must have exactly one control")
            self._add(entry.name, entry.control[0])
        self.names = frozenset(e.name for e in config.sequence_batching.control_input)

    def _add(self, name: str, control: Control) -> None:
        where = f"sequence_batching control_input '{name}'"
        if control.kind == Control.CONTROL_SEQUENCE_CORRID:
            if control.data_type not in _CORRID_TYPES:
                raise ConfigError(f"{where}: CONTROL_SEQUENCE_CORRID data_type must be TYPE_UINT64, TYPE_INT64, "
                                  f"TYPE_UINT32, TYPE_INT32 or TYPE_STRING, got {config_type_name(control.data_type)}")
            self._corrid = (name, DATATYPE_DTYPES[v2_datatype(control.data_type)])
            return
        false, true = _false_true(where, control)
        self._flags.append((name, control.kind, np.full(self._shape, false), np.full(self._shape, true)))

    def fill(self, feeds: dict[str, np.ndarray], flags: SequenceFlags) -> None:
        for name, kind, false, true in self._flags:
            on = (kind == Control.CONTROL_SEQUENCE_READY or (kind == Control.CONTROL_SEQUENCE_START and flags.start)
                  or (kind == Control.CONTROL_SEQUENCE_END and flags.end))
            feeds[name] = true if on else false
        if self._corrid is not None:
            feeds[self._corrid[0]] = self._corrid_tensor(flags.id)

    def check_id(self, sequence_id: int | str) -> None:
        """INVALID_INPUT when the id cannot be this model's CORRID: a string for a numeric CORRID, or a number
        outside its type."""
        if self._corrid is None or self._corrid[1] == np.object_:
            return
        dtype = self._corrid[1]
        if isinstance(sequence_id, str):
            raise invalid(f"sequence_id '{sequence_id}' is a string, but this model's CONTROL_SEQUENCE_CORRID is "
                          f"{dtype.name}: send an integer id")
        info = np.iinfo(dtype)
        if not info.min <= sequence_id <= info.max:
            raise invalid(f"sequence_id {sequence_id} does not fit this model's CONTROL_SEQUENCE_CORRID "
                          f"data type ({dtype.name})")

    def _corrid_tensor(self, sequence_id: int | str) -> np.ndarray:
        """The id as the CORRID input (check_id has passed it); a numeric id becomes its decimal text for a
        TYPE_STRING CORRID."""
        assert self._corrid is not None
        dtype = self._corrid[1]
        array = np.empty(self._shape, dtype)
        array[...] = str(sequence_id).encode() if dtype == np.object_ else sequence_id
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
