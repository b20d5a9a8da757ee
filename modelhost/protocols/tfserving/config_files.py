"""`tensorflow_model_server`'s configuration files (tsfs §B3.2, §B3.3, §B3.5): a `--model_config_file`
(`ModelServerConfig`), a `--batching_parameters_file` (`BatchingParameters`), a version's own
`batching_params.pbtxt` and a `--monitoring_config_file` (`MonitoringConfig`), in protobuf text format, read into
what modelhost serves.

Every error is a ConfigFileError naming the file and what is wrong with it (the line, for a syntax error).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from google.protobuf import text_format
from google.protobuf.message import Message

from modelhost.config.overrides import ModelOverrides
from modelhost.protocols.tfserving import apis_pb2 as pb
from modelhost.store.model_list import VersionConfigError
from modelhost.store.paths import name_problem

M = TypeVar("M", bound=Message)
TENSORFLOW_PLATFORM = "tensorflow"
DEFAULT_METRICS_PATH = "/monitoring/prometheus/metrics"
# TF's SharedBatchScheduler defaults for what a batching parameters file leaves out (tsfs §B3.3).
DEFAULT_MAX_BATCH_SIZE = 1000
DEFAULT_MAX_ENQUEUED_BATCHES = 10
PER_MODEL_BATCHING_FILE = "batching_params.pbtxt"  # in a SavedModel's directory, as TF Serving names it


class ConfigFileError(Exception):
    """A configuration file that cannot be used; the message names the file."""


@dataclass(frozen=True, slots=True)
class ServedModelEntry:
    """One `config { ... }` of a model config file. `versions`: "latest" (the newest `latest_count`), "all", or
    the listed numbers (`specific`); `labels`: version label -> version."""

    name: str
    base_path: Path
    policy: str = "latest"
    latest_count: int = 1
    specific: tuple[int, ...] = ()
    labels: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Batching:
    """A batching parameters file, mapped onto modelhost's scheduler: `overrides` for every model, and the
    allowed batch sizes a batch is padded up to (() = none)."""

    overrides: ModelOverrides
    allowed_batch_sizes: tuple[int, ...] = ()
    max_execution_batch_size: int = 0  # > 0: larger requests split into batches of at most this many rows


def read_text_proto(path: Path, message: M, what: str) -> M:
    """`message` filled from the text-format file at `path`; ConfigFileError naming `what` (the flag)."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigFileError(f"{what} {path}: cannot read it: {exc}") from None
    try:
        text_format.Parse(text, message)
    except text_format.ParseError as exc:
        raise ConfigFileError(f"{what} {path}: {exc}") from None
    return message


def read_model_config(path: Path) -> list[ServedModelEntry]:
    """The models of a `--model_config_file`; relative base paths are relative to the file's directory."""
    config = read_text_proto(path, pb.ModelServerConfig(), "--model_config_file")
    return model_entries(config, path.parent, f"--model_config_file {path}")


def model_entries(config: pb.ModelServerConfig, base: Path, where: str) -> list[ServedModelEntry]:
    """The models a ModelServerConfig lists (a file's, or a HandleReloadConfigRequest's); ConfigFileError
    naming `where` for anything TF Serving would refuse."""
    if config.WhichOneof("config") == "custom_model_config":
        raise ConfigFileError(f"{where}: custom_model_config is not supported; list models in model_config_list")
    entries: list[ServedModelEntry] = []
    seen: set[str] = set()
    for index, model in enumerate(config.model_config_list.config):
        at = f"{where}: config {index + 1}"
        if not model.name:
            raise ConfigFileError(f"{at} has no name")
        problem = name_problem(model.name)
        if problem is not None:
            raise ConfigFileError(f"{at}: model name {model.name!r} {problem}")
        if model.name in seen:
            raise ConfigFileError(f"{at}: model '{model.name}' is listed twice")
        seen.add(model.name)
        if not model.base_path:
            raise ConfigFileError(f"{at} ('{model.name}') has no base_path")
        if model.model_platform not in ("", TENSORFLOW_PLATFORM):
            raise ConfigFileError(f"{at} ('{model.name}'): model_platform '{model.model_platform}' is not "
                                  f"supported; TF Serving's is '{TENSORFLOW_PLATFORM}'")
        entries.append(_entry(model, base, at))
    return entries


def _entry(model: pb.ModelConfig, base: Path, at: str) -> ServedModelEntry:
    labels = dict(model.version_labels)
    for label, version in labels.items():
        if version <= 0:
            raise ConfigFileError(f"{at} ('{model.name}'): version label '{label}' names version {version}")
    policy = model.model_version_policy
    choice = policy.WhichOneof("policy_choice")
    path = Path(model.base_path)
    base_path = path if path.is_absolute() else base / path
    if choice == "all":
        return ServedModelEntry(model.name, base_path, "all", labels=labels)
    if choice == "specific":
        versions = tuple(sorted(set(policy.specific.versions)))
        if not versions or versions[0] <= 0:
            raise ConfigFileError(f"{at} ('{model.name}'): model_version_policy specific needs positive versions")
        return ServedModelEntry(model.name, base_path, "specific", specific=versions, labels=labels)
    count = policy.latest.num_versions if choice == "latest" else 1
    return ServedModelEntry(model.name, base_path, "latest", latest_count=max(1, count), labels=labels)


