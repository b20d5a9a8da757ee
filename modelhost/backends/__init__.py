"""Backend registry: names map to "module:Class" and are imported on first use,
so optional frameworks stay optional."""

from __future__ import annotations

import importlib
from functools import cache

from modelhost.backends.base import Backend

_BACKENDS = {
    "onnxruntime": "modelhost.backends.onnx:OnnxBackend",
}
_PLATFORMS = {
    "onnxruntime_onnx": "onnxruntime",
}
# Model file name in a version directory -> backend, for models with no config.
_FILENAMES = {
    "model.onnx": "onnxruntime",
}


class UnknownBackendError(LookupError):
    pass


def backend_name(platform: str, backend: str) -> str:
    """Resolve config `platform`/`backend` to a registered backend name."""
    if backend:
        if backend not in _BACKENDS:
            raise UnknownBackendError(f"unknown backend '{backend}' (known: {', '.join(_BACKENDS)})")
        return backend
    if platform not in _PLATFORMS:
        raise UnknownBackendError(f"unknown platform '{platform}' (known: {', '.join(_PLATFORMS)})")
    return _PLATFORMS[platform]


def backend_for_filename(filename: str) -> str | None:
    return _FILENAMES.get(filename)


@cache
def get_backend(name: str) -> Backend:
    module_name, _, class_name = _BACKENDS[name].partition(":")
    backend: Backend = getattr(importlib.import_module(module_name), class_name)()
    return backend


def warm_up_backends() -> None:
    """Warm up every registered backend whose framework is installed (blocking)."""
    for name in _BACKENDS:
        try:
            backend = get_backend(name)
        except ImportError:
            continue
        backend.warm_up()
