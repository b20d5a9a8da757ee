"""What a TorchServe registration is: the request's parameters (`Registration`), the worker settings they come to
(`WorkerSettings`, tsfs §A5.3), and the registered models and versions the management API describes."""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from modelhost.config.mar_manifest import HANDLER_BATCH_PARAMETER, MarConfig, MarManifest, worker_batch
from modelhost.protocols.torchserve.config_properties import TorchServeConfig
from modelhost.protocols.torchserve.errors import TorchServeError

MAX_WORKERS = 128  # worker processes one model may be given (each a Python process with its framework)


@dataclass(frozen=True, slots=True)
class WorkerSettings:
    """A model's frontend settings (tsfs §A5.3), as describe shows them."""

    min_workers: int
    max_workers: int
    batch_size: int = 1
    max_batch_delay_ms: int = 100
    response_timeout_s: int = 120
    startup_timeout_s: int = 120
    job_queue_size: int = 100
    client_timeout_ms: int = 0

    def config_text(self, handler: str | None, decode_input: bool, envelope: str | None = None) -> str:
        """config.pbtxt lines for them: the scheduler batches and times out as TorchServe's frontend would."""
        delay = f"max_queue_delay_microseconds: {self.max_batch_delay_ms * 1000} " if self.batch_size > 1 else ""
        timeout = (f"default_timeout_microseconds: {self.client_timeout_ms * 1000} timeout_action: REJECT "
                   if self.client_timeout_ms else "")
        parameters = {"execute_timeout_seconds": self.response_timeout_s,
                      "initialize_timeout_seconds": self.startup_timeout_s,
                      "decode_input_request": "true" if decode_input else "false"}
        if handler:
            parameters["handler"] = handler
        if envelope:
            parameters["service_envelope"] = envelope
        parameters[HANDLER_BATCH_PARAMETER] = self.batch_size
        return (f"max_batch_size: {worker_batch(self.batch_size)}\n"
                f"instance_group [ {{ count: {max(self.min_workers, 1)} kind: KIND_CPU }} ]\n"
                f"dynamic_batching {{ {delay}default_queue_policy {{ max_queue_size: {self.job_queue_size} "
                f"{timeout}}} }}\n"
                + "".join(f'parameters {{ key: "{key}" value: {{ string_value: "{value}" }} }}\n'
                          for key, value in parameters.items()))


@dataclass(slots=True)
class RegisteredVersion:
    version: str
    number: int  # modelhost's version
    url: str  # as registered: an archive of the model store, or a URL
    archive: Path
    manifest: MarManifest
    settings: WorkerSettings
    handler: str | None = None  # the registration's handler, instead of the manifest's
    loaded_at_startup: bool = False
    started: float = field(default_factory=time.time)


@dataclass(slots=True)
class RegisteredModel:
    name: str
    versions: dict[str, RegisteredVersion] = field(default_factory=dict)
    default: str = ""
    numbers: itertools.count[int] = field(default_factory=lambda: itertools.count(1))


@dataclass(frozen=True, slots=True)
class Registration:
    """What a registration asks for (the management API's parameters, a startup model's `models` entry); None:
    not given, so the archive's YAML, then the server's defaults, decide."""

    name: str | None = None
    handler: str | None = None
    batch_size: int | None = None
    max_batch_delay_ms: int | None = None
    initial_workers: int | None = None
    response_timeout_s: int | None = None
    startup_timeout_s: int | None = None
    default_version: bool = False
    at_startup: bool = False


def worker_settings(config: TorchServeConfig, cpu_count: int, name: str, version: str, yaml: MarConfig,
                    request: Registration) -> WorkerSettings:
    """API > model-config YAML > config.properties `models` > the server's defaults (tsfs §A2.1)."""
    configured: dict[str, Any] = config.models.get(name, {}).get(version, {})
    default_workers = config.default_workers_per_model
    if request.at_startup and not default_workers:
        default_workers = cpu_count

    def pick(api: int | None, from_yaml: int | None, key: str, default: int) -> int:
        for value in (api, from_yaml, configured.get(key)):
            if isinstance(value, int) and not isinstance(value, bool):
                return value
        return default

    yaml_given = yaml.raw
    workers = pick(request.initial_workers, None, "minWorkers", default_workers)
    if yaml.min_workers and (yaml.max_workers is None or yaml.max_workers >= yaml.min_workers):
        workers = yaml.min_workers
    check_workers(workers)
    return WorkerSettings(
        min_workers=workers,
        max_workers=max(workers, yaml.max_workers or 0, pick(None, None, "maxWorkers", 0)),
        batch_size=pick(request.batch_size, yaml.batch_size if "batchSize" in yaml_given else None,
                        "batchSize", 1),
        max_batch_delay_ms=pick(request.max_batch_delay_ms,
                                yaml.max_batch_delay_ms if "maxBatchDelay" in yaml_given else None,
                                "maxBatchDelay", 100),
        response_timeout_s=pick(request.response_timeout_s,
                                yaml.response_timeout_s if "responseTimeout" in yaml_given else None,
                                "responseTimeout", config.default_response_timeout),
        startup_timeout_s=pick(request.startup_timeout_s,
                               yaml.startup_timeout_s if "startupTimeout" in yaml_given else None,
                               "startupTimeout", config.default_startup_timeout),
        job_queue_size=yaml.job_queue_size or config.job_queue_size,
        client_timeout_ms=yaml.client_timeout_ms,
    )


def check_workers(count: int) -> None:
    """TorchServeError (400) for a worker count past MAX_WORKERS: each worker is a process of the server's."""
    if count > MAX_WORKERS:
        raise TorchServeError(400, "BadRequestException", f"{count} workers is more than the {MAX_WORKERS} a model may "
                                                          "have")
