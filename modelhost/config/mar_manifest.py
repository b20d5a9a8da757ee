"""A TorchServe archive's own configuration (tsfs §A5.2, §A5.3): `MAR-INF/MANIFEST.json` and the model-config
YAML it names, read from the directory that holds the archive's files (store/mar.py unpacks archives).

What the YAML sets is checked as TorchServe's frontend reads it, and an invalid value is an error naming the key;
keys modelhost does not use stay in `MarConfig.raw` (TorchServe hands the whole YAML to the handler as
`context.model_yaml_config`). That the files the manifest names are in the archive is store/mar.py's check.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from modelhost.errors import ErrorKind, ModelhostError, invalid

MANIFEST = Path("MAR-INF") / "MANIFEST.json"
MAR_SUFFIX = ".mar"  # a TorchServe archive's file name, whatever comes before it
RUNTIMES = ("python", "python3")
# A handler model's config: the handler's batch size (TorchServe's batchSize, what one handler call gets) is the
# parameter below; max_batch_size is how many requests a worker is sent at once. For a handler of batch size 1
# (TorchServe's default), requests waiting together go to its worker in one message of up to WORKER_BATCH, and the
# worker calls the handler once per request: the handler sees what TorchServe would hand it, and the round trip
# to the worker is paid once for them all.
HANDLER_BATCH_PARAMETER = "handler_batch_size"
WORKER_BATCH = 32


def worker_batch(handler_batch: int) -> int:
    """The max_batch_size that sends a worker whole batches of its handler (TorchServe waits for up to batchSize
    requests), or, for a handler of batch size 1, up to WORKER_BATCH requests at once."""
    return handler_batch if handler_batch > 1 else WORKER_BATCH


@dataclass(frozen=True, slots=True)
class MarManifest:
    """`MAR-INF/MANIFEST.json`'s model section (absent keys None); `raw` is the whole file (`context.manifest`)."""

    model_name: str
    handler: str  # a file of the archive ("handler.py"), a built-in name ("image_classifier") or "module:function"
    serialized_file: str | None = None
    model_file: str | None = None
    model_version: str | None = None
    requirements_file: str | None = None
    config_file: str | None = None
    runtime: str = "python"
    raw: dict[str, Any] = field(default_factory=dict, compare=False)


@dataclass(frozen=True, slots=True)
class MarConfig:
    """The model-config YAML's frontend keys, TorchServe's defaults where it leaves them out (None: the server's
    own setting applies); `raw` is the whole YAML."""

    min_workers: int | None = None
    max_workers: int | None = None
    batch_size: int = 1
    max_batch_delay_ms: int = 100
    response_timeout_s: int = 120
    startup_timeout_s: int = 120
    job_queue_size: int | None = None
    client_timeout_ms: int = 0  # 0: requests never expire in the queue
    use_job_ticket: bool = False
    raw: dict[str, Any] = field(default_factory=dict, compare=False)


def read_manifest(root: Path, label: str) -> MarManifest:
    """`root`'s MAR-INF/MANIFEST.json; INVALID_INPUT naming the archive `label` and the key for what TorchServe
    would refuse."""
    try:
        data = (root / MANIFEST).read_bytes()
    except OSError as exc:
        raise invalid(f"model archive {label}: {MANIFEST.as_posix()} cannot be read: {exc.strerror}") from None
    return parse_manifest(data, label)


def parse_manifest(data: bytes, label: str) -> MarManifest:
    """A MANIFEST.json's text, read as read_manifest reads the file."""
    where = f"model archive {label}: {MANIFEST.as_posix()}"
    try:
        document = orjson.loads(data)  # depth-limited: json.loads recursed until RecursionError on a hostile one
    except orjson.JSONDecodeError as exc:
        raise invalid(f"{where} is not valid JSON: {exc}") from None
    model = document.get("model") if isinstance(document, dict) else None
    if not isinstance(model, dict):
        raise invalid(f"{where} has no 'model' object")

    def text(key: str, required: bool = False) -> str | None:
        value = model.get(key)
        if value is None and not required:
            return None
        if not isinstance(value, str) or not value:
            raise invalid(f"{where}: model.{key} must be a non-empty string"
                          + ("" if value is not None else " (it is required)"))
        return value

    runtime = document.get("runtime", "python")
    if runtime not in RUNTIMES:
        raise invalid(f"{where}: runtime '{runtime}' is not supported; modelhost runs Python handlers "
                      f"({', '.join(RUNTIMES)})")
    manifest = MarManifest(
        model_name=text("modelName", required=True) or "",
        handler=text("handler", required=True) or "",
        serialized_file=text("serializedFile"),
        model_file=text("modelFile"),
        model_version=text("modelVersion"),
        requirements_file=text("requirementsFile"),
        config_file=text("configFile"),
        runtime=runtime,
        raw=document,
    )
    return manifest


# The frontend keys read here: YAML key -> (field, kind, smallest value).
_KEYS: dict[str, tuple[str, type, int]] = {
    "minWorkers": ("min_workers", int, 0),
    "maxWorkers": ("max_workers", int, 0),
    "batchSize": ("batch_size", int, 1),
    "maxBatchDelay": ("max_batch_delay_ms", int, 0),
    "responseTimeout": ("response_timeout_s", int, 1),
    "startupTimeout": ("startup_timeout_s", int, 1),
    "jobQueueSize": ("job_queue_size", int, 1),
    "clientTimeoutInMills": ("client_timeout_ms", int, 0),
    "useJobTicket": ("use_job_ticket", bool, 0),
}


def read_model_config(path: Path, label: str) -> MarConfig:
    """The model-config YAML at `path`; INVALID_INPUT naming the key for a value TorchServe would refuse."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise invalid(f"model archive {label}: {path.name} cannot be read: {exc.strerror}") from None
    return parse_model_config(data, path.name, label)


def parse_model_config(data: bytes, filename: str, label: str) -> MarConfig:
    """A model-config YAML's text (the file `filename` of archive `label`), read as read_model_config reads it."""
    where = f"model archive {label}: {filename}"
    try:
        import yaml
    except ImportError:
        raise ModelhostError(ErrorKind.UNSUPPORTED, f"{where}: reading a model-config YAML needs PyYAML: "
                             "pip install 'modelhost[torchserve]'") from None
    try:
        document = yaml.safe_load(data.decode("utf-8")) or {}
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        raise invalid(f"{where} is not valid YAML: {exc}") from None
    if not isinstance(document, dict):
        raise invalid(f"{where} must be a mapping of keys to values")
    values: dict[str, Any] = {}
    for key, (name, kind, smallest) in _KEYS.items():
        if key not in document:
            continue
        value = document[key]
        if kind is bool:
            if not isinstance(value, bool):
                raise invalid(f"{where}: {key} must be true or false, got {value!r}")
        elif isinstance(value, bool) or not isinstance(value, int) or value < smallest:
            raise invalid(f"{where}: {key} must be an integer >= {smallest}, got {value!r}")
        values[name] = value
    low, high = values.get("min_workers"), values.get("max_workers")
    if low is not None and high is not None and low > high:
        raise invalid(f"{where}: minWorkers {low} is more than maxWorkers {high}")
    return MarConfig(**values, raw=document)
