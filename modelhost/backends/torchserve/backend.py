"""TorchServe backend: a TorchServe model archive (`.mar`) served by its own handler, unmodified.

The model file is a version's `model.mar`, or the one `*.mar` in the version directory, in any of
torch-model-archiver's formats (zip, tgz, or an unpacked `no-archive` directory; a version directory that holds
`MAR-INF/MANIFEST.json` is one). Each instance runs the handler in a worker process of its own
(backends/python/isolated.py: a crash or hang fails only its batch and the worker restarts), loaded and called as
TorchServe's worker does (runtime.py). It is a handler model (handler_messages.py): KServe V2 and TF Serving
clients send request bodies as BYTES `body` and get the handler's answers as `response`; the TorchServe and
SageMaker front-ends send whole requests through the `handler` signature.

The archive's model-config YAML (tsfs §A5.3) sets what config.pbtxt leaves unset: `batchSize` the handler's batch
size (parameter handler_batch_size: the scheduler's dynamic batching hands the handler up to that many requests;
for a batch size of 1 a worker is sent up to 32 waiting requests at once, which it hands the handler one by one,
config/mar_manifest.py), `maxBatchDelay` the queue delay, `minWorkers` the instances, `responseTimeout` (per
handler call) and `startupTimeout` the worker's execute and initialize timeouts, `jobQueueSize` the queue's size
(503 when full), `clientTimeoutInMills` the queue timeout.
Config `parameters`: `handler` (instead of the manifest's), `decode_input_request` ("false": parameters reach
the handler as bytes), `service_envelope` (TorchServe's request envelope around the handler: json, body, kserve,
kservev2), and the Python backend's isolation limits.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from modelhost.backends.base import Backend, InstanceSettings, Model, ModelSignature
from modelhost.backends.python.backend import read_options
from modelhost.backends.python.isolated import IsolatedModel
from modelhost.backends.python.user_model import UserCodeError
from modelhost.backends.python.worker_process import IsolationOptions, Partial
from modelhost.backends.torchserve.worker_model import HandlerSpec
from modelhost.config.mar_manifest import (
    HANDLER_BATCH_PARAMETER,
    MANIFEST,
    MAR_SUFFIX,
    MarConfig,
    MarManifest,
    worker_batch,
)
from modelhost.config.model_config_pb2 import ModelConfig, ModelInstanceGroup, ModelQueuePolicy
from modelhost.config.overrides import ModelOverrides
from modelhost.config.pbtxt import ConfigError
from modelhost.errors import ModelhostError
from modelhost.handler_messages import (
    BODY_INPUT,
    HANDLER_INPUT,
    HANDLER_SIGNATURE,
    RESPONSE_OUTPUT,
    HandlerRequest,
)
from modelhost.store.mar import open_mar, read_mar_settings
from modelhost.types import TensorSpec

log = logging.getLogger("modelhost.backends.torchserve")

HANDLER_PARAMETER = "handler"
DECODE_PARAMETER = "decode_input_request"
ENVELOPE_PARAMETER = "service_envelope"
ENVELOPES = ("json", "body", "kserve", "kservev2")
MAX_UNPACKED_BYTES = 64 << 30
MAX_ARCHIVE_MEMBERS = 100_000

SERVED_SIGNATURE = ModelSignature(inputs=(TensorSpec(BODY_INPUT, "BYTES", (-1,)),),
                                  outputs=(TensorSpec(RESPONSE_OUTPUT, "BYTES", (-1,)),))
HANDLER_MODEL_SIGNATURE = ModelSignature(inputs=(TensorSpec(HANDLER_INPUT, "BYTES", (-1,)),),
                                         outputs=(TensorSpec(RESPONSE_OUTPUT, "BYTES", (-1,)),))


class TorchServeBackend(Backend):
    name = "torchserve"
    platform = ""
    default_filename = "model.mar"

    def code_in(self, filename: str) -> str | None:
        return f"{filename} (a TorchServe archive: modelhost runs its handler)"

    def model_path(self, version_dir: Path, filename: str) -> Path:
        path = version_dir / filename
        if filename != self.default_filename or path.exists():
            return path
        archives = sorted(entry for entry in _entries(version_dir) if entry.name.endswith(MAR_SUFFIX))
        if len(archives) == 1 and not (version_dir / MANIFEST).is_file():
            return archives[0]
        return version_dir  # an unpacked archive, or a model directory its config's handler serves

    def describe(self, path: Path) -> ModelSignature:
        return SERVED_SIGNATURE

    def configure(self, path: Path, config: ModelConfig, overrides: ModelOverrides) -> None:
        _, settings = _read_settings(path, config)
        apply_mar_config(settings, config, overrides)

    def load(self, path: Path, config: ModelConfig, instance: InstanceSettings) -> Model:
        manifest, _ = _read_settings(path, config)
        _, options = read_options(config)
        parameters = {key: value.string_value for key, value in config.parameters.items()}
        decode = parameters.get(DECODE_PARAMETER, "true").lower()
        if decode not in ("true", "false"):
            raise ConfigError(f"parameter {DECODE_PARAMETER} must be true or false, got '{decode}'")
        envelope = parameters.get(ENVELOPE_PARAMETER) or None
        if envelope is not None and envelope not in ENVELOPES:
            raise ConfigError(f"parameter {ENVELOPE_PARAMETER} must be one of {', '.join(ENVELOPES)}, got '{envelope}'")
        held, root = _unpacked.hold(path)
        version = path.name if path.is_dir() and not path.name.endswith(MAR_SUFFIX) else path.parent.name
        try:
            spec = HandlerSpec(
                path=str(root), label=f"TorchServe model '{config.name}' version {version} instance {instance.index}",
                model_name=config.name, handler=parameters.get(HANDLER_PARAMETER) or manifest.handler,
                batch_size=handler_batch(config), threads=instance.threads, decode_input=decode == "true",
                envelope=envelope,
            )
            return HandlerModel(spec, options, held, instance)
        except UserCodeError as exc:
            _unpacked.release(held)
            if exc.details:
                log.error("%s\n%s", exc.message, exc.details)
            raise ConfigError(exc.message) from None
        except BaseException:
            _unpacked.release(held)
            raise


def apply_mar_config(settings: MarConfig, config: ModelConfig, overrides: ModelOverrides | None = None) -> None:
    """Set, in `config`, what the archive's model-config YAML says and the config leaves unset (tsfs §A5.3); where
    the YAML is silent too, TorchServe's defaults (a batch of 1, 100 ms to fill a larger one) unless `overrides`
    (the endpoint's SAGEMAKER_TS_* variables, applied next) set them. The handler's batch size goes to the
    handler_batch_size parameter, and the worker's batch (mar_manifest.worker_batch) to max_batch_size."""
    overrides = overrides or ModelOverrides()
    given = settings.raw
    if HANDLER_BATCH_PARAMETER not in config.parameters:
        if "batchSize" in given:
            batch = settings.batch_size
        else:
            batch = config.max_batch_size if config.max_batch_size and not config.input else (
                overrides.max_batch_size or 1)
        config.parameters[HANDLER_BATCH_PARAMETER].string_value = str(batch)
    batch = handler_batch(config)
    if config.max_batch_size == 0 and not config.input:
        config.max_batch_size = worker_batch(batch)
    if config.WhichOneof("scheduling_choice") is None:
        config.dynamic_batching.SetInParent()
    if config.WhichOneof("scheduling_choice") == "dynamic_batching":
        batching = config.dynamic_batching
        delay_given = "maxBatchDelay" in given or overrides.max_queue_delay_microseconds is None
        if batch > 1 and delay_given and batching.max_queue_delay_microseconds == 0:
            batching.max_queue_delay_microseconds = settings.max_batch_delay_ms * 1000
        policy = batching.default_queue_policy
        if settings.job_queue_size and policy.max_queue_size == 0:
            policy.max_queue_size = settings.job_queue_size
        if settings.client_timeout_ms and policy.default_timeout_microseconds == 0:
            policy.default_timeout_microseconds = settings.client_timeout_ms * 1000
            policy.timeout_action = ModelQueuePolicy.REJECT
    if settings.min_workers:
        if not config.instance_group:
            config.instance_group.add(count=settings.min_workers, kind=ModelInstanceGroup.KIND_CPU)
        for group in config.instance_group:
            group.count = group.count or settings.min_workers
    for name, seconds in (("execute_timeout_seconds", settings.response_timeout_s),
                          ("initialize_timeout_seconds", settings.startup_timeout_s)):
        if name not in config.parameters:
            config.parameters[name].string_value = str(seconds)


def handler_batch(config: ModelConfig) -> int:
    """The handler's batch size, from the config's handler_batch_size parameter; ConfigError when it is not a
    positive integer."""
    text = config.parameters[HANDLER_BATCH_PARAMETER].string_value if HANDLER_BATCH_PARAMETER in config.parameters \
        else "1"
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise ConfigError(f"parameter {HANDLER_BATCH_PARAMETER} must be a positive integer, got '{text}'")
    return value


class HandlerModel(IsolatedModel):
    """One instance: the handler in its worker process, answering both signatures of a handler model."""

    def __init__(self, spec: HandlerSpec, options: IsolationOptions, held: tuple[Path, int, int],
                 instance: InstanceSettings) -> None:
        self._held = held
        self._handler_batch = spec.batch_size
        self._timeout_s = options.execute_timeout_s
        # A lone batch computes on the cores the rest of the server leaves idle too (torch.set_num_threads).
        super().__init__(spec, options, SERVED_SIGNATURE, instance.threads, instance.lender)  # raises UserCodeError

    def signatures(self) -> Mapping[str, ModelSignature]:
        return {HANDLER_SIGNATURE: HANDLER_MODEL_SIGNATURE}

    def timeout_for(self, inputs: dict[str, np.ndarray]) -> float:
        # responseTimeout is per handler call: a worker sent several calls' requests has that long for each.
        rows = len(next(iter(inputs.values()))) if inputs else 1
        return self._timeout_s * -(-rows // self._handler_batch)

    def infer_signature(
        self, signature: str, inputs: dict[str, np.ndarray], outputs: Sequence[str]
    ) -> dict[str, np.ndarray]:
        return self.infer(inputs, outputs)

    def _partials_of(self, inputs: dict[str, np.ndarray]) -> Partial | None:
        # The handler's intermediate answers to a `handler` request go to the front-end that streams it, if one does.
        requests = inputs.get(HANDLER_INPUT)
        if requests is None:
            return None
        batch = requests.reshape(-1)

        def partial(index: int, answer: Any) -> None:
            request = batch[index] if 0 <= index < len(batch) else None
            if isinstance(request, HandlerRequest) and request.partials is not None:
                request.partials.put(answer, answer.nbytes)
        return partial

    def unload(self) -> None:
        try:
            super().unload()
        finally:
            _unpacked.release(self._held)


def _read_settings(path: Path, config: ModelConfig) -> tuple[MarManifest, MarConfig]:
    """The archive's manifest and YAML; for a model directory without a manifest (a SageMaker model directory,
    TorchServe's default_service_handler's case) one naming the config's `handler` parameter."""
    if path.is_dir() and not (path / MANIFEST).is_file():
        handler = config.parameters[HANDLER_PARAMETER].string_value if HANDLER_PARAMETER in config.parameters else ""
        if not handler:
            raise ConfigError(f"model '{config.name}': {path.name} has no {MANIFEST.as_posix()} and the config names "
                              f"no handler (parameter '{HANDLER_PARAMETER}') to serve it with")
        return MarManifest(model_name=config.name, handler=handler), MarConfig()
    try:
        return read_mar_settings(path)
    except ModelhostError as exc:
        raise ConfigError(exc.message) from None


def _entries(directory: Path) -> list[Path]:
    try:
        return list(directory.iterdir())
    except OSError:
        return []


@dataclass(slots=True)
class _Copy:
    """An archive file's unpacked copy: the model root in it, the directory to remove, and how many instances
    hold it."""

    root: Path
    directory: Path | None
    holders: int = 1


class _UnpackedArchives:
    """Each archive file unpacked once, into a temporary directory of its own, for as long as an instance holds it
    (a changed file is a new copy: instances of the old one keep theirs until they unload); a directory archive is
    used where it is."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._copies: dict[tuple[Path, int, int], _Copy] = {}  # (archive, mtime, size) -> its copy

    def hold(self, archive: Path) -> tuple[tuple[Path, int, int], Path]:
        """The key to release with, and the model root (TorchServe's model_dir)."""
        key = archive.resolve()
        stat = key.stat()
        identity = (key, stat.st_mtime_ns, stat.st_size)
        with self._lock:
            copy = self._copies.get(identity)
            if copy is not None:
                copy.holders += 1
                return identity, copy.root
            if archive.is_dir():
                copy = _Copy(archive, None)
            else:  # unpacked under the lock: a second instance of the archive waits for the first's copy
                directory = Path(tempfile.mkdtemp(prefix="modelhost-mar-"))
                try:
                    model = open_mar(archive, directory / "archive", MAX_UNPACKED_BYTES, MAX_ARCHIVE_MEMBERS)
                except ModelhostError as exc:
                    shutil.rmtree(directory, ignore_errors=True)
                    raise ConfigError(exc.message) from None
                copy = _Copy(model.root, directory)
            self._copies[identity] = copy
            return identity, copy.root

    def release(self, identity: tuple[Path, int, int]) -> None:
        with self._lock:
            copy = self._copies.get(identity)
            if copy is None:
                return
            copy.holders -= 1
            if copy.holders:
                return
            del self._copies[identity]
        if copy.directory is not None:
            shutil.rmtree(copy.directory, ignore_errors=True)


_unpacked = _UnpackedArchives()
