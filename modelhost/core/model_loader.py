"""Loading models into the manager's records: a model under its record's lock (never behind another model's), its
versions side by side, each beside the version that serves until it is swapped in, an ensemble after its composing
models, and a store model's first load inside the budget's admission. The blocking work (model_loading.py) runs in
threads; everything else on the event loop.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Collection
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Protocol

from modelhost.backends.base import Backend
from modelhost.config.model_config_pb2 import ModelConfig
from modelhost.config.overrides import ModelOverrides
from modelhost.core import loading_threads
from modelhost.core.classification import read_labels
from modelhost.core.code_policy import CodePolicy
from modelhost.core.ensemble_dependencies import EnsembleDependencies
from modelhost.core.ensemble_plan import PLATFORM as ENSEMBLE
from modelhost.core.ensemble_plan import Acquire, Resolve
from modelhost.core.in_flight import InFlight
from modelhost.core.lifecycle import ModelState
from modelhost.core.load_request import LoadOverride, write_override
from modelhost.core.model_loading import LoadPlan, load_ensemble_version, load_version, plan_model
from modelhost.core.model_record import ModelRecord, VersionStatus, reason_of
from modelhost.core.served_model import ServedModel
from modelhost.core.version_retirement import VersionRetirement
from modelhost.core.warmup import WarmupReader
from modelhost.errors import ErrorKind, ModelhostError, invalid, not_found, unavailable
from modelhost.store.local import ModelFingerprint, ModelSource
from modelhost.store.model_store import ModelStore
from modelhost.store.paths import check_model_name

log = logging.getLogger("modelhost.manager")  # the manager's own log: these are its loads

Loaded = dict[int, ServedModel | Exception]  # versions loaded before `ModelManager.add` (load_now), or their failures


class LoadBudget(Protocol):
    """What admits a model of the store into memory, or refuses it (a multi-model endpoint's byte budget)."""

    def admitting(self, name: str, source: ModelSource) -> AbstractAsyncContextManager[None]:
        """Around a model's first load: room is made before, its memory measured during, and NO_MEMORY raised
        after, when it cannot fit (the manager then unloads it)."""
        ...

    def removed(self, name: str) -> None:
        """The model left the manager (unloaded or evicted): whatever it was charged is released."""
        ...

    def used(self, name: str) -> None:
        """A request holds the model now (what the budget evicts by)."""
        ...


class ModelLoader:
    """The manager's loads (ModelManager.load, load_all, reload_changed, add), into its `records`. `get` and
    `acquire` are the manager's lookups, which an ensemble's check and its steps use."""

    def __init__(
        self, records: dict[str, ModelRecord], retirement: VersionRetirement, get: Resolve, acquire: Acquire,
        store: ModelStore | None, cpu_count: int, default_max_batch_size: int, in_flight: InFlight,
        overrides: ModelOverrides | None, work_dir: Path | None, code_policy: CodePolicy,
        warmup_reader: WarmupReader | None,
    ) -> None:
        self._records = records
        self._retirement = retirement
        self._get = get
        self._acquire = acquire
        self._store = store
        self._cpu_count = cpu_count
        self._default_max_batch_size = default_max_batch_size
        self._in_flight = in_flight
        self._overrides = overrides
        self._work_dir = work_dir
        self._code_policy = code_policy
        self._warmup_reader = warmup_reader
        self._ensembles = EnsembleDependencies()
        self.budget: LoadBudget | None = None  # ModelManager.set_budget

    async def load_named(
        self, name: str, override: LoadOverride | None, reload: Collection[int] | None, if_needed: bool = False
    ) -> None:
        """Load a model of the store (or of `override`), or reload `reload` of its versions (None: all) and the
        new ones; `if_needed`: only when no version of it serves (an ensemble's composing model)."""
        check_model_name(name)  # before any record or path: a name from a client or a config is just a name
        record = self._records.setdefault(name, ModelRecord(name))
        async with record.lock:
            if if_needed and record.ready_versions() and not record.unloaded:
                return
            # Read before the files are: a change made while the model loads shows at the next poll.
            record.fingerprint = await asyncio.to_thread(self._fingerprint, name, override)
            source, plan = await self._plan(record, override)
            record.unloaded = False
            self._ensembles.forget(name)
            if plan.ensemble is not None:
                await self._prepare_ensemble(record, plan)
            if self.budget is None or record.ready_versions():  # a reload keeps the admission it had
                await self.load_versions(record, source, plan, reload)
                return
            try:
                async with self.budget.admitting(name, source):
                    await self.load_versions(record, source, plan, reload)
            except BaseException as exc:  # not admitted (refused, or a version failed): none of it stays charged
                for version in record.ready_versions():
                    self._retirement.retire(record, version, f"not loaded: {reason_of(exc)}", keep=True)
                if isinstance(exc, ModelhostError) and exc.kind is ErrorKind.NO_MEMORY:
                    self._fail(record, exc)
                raise

    async def _plan(self, record: ModelRecord, override: LoadOverride | None) -> tuple[ModelSource, LoadPlan]:
        """The model's files and how to load them; raises (the record failed, or dropped when the repository does
        not have the model)."""
        name = record.name
        try:
            source = await asyncio.to_thread(self._source, name, override)
            config = override.config if override else None
            uploaded = override is not None and bool(override.files)
            plan = await asyncio.to_thread(plan_model, source, self._overrides, config,
                                           self.code_check(name, uploaded))
        except FileNotFoundError as exc:
            if not record.versions and self._records.get(name) is record:
                del self._records[name]  # not in the repository: nothing to report in the index
            log.error("cannot load model %s: %s", name, exc)
            raise not_found(f"failed to load '{name}', failed to poll from model repository: {exc}") from exc
        except ModelhostError as exc:  # the request's own fault (a bad name or path, refused code): its kind
            self._fail(record, exc)
            raise
        except Exception as exc:
            self._fail(record, exc)
            raise unavailable(f"failed to load '{name}': {reason_of(exc)}") from exc
        return source, plan

    def _source(self, name: str, override: LoadOverride | None) -> ModelSource:
        if override is not None and override.files:
            assert self._work_dir is not None
            return write_override(name, override.files, self._work_dir / "overrides")
        assert self._store is not None
        return self._store.fetch(name)

    def code_check(self, name: str, uploaded: bool) -> Callable[[Backend, ModelConfig], None]:
        """The code policy's check of `name`, which plan_model runs before any of the model's code may run."""

        def check(backend: Backend, config: ModelConfig) -> None:
            code = backend.code_in(config.default_model_filename or backend.default_filename)
            if code is not None:
                self._code_policy.check(name, code, uploaded)

        return check

    def _fingerprint(self, name: str, override: LoadOverride | None) -> ModelFingerprint | None:
        # A model loaded from an override is not the repository's: polling must not take it back.
        if override is not None or self._store is None:
            return None
        return self._store.fingerprint(name)

    def _fail(self, record: ModelRecord, exc: Exception) -> None:
        reason = reason_of(exc)
        if record.ready_versions():
            log.error("model %s failed to reload, the loaded versions keep serving: %s", record.name, reason)
            return
        record.failure = reason
        log.error("model %s failed to load: %s", record.name, reason)

    async def _prepare_ensemble(self, record: ModelRecord, plan: LoadPlan) -> None:
        """Load the composing models an ensemble needs (those loaded already stay as they are)."""
        assert plan.ensemble is not None
        names = sorted({name for name, _ in plan.ensemble.composing_models()})
        self._ensembles.planned(record.name, names)
        try:
            cycle = self._ensembles.cycle(record.name)
            if cycle:
                raise invalid(f"ensemble '{record.name}' depends on itself: {' -> '.join(cycle)}")
            for name in names:
                await self.load_named(name, None, None, if_needed=True)
            plan.ensemble.check_models(self._get)
        except Exception as exc:
            self._fail(record, exc)
            raise unavailable(f"failed to load '{record.name}' (an ensemble): {reason_of(exc)}") from exc
        record.composing = tuple(names)

    async def load_versions(
        self, record: ModelRecord, source: ModelSource, plan: LoadPlan, reload: Collection[int] | None,
        loaded: Loaded | None = None,
    ) -> None:
        """Load the versions `plan` selects that do not serve yet, and reload `reload` (None: all); retire those it
        no longer selects. Raises UNAVAILABLE naming each version that failed (the others serve)."""
        record.failure = ""
        wanted = [v for v in plan.versions if reload is None or v in reload or not record.has_served(v)]
        failures = await asyncio.gather(*(self._load_version(record, source, plan, v, loaded) for v in wanted))
        for version in [v for v in record.versions if v not in plan.versions]:
            self._retirement.retire(record, version, "no longer selected by the version policy",
                                    finish_sequences=True)
        errors = [f"version {v}: {f}" for v, f in zip(wanted, failures) if f]
        if errors:
            raise unavailable(f"failed to load '{record.name}': {'; '.join(errors)}")

    async def _load_version(self, record: ModelRecord, source: ModelSource, plan: LoadPlan, version: int,
                            loaded: Loaded | None = None) -> str:
        """Load one version beside what serves now (or take it from `loaded`) and swap it in; returns the failure,
        or ""."""
        status = record.versions.get(version)
        if status is None or status.served is None:
            status = record.versions[version] = VersionStatus(ModelState.LOADING)
        log.debug("loading model %s version %d from %s", record.name, version, source.path)
        try:
            if plan.ensemble is not None:
                labels = await asyncio.to_thread(read_labels, plan.config, source.path)
                labels = plan.ensemble.inherited_labels(self._get, labels)
                served = load_ensemble_version(record.name, version, plan, self._acquire, labels, self._in_flight)
            elif loaded is not None and version in loaded:
                served = taken(loaded.pop(version))
            else:
                served = await loading_threads.run_loading(
                    load_version, source, version, plan, self._cpu_count, self._default_max_batch_size,
                    self._in_flight, self._warmup_reader, self.budget is not None,
                )
        except Exception as exc:
            reason = reason_of(exc)
            if status.served is None:
                status.state, status.reason = ModelState.UNAVAILABLE, reason
                log.error("model %s version %d failed to load: %s", record.name, version, reason)
            else:
                log.error("model %s version %d failed to reload, the loaded one keeps serving: %s",
                          record.name, version, reason)
            return reason
        previous = status.served
        status.served, status.state, status.reason = served, ModelState.READY, ""
        if previous is not None:
            self._retirement.retire_served(previous, finish_sequences=True)
        backend = plan.backend.name if plan.backend else ENSEMBLE
        # A multi-model endpoint's models (not the store's) load and leave hundreds of times a second: a line each
        # would cost its loop a tenth of a miss; the cache's metrics count them.
        log.log(logging.INFO if record.from_store else logging.DEBUG, "%s model %s version %d from %s (%s)",
                "reloaded" if previous else "loaded", record.name, version, source.path, backend)
        return ""

    def plan(self, source: ModelSource) -> LoadPlan:
        """How `ModelManager.add` would load `source` (blocking)."""
        return plan_model(source, self._overrides, check_code=self.code_check(source.name, uploaded=False))

    def load_now(self, source: ModelSource, plan: LoadPlan) -> Loaded:
        """The versions `plan` selects, each loaded as `ModelManager.add` loads it, or what failed (blocking)."""
        assert plan.backend is not None, "an ensemble loads on the event loop"
        loaded: Loaded = {}
        for version in plan.versions:
            try:
                loaded[version] = load_version(source, version, plan, self._cpu_count, self._default_max_batch_size,
                                               self._in_flight, self._warmup_reader, self.budget is not None)
            except Exception as exc:  # noqa: BLE001 - `add` reports it as its own load's failure
                loaded[version] = exc
        return loaded


def taken(version: ServedModel | Exception) -> ServedModel:
    """A version `load_now` loaded, or its failure raised."""
    if isinstance(version, Exception):
        raise version
    return version


async def discard_loaded(loaded: Loaded | None) -> None:
    """Stop the versions `load_now` loaded that no model took in."""
    if loaded:
        versions = list(loaded.values())
        loaded.clear()
        await asyncio.gather(*(v.scheduler.stop() for v in versions if isinstance(v, ServedModel)))
