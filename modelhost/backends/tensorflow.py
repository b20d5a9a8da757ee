"""TensorFlow SavedModel backend on CPU: one `tf.saved_model.load` per model version, whose instances share it
(`TensorflowModel.sibling`), run through one signature.

Layout: `<version>/model.savedmodel/` holding `saved_model.pb` and `variables/`, as `tf.saved_model.save` (TF2)
or `SavedModelBuilder` (TF1) writes it. Config `parameters` use Triton's names:
TF_SIGNATURE_DEF picks the signature (default `serving_default`, as in TF Serving and Triton), TF_GRAPH_TAG the
MetaGraph (default `serve`). The signature's input and output keys are the tensor names; dtypes map to V2
names (tf.string <-> BYTES, object arrays of bytes) and unknown dims read as -1.

Threads: TensorFlow has one intra-op and one inter-op pool per process, shared by every TF model and
instance, and fixed once its runtime starts. So the first load sizes them, before loading:
intra = TF_NUM_INTRA_THREADS (or intra_op_thread_count, which SAGEMAKER_TFS_INTRA_OP_PARALLELISM sets),
else the threads the core gives all that model's instances together (about the server's CPU count, as the
pool is shared); inter = TF_NUM_INTER_THREADS (or inter_op_thread_count), else TF's default. A later model
whose config asks for other sizes gets a warning in the log and TF's pools as they are. `warm_up` is not
overridden: running anything in TF would fix the pools before a config could size them.

Importing TensorFlow logs INFO and WARNING lines from C++: TF_CPP_MIN_LOG_LEVEL is set to 2 (errors only)
here unless the environment already sets it. (TF 2.21 still prints one oneDNN notice before its log starts.)
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from tensorflow.core.protobuf import saved_model_pb2  # noqa: E402

from modelhost.backends.base import Backend, InstanceSettings, Model, ModelSignature  # noqa: E402
from modelhost.config.model_config_pb2 import ModelConfig  # noqa: E402
from modelhost.config.overrides import INTER_OP_PARAMETERS, INTRA_OP_PARAMETERS  # noqa: E402
from modelhost.config.parameters import natural_parameter, string_parameters
from modelhost.config.pbtxt import ConfigError  # noqa: E402
from modelhost.errors import ErrorKind, ModelhostError  # noqa: E402
from modelhost.types import TensorSpec  # noqa: E402

DEFAULT_SIGNATURE = "serving_default"
DEFAULT_TAG = "serve"
SIGNATURE_PARAMETER = "TF_SIGNATURE_DEF"
GRAPH_TAG_PARAMETER = "TF_GRAPH_TAG"
INTRA_PARAMETERS = ("TF_NUM_INTRA_THREADS", *INTRA_OP_PARAMETERS)
INTER_PARAMETERS = ("TF_NUM_INTER_THREADS", *INTER_OP_PARAMETERS)

_TF_TYPES = {
    tf.bool: "BOOL",
    tf.uint8: "UINT8",
    tf.uint16: "UINT16",
    tf.uint32: "UINT32",
    tf.uint64: "UINT64",
    tf.int8: "INT8",
    tf.int16: "INT16",
    tf.int32: "INT32",
    tf.int64: "INT64",
    tf.float16: "FP16",
    tf.float32: "FP32",
    tf.float64: "FP64",
    tf.string: "BYTES",
}

log = logging.getLogger("modelhost.backends")
# TensorFlow logs each SavedModel load at INFO through absl ("Fingerprint not found..."): only its warnings.
logging.getLogger("absl").setLevel(logging.WARNING)
# The pools are process-wide: the first load sizes them, under this lock (the manager loads models in threads).
_pools_lock = threading.Lock()
_pools_sized = False


SAVED_MODEL_FILE = "saved_model.pb"


class TensorflowBackend(Backend):
    name = "tensorflow"
    platform = "tensorflow_savedmodel"
    default_filename = "model.savedmodel"

    def model_path(self, version_dir: Path, filename: str) -> Path:
        """Triton's `<version>/model.savedmodel/`, or TF Serving's layout: the version directory itself is
        the SavedModel (`<version>/saved_model.pb`), so a TF Serving model directory serves as it is."""
        path = version_dir / filename
        if not path.exists() and (version_dir / SAVED_MODEL_FILE).is_file():
            return version_dir
        return path

    def describe(
        self, path: Path, signature_name: str = DEFAULT_SIGNATURE, tag: str = DEFAULT_TAG
    ) -> ModelSignature:
        """The named signature's inputs and outputs (loads the SavedModel once to read them)."""
        loaded = _load_saved_model(path, tag)
        function = _signature_function(loaded, signature_name, path)
        return _model_signature(function, signature_name, path, _methods(path, tag).get(signature_name, ""))

    def load(self, path: Path, config: ModelConfig, instance: InstanceSettings) -> Model:
        params = string_parameters(config)
        instances = max(1, sum(group.count for group in config.instance_group))
        _size_thread_pools(params, instance.threads * instances, path)
        tag = params.get(GRAPH_TAG_PARAMETER) or DEFAULT_TAG
        loaded = _load_saved_model(path, tag)
        signature_name = params.get(SIGNATURE_PARAMETER) or DEFAULT_SIGNATURE
        served = _signature_function(loaded, signature_name, path)
        methods = _methods(path, tag)
        functions = {signature_name: served}
        signatures = {signature_name: _model_signature(served, signature_name, path, methods.get(signature_name, ""))}
        for name in loaded.signatures:
            if name == signature_name:
                continue
            try:  # another signature is served by name where modelhost can serve its tensors
                signatures[name] = _model_signature(loaded.signatures[name], name, path, methods.get(name, ""))
            except ConfigError as exc:
                log.info("%s: signature '%s' is not served: %s", path, name, exc)
                continue
            functions[name] = loaded.signatures[name]
        return TensorflowModel(loaded, functions, signatures, signature_name)


