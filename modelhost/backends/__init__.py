"""Backend registry: names map to "module:Class" and are imported on first use,
so optional frameworks stay optional."""

from __future__ import annotations

import importlib
from functools import cache

from modelhost.backends.base import Backend

_BACKENDS = {
    "onnxruntime": "modelhost.backends.onnx:OnnxBackend",
    "pytorch": "modelhost.backends.torch:TorchBackend",
    "tensorflow": "modelhost.backends.tensorflow:TensorflowBackend",
    "python": "modelhost.backends.python:PythonBackend",
}
_PLATFORMS = {
    "onnxruntime_onnx": "onnxruntime",
    "pytorch_libtorch": "pytorch",
    "tensorflow_savedmodel": "tensorflow",
}
# The optional extra that installs a backend's framework, for the error when it is missing.
_EXTRAS = {
    "pytorch": "torch",
    "tensorflow": "tensorflow",
}
# Model file name in a version directory -> backend, for models with no config.
_FILENAMES = {
    "model.onnx": "onnxruntime",
    "model.pt": "pytorch",
    "model.savedmodel": "tensorflow",
    "saved_model.pb": "tensorflow",  # TF Serving's layout: the version directory is the SavedModel
    "model.py": "python",
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


class BackendUnavailableError(ImportError):
    """A registered backend whose framework is not installed."""


@cache
def get_backend(name: str) -> Backend:
    """The backend registered as `name`; raises BackendUnavailableError naming the extra to install."""
    module_name, _, class_name = _BACKENDS[name].partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        extra = _EXTRAS.get(name)
        hint = f": pip install 'modelhost[{extra}]'" if extra else ""
        raise BackendUnavailableError(f"backend '{name}' cannot be used ({exc}){hint}") from exc
    backend: Backend = getattr(module, class_name)()
    return backend


# Backends warmed up before a multi-model endpoint's first load. torch and tensorflow are left out: importing
# either costs seconds and hundreds of MiB, which only an endpoint that serves such models should pay.
_WARM_UP = ("onnxruntime",)


def warm_up_backends() -> None:
    """Warm up the backends every endpoint is likely to use (blocking)."""
    for name in _WARM_UP:
        try:
            backend = get_backend(name)
        except ImportError:
            continue
        backend.warm_up()
