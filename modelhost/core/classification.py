"""Triton's classification extension: a requested output answered as its top classes instead of its data.

A request asks for it per output with the parameter `classification` = n. The output then answers as BYTES of
shape [batch, k] for a model that batches ([k] for one that does not), k = min(n, the elements of one batch
row), each element "<value>:<index>" or "<value>:<index>:<label>", highest value first. Values print as
Triton prints them (C++ std::to_string: integers as they are, floats with six decimals); ties keep index
order; NaN ranks last. n = 0 leaves the output as it is, as in Triton.

Labels come from the output's `label_filename` in config.pbtxt, a file in the model's directory (next to
config.pbtxt, not in a version directory), one label per line for index 0, 1, ...; read once at load, and a
missing file fails the load. An index with no line (or an empty one) answers without a label.

Called by ServedModel only for a request that asks (`class_counts` is None otherwise): no cost for others.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from modelhost.config.model_config_pb2 import ModelConfig
from modelhost.config.pbtxt import ConfigError
from modelhost.errors import client_value, invalid
from modelhost.store.paths import inside
from modelhost.types import RequestedOutput

PARAMETER = "classification"
# Class strings one output may make (batch rows x classes): a request cannot make the server build more
# Python strings than this however large the output; 1000 classes for a batch of 1000 fit.
MAX_CLASS_RESULTS = 1 << 20
# Output datatypes whose values rank (Triton's: the fixed-size numbers but FP16, BF16 and BOOL).
RANKED = frozenset({"UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64", "FP32", "FP64"})

Labels = Mapping[str, tuple[bytes, ...]]


def read_labels(config: ModelConfig, model_dir: Path) -> dict[str, tuple[bytes, ...]]:
    """Each output's labels by output name, for the outputs whose config names a `label_filename`.
    Blocking (reads files); the loader calls it once per version it loads."""
    labels: dict[str, tuple[bytes, ...]] = {}
    for output in config.output:
        if not output.label_filename:
            continue
        what = f"model '{config.name}': output '{output.name}': label_filename"
        path = inside(model_dir, output.label_filename, what)  # never outside the model's directory
        try:
            labels[output.name] = tuple(path.read_bytes().splitlines())
        except OSError as exc:
            raise ConfigError(f"{what} '{output.label_filename}' cannot be read from the model's directory: "
                              f"{exc.strerror or exc}") from None
    return labels


def class_counts(outputs: Sequence[RequestedOutput]) -> dict[str, int] | None:
    """The class count each requested output asks for (None when none asks); INVALID_INPUT for a count that
    is not a non-negative integer."""
    counts: dict[str, int] | None = None
    for output in outputs:
        if PARAMETER not in output.parameters:
            continue
        count = output.parameters[PARAMETER]
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            raise invalid(f"output '{output.name}': parameter '{PARAMETER}' must be a non-negative integer (the "
                          f"number of classes to return), got {client_value(count)}")
        if count:
            counts = counts or {}
            counts[output.name] = count
    return counts


def check_classifiable(counts: Mapping[str, int], datatypes: Mapping[str, str]) -> None:
    """INVALID_INPUT, before the model runs, for an output whose datatype does not rank."""
    for name in counts:
        datatype = datatypes.get(name)
        if datatype is not None and datatype not in RANKED:
            raise invalid(f"output '{name}': classification is not available for datatype {datatype}; it ranks "
                          f"{', '.join(sorted(RANKED))}")


def classify(name: str, array: np.ndarray, count: int, labels: tuple[bytes, ...], batched: bool) -> np.ndarray:
    """The top `count` classes of each batch row of `array` (of the whole array when not `batched`)."""
    rows = array.reshape(array.shape[0] if batched and array.ndim else 1, -1)
    k = min(count, rows.shape[1])
    if rows.shape[0] * k > MAX_CLASS_RESULTS:
        raise invalid(f"output '{name}': {rows.shape[0]} rows of {k} classes is more than the "
                      f"{MAX_CLASS_RESULTS} class results an output may return; ask for fewer classes")
    top = _top(rows, k)
    text = _float_text if rows.dtype.kind == "f" else _integer_text
    result = np.empty((rows.shape[0], k), dtype=object)
    for row in range(rows.shape[0]):
        values = rows[row]
        for column, index in enumerate(top[row].tolist()):
            entry = b"%s:%d" % (text(values[index]), index)
            label = labels[index] if index < len(labels) else b""
            result[row, column] = entry + b":" + label if label else entry
    return result if batched and array.ndim else result.reshape(k)


def _top(rows: np.ndarray, k: int) -> np.ndarray:
    """Each row's `k` indexes of the highest values, highest first, equal values in index order, NaN last."""
    # Ascending keys: -x reverses floats (NaN stays NaN, which numpy sorts last), ~x every integer type.
    keys = -rows if rows.dtype.kind == "f" else ~rows
    if k >= keys.shape[1] or k == 0:
        return np.argsort(keys, axis=1, kind="stable")[:, :k]
    # Partition finds each row's k-th key; only the keys up to it (ties included) are sorted, in index order.
    kth = np.partition(keys, k - 1, axis=1)[:, k - 1]
    top = np.empty((keys.shape[0], k), dtype=np.intp)
    for row, (values, bound) in enumerate(zip(keys, kth)):
        chosen = np.arange(values.shape[0]) if bound != bound else np.flatnonzero(values <= bound)  # NaN bound
        top[row] = chosen[np.argsort(values[chosen], kind="stable")[:k]]
    return top


def _float_text(value: np.floating) -> bytes:
    return b"%f" % float(value)


def _integer_text(value: np.integer) -> bytes:
    return b"%d" % int(value)


def classified(outputs: dict[str, np.ndarray], counts: Mapping[str, int], labels: Labels,
               batched: bool) -> dict[str, np.ndarray]:
    """`outputs` with each output `counts` names replaced by its classes."""
    return {name: classify(name, array, counts[name], labels.get(name, ()), batched) if name in counts else array
            for name, array in outputs.items()}
