"""Python backend: a model written in Python, as a `model.py` in the version directory.

model.py defines `class Model` (constructed with no arguments) with:

- `initialize(self, args: dict) -> None`, optional, called once per instance at load, where args is
  {"model_config": the completed config as JSON (config_to_json), "model_name": str,
  "model_version": str, "model_instance_index": int, "model_directory": str (the model's directory)};
- `execute(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]`, required, called with one batch
  (first dim of every input and output is the batch when max_batch_size > 0; the scheduler batches,
  execute just runs what it is given). It returns at least the requested outputs, each with the config's
  dtype and shape; anything else is an error naming the model and the output (nothing is cast). Inputs
  may be read-only views of the request: copy one before changing it in place;
- `finalize(self) -> None`, optional, called once at unload.

A Python file declares no tensors, so config.pbtxt must list every input and output (or a Triton model's
auto_complete_config adds them: `configure`, triton_completion.py); the model's signature is the config's.
model.py is imported under a module name of its own per model, version, instance and load, with its version
directory on sys.path only while it is imported (so model.py imports the modules beside it at its top).
A model.py that fails to import, or whose Model() or initialize raises, fails the load with a
ConfigError carrying the traceback's last line (the whole traceback goes to the log).

By default the model runs in the server's process. With parameter `isolation: "process"` each instance runs
in a worker process of its own (backends/python/isolated.py): a crash, a hang or a leak there cannot take the server
down. Parameters: see docs/backends/python.md.
"""

from __future__ import annotations

import itertools
import logging
import re
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from modelhost.backends.base import Backend, InstanceSettings, Model, ModelSignature, config_signature
from modelhost.backends.python.isolated import IsolatedModel
from modelhost.backends.python.triton_completion import complete_from_model
from modelhost.backends.python.triton_isolated import IsolatedTritonModel
from modelhost.backends.python.triton_model import TritonUserModel, identity
from modelhost.backends.python.user_model import (
    ExecuteError,
    OutputRule,
    UserCodeError,
    UserCodeSpec,
    UserModel,
    load_user_model,
)
from modelhost.backends.python.worker_process import IsolationOptions, WorkerProcess
from modelhost.client_log import client_log
from modelhost.config.datatypes import v2_datatype
from modelhost.config.model_config_pb2 import ModelConfig
from modelhost.config.overrides import ModelOverrides
from modelhost.config.pbtxt import CONFIG_FILENAME, ConfigError, config_to_json
from modelhost.errors import ErrorKind, ModelhostError

log = logging.getLogger("modelhost.backends.python.backend")

ISOLATION_PARAMETER = "isolation"
ISOLATIONS = ("none", "process")
EXECUTE_TIMEOUT_PARAMETER = "execute_timeout_seconds"
INITIALIZE_TIMEOUT_PARAMETER = "initialize_timeout_seconds"
MAX_RSS_PARAMETER = "worker_max_rss_bytes"
_loads = itertools.count()  # tells apart the modules of successive loads of the same instance


class PythonBackend(Backend):
    name = "python"
    platform = ""  # as Triton: a Python model names its backend, not a platform
    default_filename = "model.py"

    def code_in(self, filename: str) -> str | None:
        return f"{filename} (the Python backend imports it)"

    def describe(self, path: Path) -> ModelSignature:
        raise ConfigError(_no_tensors(path))

    def configure(self, path: Path, config: ModelConfig, overrides: ModelOverrides) -> None:
        """Triton's auto-complete: a TritonPythonModel's auto_complete_config completes `config` (model loading
        calls this once the code policy let the model's code run); in its worker when the model is isolated."""
        complete_from_model(path, config, *read_options(config))

    def load(self, path: Path, config: ModelConfig, instance: InstanceSettings) -> Model:
        isolated, options = read_options(config)
        if not path.is_file():
            raise ConfigError(f"{path} is not a file: the Python backend loads a model.py")
        if not config.input or not config.output:
            raise ConfigError(_no_tensors(path))
        signature = config_signature(config, CONFIG_FILENAME)
        spec = _spec(path, config, instance.index, signature)
        try:
            if isolated:
                worker = WorkerProcess(spec, options)  # what it loaded decides how its batches are sent
                isolated_class = IsolatedTritonModel if worker.kind == "triton" else IsolatedModel
                return isolated_class(spec, options, signature, worker=worker)
            user = load_user_model(spec)
            if isinstance(user, TritonUserModel):
                return TritonModel(user, signature)
            return InProcessModel(user, signature)
        except UserCodeError as exc:
            if exc.details:
                log.error("%s\n%s", exc.message, exc.details)
            raise ConfigError(exc.message) from None


