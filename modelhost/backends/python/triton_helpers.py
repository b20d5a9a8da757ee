"""The helpers of modelhost's `triton_python_backend_utils` (triton_utils.py re-exports them): config lookups,
Triton's data type names and numbers, the BYTES wire form, and `Logger`. Numpy only (the worker imports it).
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

_log = logging.getLogger("modelhost.python_model")
_TYPES: dict[str, Any] = {
    "TYPE_BOOL": np.bool_, "TYPE_UINT8": np.uint8, "TYPE_UINT16": np.uint16, "TYPE_UINT32": np.uint32,
    "TYPE_UINT64": np.uint64, "TYPE_INT8": np.int8, "TYPE_INT16": np.int16, "TYPE_INT32": np.int32,
    "TYPE_INT64": np.int64, "TYPE_FP16": np.float16, "TYPE_FP32": np.float32, "TYPE_FP64": np.float64,
    "TYPE_STRING": np.object_,
}


def get_input_config_by_name(model_config: dict[str, Any], name: str) -> dict[str, Any] | None:
    return _config_of(model_config, "input", name)


def get_output_config_by_name(model_config: dict[str, Any], name: str) -> dict[str, Any] | None:
    return _config_of(model_config, "output", name)


def _config_of(model_config: dict[str, Any], kind: str, name: str) -> dict[str, Any] | None:
    return next((tensor for tensor in model_config.get(kind, ()) if tensor.get("name") == name), None)


def using_decoupled_model_transaction_policy(model_config: dict[str, Any]) -> bool:
    return bool(model_config.get("model_transaction_policy", {}).get("decoupled", False))


def triton_string_to_numpy(triton_type: str) -> Any:
    return _TYPES[triton_type]


def triton_to_numpy_type(data_type: int) -> Any:
    """From the numbers of Triton's DataType enum (TYPE_BOOL = 1 ... TYPE_STRING = 13)."""
    return list(_TYPES.values())[data_type - 1]


def numpy_to_triton_type(dtype: Any) -> int | None:
    for number, numpy_type in enumerate(_TYPES.values(), 1):
        if np.dtype(numpy_type) == np.dtype(dtype):
            return number
    return None


def serialize_byte_tensor(array: np.ndarray) -> np.ndarray:
    """Triton's wire form of a BYTES tensor: each element as a 4-byte little-endian length, then its bytes."""
    parts = []
    for item in array.reshape(-1):
        data = item if isinstance(item, bytes) else str(item).encode()
        parts += [len(data).to_bytes(4, "little"), data]
    return np.frombuffer(b"".join(parts), dtype=np.uint8)


def deserialize_bytes_tensor(data: bytes) -> np.ndarray:
    items = []
    offset = 0
    while offset < len(data):
        length = int.from_bytes(data[offset:offset + 4], "little")
        items.append(data[offset + 4:offset + 4 + length])
        offset += 4 + length
    return np.array(items, dtype=np.object_)


class TritonModelException(Exception):
    """What a model raises to fail its own load or request (Triton's name for it), and what pb_utils raises at a
    misuse the model may catch (a metric's wrong operation)."""


class Logger:
    """Triton's pb_utils.Logger: the model's messages go to the server's log."""

    INFO, WARNING, ERROR, VERBOSE = range(4)
    _LEVELS = {INFO: logging.INFO, WARNING: logging.WARNING, ERROR: logging.ERROR, VERBOSE: logging.DEBUG}

    @classmethod
    def log(cls, message: str, level: int = 0) -> None:
        _log.log(cls._LEVELS.get(level, logging.INFO), "%s", message)

    @classmethod
    def log_info(cls, message: str) -> None:
        _log.info("%s", message)

    @classmethod
    def log_warn(cls, message: str) -> None:
        _log.warning("%s", message)

    @classmethod
    def log_error(cls, message: str) -> None:
        _log.error("%s", message)

    @classmethod
    def log_verbose(cls, message: str) -> None:
        _log.debug("%s", message)
