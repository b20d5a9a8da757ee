"""Turn a model directory into served versions: read, complete and check the config, load instances.

Everything here blocks (file reads, session creation); the manager calls it in a thread.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path

from modelhost.backends import (
    BackendUnavailableError,
    backend_for_filename,
    backend_name,
    get_backend,
    warm_up_backend,
)
from modelhost.backends.base import Backend, InstanceSettings, Model
from modelhost.config.completion import apply_defaults, check_config, complete_config
from modelhost.config.model_config_pb2 import ModelConfig
from modelhost.config.overrides import ModelOverrides, apply_overrides
from modelhost.config.pbtxt import ConfigError, read_config
from modelhost.core import spare_cores
from modelhost.core.classification import read_labels
from modelhost.core.devices import instance_gpu, place
from modelhost.core.ensemble import Acquire, EnsemblePlan, EnsembleScheduler
from modelhost.core.ensemble_plan import PLATFORM as ENSEMBLE
from modelhost.core.in_flight import InFlight
from modelhost.core.latency_target import LatencyTarget
from modelhost.core.policy import SchedulingPolicy
from modelhost.core.scheduler import Scheduler
from modelhost.core.sequences import SequenceBatcher
from modelhost.core.served_model import ServedModel
from modelhost.core.signature import Signature, named_signatures
from modelhost.core.statistics import ModelStatistics
from modelhost.core.warmup import WarmupReader, run_warmup, warmup_samples
from modelhost.store.local import ModelSource
from modelhost.store.paths import check_relative

log = logging.getLogger("modelhost.loader")


@dataclass(frozen=True, slots=True)
class LoadPlan:
    """What the loader found in a model directory before loading: config, backend (None for an ensemble,
    which has its plan instead), versions to load, and the server's overrides (their max_batch_size
    still applies at completion, in load_version)."""

    config: ModelConfig
    backend: Backend | None
    versions: tuple[int, ...]
    overrides: ModelOverrides = ModelOverrides()
    ensemble: EnsemblePlan | None = None


def plan_model(
    source: ModelSource, overrides: ModelOverrides | None = None, config: ModelConfig | None = None,
    check_code: Callable[[Backend, ModelConfig], None] | None = None,
) -> LoadPlan:
    """Read the model's config (or take `config`, a load request's override), fill what it leaves unset
    from `overrides`, and pick the versions to serve. `check_code` (the code policy) raises when the model's
    code may not run: it is called before the backend's configure, which may run it (Triton's
    auto_complete_config)."""
    if config is None:
        config = read_config(source.path) or ModelConfig()
    else:
        config = _copy(config)
    overrides = overrides or ModelOverrides()
    if source.name != source.path.name:
        # Served under another name than its directory's (a multi-model archive's target, a single model
        # under its default name): the name in config.pbtxt names the directory, not what clients use.
        config.name = source.name
    if config.default_model_filename:
        check_relative(config.default_model_filename, f"model '{source.name}': default_model_filename")
    if config.platform == ENSEMBLE:
        apply_overrides(config, overrides)
        return _plan_ensemble(source, config, overrides)
    try:
        backend = get_backend(_resolve_backend(config, source))
    except BackendUnavailableError as exc:
        raise ConfigError(str(exc)) from None
    versions = select_versions(config, source)
    filename = config.default_model_filename or backend.default_filename
    if check_code is not None:
        check_code(backend, config)
    # What the model file says comes before the endpoint-wide overrides: it is about this model.
    backend.configure(backend.model_path(source.version_path(versions[-1]), filename), config, overrides)
    apply_overrides(config, overrides)
    apply_defaults(config, source.name, backend.platform, backend.name)
    place(config, backend, bool(overrides.gpu_fallback))
    return LoadPlan(config, backend, versions, overrides)


def backend_of(source: ModelSource) -> str | None:
    """The backend that will load `source`, from its config or its files; None for an ensemble, or when it cannot
    be told (the load reports why, with the model's name). Blocking."""
    try:
        config = read_config(source.path) or ModelConfig()
        return None if config.platform == ENSEMBLE else _resolve_backend(config, source)
    except Exception as exc:  # noqa: BLE001 - the load reports it
        log.debug("no backend found for %s: %s", source.name, exc)
        return None


def warm_up_backend_of(source: ModelSource) -> bool:
    """Create the process-wide state of the backend that will load `source` (its framework's import and
    runtime), so that a measured load is charged for the model alone; blocking. Returns whether it did (False
    when the backend was warm already). Whatever keeps the backend from being found or warmed is left for the
    load itself to report."""
    name = backend_of(source)
    try:
        return name is not None and warm_up_backend(name)
    except Exception as exc:  # noqa: BLE001 - the load reports it, with the model's name
        log.debug("no backend warmed up for %s: %s", source.name, exc)
        return False


def _plan_ensemble(source: ModelSource, config: ModelConfig, overrides: ModelOverrides) -> LoadPlan:
    if config.name and config.name != source.name:
        raise ConfigError(f"config.pbtxt name '{config.name}' does not match the model directory '{source.name}'")
    config.name = source.name
    if not config.HasField("version_policy"):
        config.version_policy.latest.num_versions = 1
    if not config.input or not config.output:
        raise ConfigError(f"ensemble '{source.name}': config.pbtxt must list the ensemble's input and output")
    if config.model_warmup:
        raise ConfigError(f"ensemble '{source.name}': config.pbtxt model_warmup cannot be given for an ensemble "
                          "(its composing models warm up with their own)")
    check_config(config)
    plan = EnsemblePlan.from_config(config)
    return LoadPlan(config, None, select_versions(config, source), overrides, plan)


def _copy(config: ModelConfig) -> ModelConfig:
    copied = ModelConfig()
    copied.CopyFrom(config)
    return copied


def _resolve_backend(config: ModelConfig, source: ModelSource) -> str:
    if config.platform or config.backend:
        try:
            return backend_name(config.platform, config.backend)
        except LookupError as exc:
            raise ConfigError(f"config.pbtxt: {exc}") from None
    for version in reversed(source.versions):
        filename = config.default_model_filename
        candidates = [filename] if filename else [p.name for p in source.version_path(version).iterdir()]
        for candidate in candidates:
            name = backend_for_filename(candidate)
            if name:
                return name
    raise ConfigError(
        f"no platform or backend in the config of model '{source.name}', and no known model file "
        f"(e.g. model.onnx) in its version directories to infer one from"
    )


def select_versions(config: ModelConfig, source: ModelSource) -> tuple[int, ...]:
    available = source.versions
    if not available:
        raise ConfigError(f"model '{source.name}' has no version directory (e.g. {source.path}/1/)")
    policy = config.version_policy
    choice = policy.WhichOneof("policy_choice")
    if choice == "all":
        return available
    if choice == "specific":
        missing = [v for v in policy.specific.versions if v not in available]
        if missing:
            raise ConfigError(
                f"version_policy specific lists version(s) {missing} that have no directory in {source.path}"
            )
        return tuple(sorted(set(policy.specific.versions)))
    count = max(policy.latest.num_versions, 1)
    return available[-count:]


def load_version(
    source: ModelSource, version: int, plan: LoadPlan, cpu_count: int, default_max_batch_size: int,
    in_flight: InFlight | None = None, warmup_reader: WarmupReader | None = None, on_demand: bool = False,
) -> ServedModel:
    """`on_demand`: the model is loaded for a request and unloaded for another model's (a multi-model endpoint)."""
    backend = plan.backend
    assert backend is not None, "an ensemble loads with load_ensemble_version"
    filename = plan.config.default_model_filename or backend.default_filename
    check_relative(filename, f"model '{source.name}': default_model_filename")  # never outside the version dir
    path = backend.model_path(source.version_path(version), filename)
    if not path.exists():
        raise ConfigError(f"model file {path} does not exist")
    # The first instance loads before config completion (which needs the model's tensors): its own
    # signature spares the backend a second load just to describe the model.
    count = sum(group.count for group in plan.config.instance_group)
    # A model loaded on demand computes on one thread per instance where the backend would start a pool per instance:
    # the miss that loads it then starts no threads, and the one that evicts it joins none (ONNX Runtime's session
    # destructor joins its pool holding the GIL, and those threads, at the compute priority, wait for an idle core).
    # A large batch of a model that batches still borrows idle cores, as parts (backends/row_split.py).
    threads = 1 if on_demand and backend.pool_per_instance else max(1, cpu_count // count)
    lender = spare_cores.current()
    instances = [backend.load(path, plan.config, _instance(plan.config, 0, threads, lender))]
    try:
        signature = instances[0].signature() or backend.describe(path)
        # An endpoint-wide max batch size takes the default's path: only models that can batch get it. Triton's
        # default is for Triton's layout: a model whose version directory is the model (TF Serving's SavedModel
        # layout) takes whole tensors of any batch size its signature allows, as TF Serving runs it.
        tf_serving_layout = path == source.version_path(version)
        max_batch_size = plan.overrides.max_batch_size or (0 if tf_serving_layout else default_max_batch_size)
        config = complete_config(
            plan.config, signature.inputs, signature.outputs, f"{version}/{filename}", max_batch_size
        )
        others = [_instance(config, index, threads, lender) for index in range(1, count)]
        siblings = [instances[0].sibling(settings) for settings in others]
        instances += [sibling for sibling in siblings if sibling is not None]
        instances += _load_instances(backend, path, config, [settings for settings, sibling in zip(others, siblings)
                                                             if sibling is None], parallel=instances[0].runs_async)
        policy = SchedulingPolicy.from_config(config)
        labels = read_labels(config, source.path)
        target = LatencyTarget.from_config(config, count)
        sequences = (SequenceBatcher(source.name, f"{source.name}:{version}", config, count, model_dir=source.path)
                     if config.HasField("sequence_batching") else None)
        _warm_up(source, version, config, instances, warmup_reader)
    except BaseException:
        for instance in instances:
            instance.unload()
        raise
    label = f"{source.name}:{version}"
    statistics = ModelStatistics()
    scheduler = Scheduler(label, instances, policy, statistics, in_flight, spare=lender, threads_per_instance=threads,
                          target=target, slots=sequences.padding if sequences is not None else None)
    served = Signature.from_config(config)
    named = named_signatures(served, instances[0].signature_name(), signature.method, dict(instances[0].signatures()))
    return ServedModel(source.name, version, config, served, scheduler, statistics, named=named, sequences=sequences,
                       labels=labels)


def _instance(config: ModelConfig, index: int, threads: int, lender: spare_cores.SpareCores | None) -> InstanceSettings:
    return InstanceSettings(index, threads, lender, instance_gpu(config, index))


def _load_instances(backend: Backend, path: Path, config: ModelConfig, instances: list[InstanceSettings],
                    parallel: bool) -> list[Model]:
    """The instances `instances` describe, loaded from the model file; `parallel` (instances that are processes of
    their own, which start side by side as TorchServe starts its workers) loads them at once. On a failure, the ones
    loaded unload."""
    if not parallel or len(instances) < 2:
        loaded: list[Model] = []
        try:
            for settings in instances:
                loaded.append(backend.load(path, config, settings))
        except BaseException:
            for instance in loaded:
                instance.unload()
            raise
        return loaded
    with ThreadPoolExecutor(len(instances), thread_name_prefix="instance-load") as pool:
        futures = [pool.submit(backend.load, path, config, settings) for settings in instances]
        wait(futures)
    failed = next((future.exception() for future in futures if future.exception() is not None), None)
    if failed is not None:
        for future in futures:
            if future.exception() is None:
                future.result().unload()
        raise failed
    return [future.result() for future in futures]


def _warm_up(source: ModelSource, version: int, config: ModelConfig, instances: list[Model],
             reader: WarmupReader | None) -> None:
    """Run the config's model_warmup samples, then those `reader` finds in the version's directory, on every
    instance, before the version takes any request."""
    samples = warmup_samples(config, source.path)
    if reader is not None:
        samples += reader(source.version_path(version))
    outputs = [output.name for output in config.output]
    for instance in instances:
        run_warmup(samples, instance, outputs, f"{source.name}:{version}")


def load_ensemble_version(name: str, version: int, plan: LoadPlan, acquire: Acquire,
                          labels: dict[str, tuple[bytes, ...]] | None = None,
                          in_flight: InFlight | None = None) -> ServedModel:
    """An ensemble version: its steps run on the composing models that `acquire` holds at request time.
    `labels`: its outputs' (read_labels, off the event loop, by the caller)."""
    assert plan.ensemble is not None
    statistics = ModelStatistics()
    scheduler = EnsembleScheduler(f"{name}:{version}", plan.ensemble, acquire, in_flight, statistics)
    served = Signature.from_config(plan.config)
    return ServedModel(name, version, plan.config, served, scheduler, statistics,
                       named=named_signatures(served, "", "", {}), labels=labels or {})