class InProcessModel(Model):
    """A Python model instance whose code runs in the server's own process (and can take it down)."""

    def __init__(self, user: UserModel | TritonUserModel, signature: ModelSignature) -> None:
        self._user: UserModel | TritonUserModel | None = user
        self._signature = signature

    def infer(self, inputs: dict[str, np.ndarray], outputs: Sequence[str]) -> dict[str, np.ndarray]:
        assert self._user is not None, "instance used after unload"
        with _logged():
            return self._user.execute(inputs, list(outputs))

    def signature(self) -> ModelSignature | None:
        return self._signature

    def unload(self) -> None:
        user, self._user = self._user, None
        if user is None:
            return
        try:
            user.finalize()
        except UserCodeError as exc:
            log.warning("%s\n%s", exc.message, exc.details)


class TritonModel(InProcessModel):
    """A Triton Python-backend model.py in the server's process: execute gets the batch's requests one by one, and
    may call other models (BLS) from its instance thread, so it never runs on the event loop."""

    runs_inline = False
    takes_requests = True

    def __init__(self, user: TritonUserModel, signature: ModelSignature) -> None:
        super().__init__(user, signature)
        self._triton = user

    def infer_requests(self, requests: Sequence[tuple[dict[str, np.ndarray], Any, Any]],
                       outputs: Sequence[Sequence[str]]) -> list[dict[str, np.ndarray] | Exception]:
        calls = [(inputs, responses, identity(origin)) for inputs, responses, origin in requests]
        with _logged():
            return list(self._triton.execute_requests(calls, [list(names) for names in outputs]))


@contextmanager
def _logged() -> Iterator[None]:
    """The model's failures that the operator should see go to the log (at a limited rate), then on."""
    try:
        yield
    except ExecuteError as exc:
        client_log(log, logging.ERROR, "python-model-failed", "%s\n%s", exc.message, exc.details)
        raise
    except ModelhostError as exc:
        if exc.kind is ErrorKind.INTERNAL:  # an output that breaks the config: the operator should see it
            client_log(log, logging.ERROR, "python-model-failed", "%s", exc.message)
        raise


def read_options(config: ModelConfig) -> tuple[bool, IsolationOptions]:
    """Whether the model runs isolated, and the limits of its workers, from config `parameters`."""
    params = {key: value.string_value for key, value in config.parameters.items()}
    isolation = params.get(ISOLATION_PARAMETER, "none")
    if isolation not in ISOLATIONS:
        raise ConfigError(f"parameter {ISOLATION_PARAMETER} must be one of {', '.join(ISOLATIONS)}, got '{isolation}'")
    defaults = IsolationOptions()
    options = IsolationOptions(
        execute_timeout_s=_number(params, EXECUTE_TIMEOUT_PARAMETER, defaults.execute_timeout_s),
        initialize_timeout_s=_number(params, INITIALIZE_TIMEOUT_PARAMETER, defaults.initialize_timeout_s),
        max_rss_bytes=int(_number(params, MAX_RSS_PARAMETER, defaults.max_rss_bytes, integer=True)),
    )
    return isolation == "process", options


def _number(params: dict[str, str], name: str, default: float, integer: bool = False) -> float:
    if name not in params:
        return default
    text = params[name]
    try:
        value = int(text) if integer else float(text)
    except ValueError:
        kind = "an integer" if integer else "a number"
        raise ConfigError(f"parameter {name} must be {kind}, got '{text}'") from None
    if not value >= 0:  # also rejects NaN
        raise ConfigError(f"parameter {name} must be >= 0 (0 = no limit), got '{text}'")
    return value


def _spec(path: Path, config: ModelConfig, index: int, signature: ModelSignature) -> UserCodeSpec:
    version = path.parent.name
    label = f"Python model '{config.name}' version {version} instance {index}"
    safe = re.sub(r"\W", "_", config.name)
    args = {
        "model_config": config_to_json(config),
        "model_name": config.name,
        "model_version": version,
        "model_instance_index": index,
        "model_directory": str(path.parent.parent),
    }
    return UserCodeSpec(
        path=str(path),
        module_name=f"modelhost_python_model_{safe}_{version}_{index}_{next(_loads)}",
        label=label,
        args=args,
        outputs=tuple(OutputRule(s.name, s.datatype, s.shape) for s in signature.outputs) + _state_outputs(config),
        batching=config.max_batch_size > 0,
    )


def _state_outputs(config: ModelConfig) -> tuple[OutputRule, ...]:
    """A sequence model's state outputs (config sequence_batching.state, core/sequence_state.py): execute returns
    them as it returns any output, and the server keeps them for the sequence's next request."""
    batch = (-1,) if config.max_batch_size > 0 else ()
    listed = {t.name for t in config.output}
    return tuple(OutputRule(s.output_name, v2_datatype(s.data_type), (*batch, *s.dims))
                 for s in config.sequence_batching.state if s.output_name not in listed)


def _no_tensors(path: Path) -> str:
    return (f"{path}: a Python model declares no tensors; {CONFIG_FILENAME} must list all its inputs and "
            "outputs (input [ { name, data_type, dims } ] and output [ ... ])")