class TensorflowModel(Model):
    """One loaded SavedModel; `infer` calls the served signature's function with the inputs as keyword tensors,
    `infer_signature` any other of its signatures."""

    def __init__(self, loaded: Any, functions: dict[str, Any], signatures: dict[str, ModelSignature],
                 served: str) -> None:
        # `loaded` owns the variables the signature functions read: keep it alive as long as they are.
        self._loaded: Any = loaded
        self._functions: dict[str, Any] | None = functions
        self._signatures = signatures
        self._served = served

    def infer(self, inputs: dict[str, np.ndarray], outputs: Sequence[str]) -> dict[str, np.ndarray]:
        return self.infer_signature(self._served, inputs, outputs)

    def infer_signature(
        self, signature: str, inputs: dict[str, np.ndarray], outputs: Sequence[str]
    ) -> dict[str, np.ndarray]:
        assert self._functions is not None, "instance used after unload"
        feeds = {name: _to_tensor(name, array) for name, array in inputs.items()}
        try:
            results = self._functions[signature](**feeds)
        except TypeError as exc:  # the inputs do not bind to the signature (a missing or unknown name)
            raise ModelhostError(ErrorKind.INVALID_INPUT, f"tensorflow: {exc}") from exc
        except tf.errors.InvalidArgumentError as exc:
            raise ModelhostError(ErrorKind.INVALID_INPUT, f"tensorflow: {_op_message(exc)}") from exc
        return {name: _to_numpy(results[name]) for name in outputs}

    def signature(self) -> ModelSignature | None:
        return self._signatures[self._served] if self._functions is not None else None

    def signature_name(self) -> str:
        return self._served

    def signatures(self) -> dict[str, ModelSignature]:
        return {name: signature for name, signature in self._signatures.items() if name != self._served}

    def sibling(self, instance: InstanceSettings) -> TensorflowModel | None:
        """Instances share one loaded SavedModel: its functions may run at once on several threads, as TF Serving's
        batch threads share one session, and a copy per instance would hold the weights once more each."""
        if self._functions is None:
            return None
        return TensorflowModel(self._loaded, self._functions, self._signatures, self._served)

    def unload(self) -> None:
        self._functions = None
        self._loaded = None


def _load_saved_model(path: Path, tag: str) -> Any:
    if not tf.saved_model.contains_saved_model(str(path)):
        raise ConfigError(f"{path} is not a SavedModel directory (it has no saved_model.pb)")
    try:
        return tf.saved_model.load(str(path), tags=[tag])
    except Exception as exc:  # TF raises OSError, RuntimeError, ValueError... for a model it cannot load
        raise ConfigError(f"cannot load SavedModel {path} (tag '{tag}'): {exc}") from exc


def _signature_function(loaded: Any, name: str, path: Path) -> Any:
    signatures = loaded.signatures
    if name not in signatures:
        have = ", ".join(sorted(signatures)) or "none"
        raise ConfigError(
            f"SavedModel {path} has no signature '{name}' (its signatures: {have}); "
            f"parameter {SIGNATURE_PARAMETER} names the one to serve"
        )
    return signatures[name]


