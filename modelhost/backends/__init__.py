"""Backend registry: names map to "module:Class" and are imported on first use,
so optional frameworks stay optional.

Besides the built-in backends, an installed distribution may register its own under the entry-point group
`modelhost.backends` (name = "module:Class", a `modelhost.plugin.Backend`); a model chooses it with
`backend: "<name>"` in its config.pbtxt, as Triton's custom backends are chosen. A plug-in cannot take a
built-in backend's name.
"""

from __future__ import annotations

import gc
import importlib
import importlib.metadata
import logging
import sys
import threading
from functools import cache

from modelhost.backends.base import Backend
from modelhost.config.mar_manifest import MAR_SUFFIX

ENTRY_POINT_GROUP = "modelhost.backends"

log = logging.getLogger("modelhost.backends")

_BACKENDS = {
    "onnxruntime": "modelhost.backends.onnx:OnnxBackend",
    "pytorch": "modelhost.backends.torch:TorchBackend",
    "tensorflow": "modelhost.backends.tensorflow:TensorflowBackend",
    "python": "modelhost.backends.python.backend:PythonBackend",
    "torchserve": "modelhost.backends.torchserve.backend:TorchServeBackend",
    "embedding": "modelhost.backends.embedding:EmbeddingBackend",
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
    "torchserve": "torchserve",
}
# Model file name in a version directory -> backend, for models with no config.
_FILENAMES = {
    "model.onnx": "onnxruntime",
    "model.pt": "pytorch",
    "model.savedmodel": "tensorflow",
    "saved_model.pb": "tensorflow",  # TF Serving's layout: the version directory is the SavedModel
    "model.py": "python",
    "MAR-INF": "torchserve",  # an unpacked TorchServe archive (torch-model-archiver's no-archive format)
    "table": "embedding",  # an embedding table (modelhost/embeddings/table_files.py)
}
_SUFFIXES = {
    MAR_SUFFIX: "torchserve",  # a TorchServe archive, whatever its name
}


class UnknownBackendError(LookupError):
    pass


@cache
def _plugins() -> dict[str, str]:
    """The backends installed distributions register (entry points of ENTRY_POINT_GROUP): name -> "module:Class"."""
    found: dict[str, str] = {}
    for entry in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        if entry.name in _BACKENDS:
            log.warning("backend plug-in '%s' (%s) ignored: '%s' is a built-in backend", entry.name, entry.value,
                        entry.name)
            continue
        found[entry.name] = entry.value
    return found


def _registered() -> dict[str, str]:
    return {**_plugins(), **_BACKENDS}


def backend_name(platform: str, backend: str) -> str:
    """Resolve config `platform`/`backend` to a registered backend name."""
    if backend:
        registered = _registered()
        if backend not in registered:
            raise UnknownBackendError(f"unknown backend '{backend}' (known: {', '.join(registered)})")
        return backend
    if platform not in _PLATFORMS:
        raise UnknownBackendError(f"unknown platform '{platform}' (known: {', '.join(_PLATFORMS)})")
    return _PLATFORMS[platform]


def backend_for_filename(filename: str) -> str | None:
    """The backend whose model file has this name (a model file of any name for suffixes like `.mar`)."""
    found = _FILENAMES.get(filename)
    if found is None and "." in filename:
        found = _SUFFIXES.get(filename[filename.rindex("."):])
    return found


class BackendUnavailableError(ImportError):
    """A registered backend whose framework is not installed."""


@cache
def get_backend(name: str) -> Backend:
    """The backend registered as `name`; raises BackendUnavailableError naming the extra to install."""
    module_name, _, class_name = _registered()[name].partition(":")
    first_import = module_name not in sys.modules
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        extra = _EXTRAS.get(name)
        hint = f": pip install 'modelhost[{extra}]'" if extra else ""
        raise BackendUnavailableError(f"backend '{name}' cannot be used ({exc}){hint}") from exc
    if first_import:
        freeze_long_lived()
    backend = getattr(module, class_name)()
    if not isinstance(backend, Backend):
        raise BackendUnavailableError(f"backend '{name}' ({_registered()[name]}) is not a modelhost.plugin.Backend")
    return backend


def freeze_long_lived() -> None:
    """Collect, then move every object alive now out of the cyclic GC's sight (gc.freeze): a framework's import
    leaves hundreds of thousands of long-lived objects (TensorFlow's: 310,000) that each full collection would
    walk again, 180 ms with TensorFlow, holding the GIL while requests wait. Run once per framework import and
    once the models of the server's start are loaded; what refcounting frees is freed as before."""
    gc.collect()
    gc.freeze()


_warm = threading.Lock()
_warmed: set[str] = set()


def backend_is_warm(name: str) -> bool:
    """Whether `warm_up_backend(name)` has run in this process (it then returns at once)."""
    return name in _warmed


def warm_up_backend(name: str) -> bool:
    """Import backend `name`'s framework and create its process-wide state, once per process (blocking);
    returns whether this call did it.

    The multi-model cache calls it before it measures a load, so that the first model of a framework is
    not charged for the framework (importing torch alone holds about 85 MB). Raises as get_backend does,
    the first time only: what failed once would fail again, and the model's load reports it.
    """
    with _warm:
        if name in _warmed:
            return False
        _warmed.add(name)
        get_backend(name).warm_up()
        return True