def read_batching_parameters(path: Path) -> Batching:
    parameters = read_text_proto(path, pb.BatchingParameters(), "--batching_parameters_file")
    return batching_from(parameters, f"--batching_parameters_file {path}")


def batching_from(parameters: pb.BatchingParameters, where: str) -> Batching:
    """TF Serving's batching, on modelhost's scheduler: max_batch_size, batch_timeout_micros (the queue delay),
    num_batch_threads (instances), max_enqueued_batches (the queue, in requests: batches x max_batch_size),
    allowed_batch_sizes (padding) and enable_large_batch_splitting with max_execution_batch_size."""
    def value(wrapper: str, default: int) -> int:
        return getattr(parameters, wrapper).value if parameters.HasField(wrapper) else default

    max_batch_size = value("max_batch_size", DEFAULT_MAX_BATCH_SIZE)
    timeout = value("batch_timeout_micros", 0)
    enqueued = value("max_enqueued_batches", DEFAULT_MAX_ENQUEUED_BATCHES)
    threads = value("num_batch_threads", 0)
    for name, number in (("max_batch_size", max_batch_size), ("max_enqueued_batches", enqueued)):
        if number <= 0:
            raise ConfigFileError(f"{where}: {name} must be positive, got {number}")
    if timeout < 0 or threads < 0:
        raise ConfigFileError(f"{where}: batch_timeout_micros and num_batch_threads must not be negative")
    allowed = tuple(parameters.allowed_batch_sizes)
    if allowed:
        if list(allowed) != sorted(set(allowed)) or allowed[0] <= 0:
            raise ConfigFileError(f"{where}: allowed_batch_sizes must increase, got {list(allowed)}")
        if allowed[-1] != max_batch_size:
            raise ConfigFileError(f"{where}: the last of allowed_batch_sizes ({allowed[-1]}) must equal "
                                  f"max_batch_size ({max_batch_size})")
    split = parameters.HasField("enable_large_batch_splitting") and parameters.enable_large_batch_splitting.value
    execution = value("max_execution_batch_size", max_batch_size) if split else 0
    if split and not 0 < execution <= max_batch_size:
        raise ConfigFileError(f"{where}: max_execution_batch_size must be between 1 and max_batch_size "
                              f"({max_batch_size}), got {execution}")
    queued = enqueued * max_batch_size
    overrides = ModelOverrides(
        dynamic_batching=True,
        max_batch_size=max_batch_size,
        max_queue_delay_microseconds=timeout,
        max_queue_size=queued if queued < 2**31 else 0,  # beyond what a queue can mean: unbounded
        instance_count=threads or None,
    )
    return Batching(overrides, allowed, execution)


def version_batching_config(version: Path) -> str:
    """config.pbtxt lines for a version directory's own batching_params.pbtxt (TF Serving's
    --enable_per_model_batching_parameters); "" without one: the model is not batched, as in TF Serving."""
    path = version / PER_MODEL_BATCHING_FILE
    if not path.is_file():
        return ""
    try:
        parameters = read_text_proto(path, pb.BatchingParameters(), "per-model batching parameters")
        batching = batching_from(parameters, f"{PER_MODEL_BATCHING_FILE} of version {version.name}")
    except ConfigFileError as exc:
        raise VersionConfigError(str(exc)) from None
    return batching_config(batching)


def batching_config(batching: Batching) -> str:
    """`batching` as config.pbtxt lines of one model (what `overrides` and the served config lines give every
    model under a --batching_parameters_file)."""
    overrides = batching.overrides
    queue = f" default_queue_policy {{ max_queue_size: {overrides.max_queue_size} }}" if overrides.max_queue_size \
        else ""
    preferred = (f" preferred_batch_size: [ {', '.join(str(size) for size in batching.allowed_batch_sizes)} ]"
                 if batching.allowed_batch_sizes else "")
    lines = [f"max_batch_size: {overrides.max_batch_size}",
             f"dynamic_batching {{ max_queue_delay_microseconds: {overrides.max_queue_delay_microseconds}"
             f"{preferred}{queue} }}"]
    if overrides.instance_count:
        lines.append(f"instance_group [ {{ count: {overrides.instance_count} kind: KIND_CPU }} ]")
    return "".join(line + "\n" for line in lines + batching_parameters(batching))


def batching_parameters(batching: Batching) -> list[str]:
    """The config.pbtxt parameters `batching` sets: padding to the allowed sizes, splitting large requests."""
    lines = []
    if batching.allowed_batch_sizes:
        lines.append('parameters { key: "pad_to_preferred_batch_size" value { string_value: "true" } }')
    if batching.max_execution_batch_size:
        lines.append(f'parameters {{ key: "request_split_size" value {{ string_value: '
                     f'"{batching.max_execution_batch_size}" }} }}')
    return lines


def read_monitoring_path(path: Path) -> str | None:
    """The path Prometheus metrics are served at on the REST port, or None when the file does not enable them."""
    config = read_text_proto(path, pb.MonitoringConfig(), "--monitoring_config_file")
    prometheus = config.prometheus_config
    if not prometheus.enable:
        return None
    metrics_path = prometheus.path or DEFAULT_METRICS_PATH
    if not metrics_path.startswith("/") or any(part in ("", ".", "..") for part in metrics_path[1:].split("/")):
        raise ConfigFileError(f"--monitoring_config_file {path}: prometheus_config path '{metrics_path}' must be "
                              "an absolute URL path like /monitoring/prometheus/metrics")
    return metrics_path