def _methods(path: Path, tag: str) -> dict[str, str]:
    """Each signature's method_name ("tensorflow/serving/predict", ...), from the MetaGraphDef of `tag`: what TF
    Serving's classify and regress check, and its metadata shows; the loaded functions do not keep it."""
    saved_model = saved_model_pb2.SavedModel()
    saved_model.ParseFromString((path / SAVED_MODEL_FILE).read_bytes())
    for meta_graph in saved_model.meta_graphs:
        if tag in meta_graph.meta_info_def.tags:
            return {name: definition.method_name for name, definition in meta_graph.signature_def.items()}
    return {}


def _model_signature(function: Any, signature_name: str, path: Path, method: str) -> ModelSignature:
    _, keyword_specs = function.structured_input_signature
    where = f"SavedModel {path} signature '{signature_name}'"
    # A SignatureDef's inputs and outputs are protobuf maps, whose order differs between loads: sort by name.
    return ModelSignature(
        inputs=tuple(_spec(name, keyword_specs[name], f"{where} input") for name in sorted(keyword_specs)),
        outputs=tuple(
            _spec(name, function.structured_outputs[name], f"{where} output")
            for name in sorted(function.structured_outputs)
        ),
        method=method,
    )


def _spec(name: str, tensor: Any, where: str) -> TensorSpec:
    """A V2 spec from a tf.TensorSpec (TF2 signatures) or a symbolic tf.Tensor (TF1 outputs)."""
    datatype = _TF_TYPES.get(tensor.dtype)
    if datatype is None:
        raise ConfigError(f"{where} '{name}' has dtype {tensor.dtype.name}, which modelhost does not serve")
    if tensor.shape.rank is None:
        raise ConfigError(f"{where} '{name}' has unknown rank; modelhost needs a shape (-1 dims are fine)")
    return TensorSpec(name, datatype, tuple(-1 if d is None else d for d in tensor.shape.as_list()))


def _size_thread_pools(params: Mapping[str, str], default_intra: int, path: Path) -> None:
    """Size TF's process-wide pools at the first load; a later load that asks for other sizes gets a warning."""
    global _pools_sized
    intra = natural_parameter(params, INTRA_PARAMETERS, None)
    inter = natural_parameter(params, INTER_PARAMETERS, None)
    with _pools_lock:
        first = not _pools_sized
        _pools_sized = True
        if first and _set_pools(default_intra if intra is None else intra, inter):
            return
    current_intra = tf.config.threading.get_intra_op_parallelism_threads()
    current_inter = tf.config.threading.get_inter_op_parallelism_threads()
    if first or intra not in (None, current_intra) or inter not in (None, current_inter):
        log.warning(
            "%s: TensorFlow's thread pools are process-wide and already sized (intra-op %d, inter-op %d, 0 = TF's "
            "default); the config's thread parameters do not change them", path, current_intra, current_inter,
        )


def _set_pools(intra: int, inter: int | None) -> bool:
    """False when TF's runtime already started (something in this process ran TF before any TF model loaded)."""
    try:
        tf.config.threading.set_intra_op_parallelism_threads(intra)
        if inter is not None:
            tf.config.threading.set_inter_op_parallelism_threads(inter)
    except RuntimeError:
        return False
    return True


def _to_tensor(name: str, array: np.ndarray) -> Any:
    if array.dtype != np.object_ and array.dtype.kind not in "SU":
        return tf.convert_to_tensor(array)
    try:
        return tf.constant(array, dtype=tf.string)
    except (TypeError, ValueError) as exc:
        raise ModelhostError(ErrorKind.INVALID_INPUT, f"input '{name}': tensorflow needs bytes or str: {exc}") from exc


def _to_numpy(tensor: Any) -> np.ndarray:
    value = tensor.numpy()
    if tensor.dtype == tf.string:
        # .numpy() gives an object array of bytes, or bare bytes for a scalar.
        return value if isinstance(value, np.ndarray) else np.array(value, dtype=object)
    return np.asarray(value)


def _op_message(exc: Any) -> str:
    """The error itself, without TF's "Graph execution error" and node-trace preamble."""
    lines = [line.strip() for line in str(exc.message).splitlines()]
    noise = ("Graph execution error:", "Detected at node", "<stack traces unavailable>", "[[")
    kept = [line for line in lines if line and not line.startswith(noise)]
    return "; ".join(kept) or str(exc)
