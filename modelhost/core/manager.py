"""Holds the loaded models: (name, version) -> ServedModel, with each version's state and reason.

Loads, reloads and unloads of one model are serialized by that model's own lock and never wait for
another model's. A reload is zero-downtime: the new version loads (and warms up) beside the old one,
which keeps serving; then requests route to the new one, and the old one finishes what it has queued
before it unloads. A failed reload keeps the old version serving. An ensemble's composing models are
found per request, so an ensemble follows their reloads.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Collection, Iterable
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Protocol

from modelhost.backends import freeze_long_lived
from modelhost.backends.base import Backend
from modelhost.config.model_config_pb2 import ModelConfig
from modelhost.config.overrides import ModelOverrides
from modelhost.core import loading_threads
from modelhost.core.classification import read_labels
from modelhost.core.code_policy import CodePolicy
from modelhost.core.ensemble_plan import PLATFORM as ENSEMBLE
from modelhost.core.in_flight import InFlight
from modelhost.core.lifecycle import ModelState
from modelhost.core.load_request import LoadOverride, write_override
from modelhost.core.model_hold import ModelHold
from modelhost.core.model_loading import LoadPlan, load_ensemble_version, load_version, plan_model
from modelhost.core.model_record import IndexEntry, ModelRecord, VersionStatus, reason_of
from modelhost.core.served_model import ServedModel
from modelhost.core.warmup import WarmupReader
from modelhost.errors import ErrorKind, ModelhostError, invalid, not_found, unavailable
from modelhost.store.local import ModelFingerprint, ModelSource
from modelhost.store.model_store import ModelStore
from modelhost.store.paths import check_model_name

log = logging.getLogger("modelhost.manager")

Loaded = dict[int, ServedModel | Exception]  # versions loaded before `ModelManager.add` (load_now), or their failures

__all__ = ["IndexEntry", "Loaded", "ModelManager", "discard_loaded"]


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


class ModelManager:
    def __init__(
        self, store: ModelStore | None, cpu_count: int, default_max_batch_size: int, in_flight: InFlight | None = None,
        overrides: ModelOverrides | None = None, work_dir: Path | None = None, code_policy: CodePolicy | None = None,
        warmup_reader: WarmupReader | None = None,
    ) -> None:
        """`warmup_reader`: warmup requests in another server's format that a version's directory may hold
        (TF Serving's), replayed with the config's model_warmup before the version serves."""
        self._store = store
        self._warmup_reader = warmup_reader
        self._code_policy = code_policy or CodePolicy()
        self._overrides = overrides
        self._in_flight = in_flight or InFlight()
        self._cpu_count = cpu_count
        self._default_max_batch_size = default_max_batch_size
        self._work_dir = work_dir
        self._records: dict[str, ModelRecord] = {}
        self._budget: LoadBudget | None = None
        self._retiring: set[asyncio.Task[None]] = set()
        # Reloaded-away versions whose sequences go on (hold_sequence); a list: a ServedModel does not hash.
        self._finishing: list[ServedModel] = []
        self._depends: dict[str, set[str]] = {}  # ensemble -> its composing models, as last planned

    def set_budget(self, budget: LoadBudget) -> None:
        """Every later load of a model of the store goes through `budget` (a multi-model endpoint's cache)."""
        self._budget = budget

    # loading

    async def load_all(self, names: Iterable[str] | None = None) -> None:
        """Load the named models of the store, or all of them (none without a store). Models load
        concurrently and fail alone; an ensemble waits for its composing models (loading them if needed)."""
        if self._store is None:
            return
        wanted = list(names) if names is not None else await asyncio.to_thread(self._store.list)
        results = await asyncio.gather(*(self._load_named(n, None, None) for n in wanted), return_exceptions=True)
        for name, result in zip(wanted, results):
            if isinstance(result, BaseException) and not isinstance(result, Exception):
                raise result
            if isinstance(result, ModelhostError) and name not in self._records:  # refused before it had a record
                log.error("cannot load model %r: %s", name, result.message)
        if wanted:
            freeze_long_lived()  # what these loads keep, out of the cyclic GC's full collections

    async def load(self, name: str, override: LoadOverride | None = None) -> None:
        """Load a model of the store, or reload every version of a loaded one (zero-downtime).
        Raises when the model or any of its versions fails; a version that was serving keeps serving."""
        if self._store is None:
            raise ModelhostError(ErrorKind.UNSUPPORTED, f"cannot load model '{name}': this server has no repository")
        await self._load_named(name, override, None)

    async def reload_changed(self, name: str, versions: Collection[int] | None) -> None:
        """Apply a repository change: load new versions, reload `versions` (None: all), unload the
        versions the policy no longer selects. Raises as `load` does."""
        await self._load_named(name, None, versions)

    async def _load_named(
        self, name: str, override: LoadOverride | None, reload: Collection[int] | None, if_needed: bool = False
    ) -> None:
        check_model_name(name)  # before any record or path: a name from a client or a config is just a name
        record = self._records.setdefault(name, ModelRecord(name))
        async with record.lock:
            if if_needed and record.ready_versions() and not record.unloaded:
                return
            # Read before the files are: a change made while the model loads shows at the next poll.
            record.fingerprint = await asyncio.to_thread(self._fingerprint, name, override)
            try:
                source = await asyncio.to_thread(self._source, name, override)
                config = override.config if override else None
                uploaded = override is not None and bool(override.files)
                plan = await asyncio.to_thread(plan_model, source, self._overrides, config,
                                               self._code_check(name, uploaded))
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
            record.unloaded = False
            self._depends.pop(name, None)
            if plan.ensemble is not None:
                await self._prepare_ensemble(record, plan)
            if self._budget is None or record.ready_versions():  # a reload keeps the admission it had
                await self._load_versions(record, source, plan, reload)
                return
            try:
                async with self._budget.admitting(name, source):
                    await self._load_versions(record, source, plan, reload)
            except BaseException as exc:  # not admitted (refused, or a version failed): none of it stays charged
                for version in record.ready_versions():
                    self._retire(record, version, f"not loaded: {reason_of(exc)}", keep=True)
                if isinstance(exc, ModelhostError) and exc.kind is ErrorKind.NO_MEMORY:
                    self._fail(record, exc)
                raise

    def _source(self, name: str, override: LoadOverride | None) -> ModelSource:
        if override is not None and override.files:
            assert self._work_dir is not None
            return write_override(name, override.files, self._work_dir / "overrides")
        assert self._store is not None
        return self._store.fetch(name)

    def _code_check(self, name: str, uploaded: bool) -> Callable[[Backend, ModelConfig], None]:
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
        # Recorded before the first await, so that of two ensembles that need each other (loading at
        # once, each holding its own lock), the second to get here sees the cycle instead of deadlocking.
        self._depends[record.name] = set(names)
        try:
            cycle = self._cycle(record.name)
            if cycle:
                raise invalid(f"ensemble '{record.name}' depends on itself: {' -> '.join(cycle)}")
            for name in names:
                await self._load_named(name, None, None, if_needed=True)
            plan.ensemble.check_models(self.get)
        except Exception as exc:
            self._fail(record, exc)
            raise unavailable(f"failed to load '{record.name}' (an ensemble): {reason_of(exc)}") from exc
        record.composing = tuple(names)

    def _cycle(self, start: str) -> list[str]:
        """A path from `start` back to itself through ensembles' composing models, or []."""
        stack: list[tuple[str, list[str]]] = [(start, [start])]
        seen: set[str] = set()
        while stack:
            name, path = stack.pop()
            for dependency in self._depends.get(name, ()):
                if dependency == start:
                    return [*path, start]
                if dependency not in seen:
                    seen.add(dependency)
                    stack.append((dependency, [*path, dependency]))
        return []

    async def _load_versions(
        self, record: ModelRecord, source: ModelSource, plan: LoadPlan, reload: Collection[int] | None,
        loaded: Loaded | None = None,
    ) -> None:
        record.failure = ""
        wanted = [v for v in plan.versions if reload is None or v in reload or not record.has_served(v)]
        failures = await asyncio.gather(*(self._load_version(record, source, plan, v, loaded) for v in wanted))
        for version in [v for v in record.versions if v not in plan.versions]:
            self._retire(record, version, "no longer selected by the version policy", finish_sequences=True)
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
                served = load_ensemble_version(record.name, version, plan, self.acquire, labels, self._in_flight)
            elif loaded is not None and version in loaded:
                served = taken(loaded.pop(version))
            else:
                served = await loading_threads.run_loading(
                    load_version, source, version, plan, self._cpu_count, self._default_max_batch_size,
                    self._in_flight, self._warmup_reader, self._budget is not None,
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
            self._retire_served(previous, finish_sequences=True)
        backend = plan.backend.name if plan.backend else ENSEMBLE
        # A multi-model endpoint's models (not the store's) load and leave hundreds of times a second: a line each
        # would cost its loop a tenth of a miss; the cache's metrics count them.
        log.log(logging.INFO if record.from_store else logging.DEBUG, "%s model %s version %d from %s (%s)",
                "reloaded" if previous else "loaded", record.name, version, source.path, backend)
        return ""

    # unloading

    async def unload(self, name: str, unload_dependents: bool = False) -> None:
        """Stop routing to every version of a model, and return once they have drained and unloaded.
        With `unload_dependents`, an ensemble's composing models unload too, unless another loaded
        ensemble uses them."""
        record = self._records.get(name)
        if record is None:
            raise _unknown(name)
        async with record.lock:
            drained = [self._retire(record, v, "unloaded", keep=True) for v in list(record.versions)]
            record.failure, record.unloaded, record.fingerprint = "", True, None
            await asyncio.gather(*(task for task in drained if task is not None))
        await self._removed(record)
        log.info("unloaded model %s", name)
        if unload_dependents:
            for composing in record.composing:
                if not any(composing in r.composing for r in self._records.values() if r.ready_versions()):
                    await self.unload(composing, unload_dependents=True)

    def _retire(self, record: ModelRecord, version: int, reason: str, keep: bool = False,
                finish_sequences: bool = False) -> asyncio.Task[None] | None:
        """Stop routing to a version; its queued requests finish on it, then it unloads. `finish_sequences` (a
        reload: another version takes the new requests): its open sequences go on on it until they end or idle
        out (`hold_sequence`)."""
        status = record.versions[version] if keep else record.versions.pop(version)
        served, status.served = status.served, None
        status.state, status.reason = ModelState.UNAVAILABLE, reason
        return self._retire_served(served, finish_sequences) if served is not None else None

    def _retire_served(self, served: ServedModel, finish_sequences: bool = False) -> asyncio.Task[None]:
        task = asyncio.get_running_loop().create_task(self._stop_when_released(served, finish_sequences))
        self._retiring.add(task)
        task.add_done_callback(self._retiring.discard)
        return task

    async def _stop_when_released(self, served: ServedModel, finish_sequences: bool) -> None:
        """Requests holding the version finish on it (ModelManager.acquire), and, after a reload, its open
        sequences (each ends or idles out); then its queue closes and drains."""
        if finish_sequences and served.sequences is not None:
            self._finishing.append(served)
            try:
                await served.sequences.finished()
            finally:
                self._finishing = [other for other in self._finishing if other is not served]
        await served.pins.released()
        await served.scheduler.stop()

    def hold_sequence(self, name: str, sequence_id: int | str) -> ServedModel | None:
        """A reloaded-away version of the model on which this sequence is open, pinned as `hold` pins; None when
        there is none (the rare path: a sequence request the serving version does not know)."""
        for served in self._finishing:
            if served.name == name and served.sequences is not None and served.sequences.is_open(sequence_id):
                served.pins.hold()
                return served
        return None

    # models that are not the store's (a multi-model endpoint's archives)

    def plan(self, source: ModelSource) -> LoadPlan:
        """How `add` would load `source` (its config read and completed by the overrides); blocking, for a caller
        that prepares a load in a thread of its own."""
        return plan_model(source, self._overrides, check_code=self._code_check(source.name, uploaded=False))

    async def add(self, source: ModelSource, plan: LoadPlan | None = None, loaded: Loaded | None = None) -> None:
        """Load a model the store does not list under `source.name`, as `plan` says (by default, `plan(source)`);
        `loaded`: its versions `load_now` loaded already (in the caller's thread), taken in as they are.

        Raises ALREADY_EXISTS for a name in use, and UNAVAILABLE (dropping the model's record) when no version loads.
        """
        if source.name in self._records:
            await discard_loaded(loaded)
            raise ModelhostError(ErrorKind.ALREADY_EXISTS, f"model '{source.name}' is already loaded")
        record = self._records[source.name] = ModelRecord(source.name, from_store=False)
        try:
            if plan is None:
                plan = await asyncio.to_thread(self.plan, source)
            elif plan.backend is not None:  # a plan made elsewhere: the policy still decides
                self._code_check(source.name, uploaded=False)(plan.backend, plan.config)
            await self._load_versions(record, source, plan, None, loaded)
        except BaseException as exc:
            await discard_loaded(loaded)  # what it did not take in
            await self._evict_record(record)
            if isinstance(exc, ModelhostError) or not isinstance(exc, Exception):
                raise
            raise unavailable(f"failed to load '{source.name}': {reason_of(exc)}") from exc

    def load_now(self, source: ModelSource, plan: LoadPlan) -> Loaded:
        """Blocking, for a caller's own thread (one that fetched the model's files and planned it with `plan`): the
        versions `plan` selects, each loaded as `add` loads it, or what failed. Give them to `add` (`loaded`), or to
        `discard_loaded`."""
        assert plan.backend is not None, "an ensemble loads on the event loop"
        loaded: Loaded = {}
        for version in plan.versions:
            try:
                loaded[version] = load_version(source, version, plan, self._cpu_count, self._default_max_batch_size,
                                               self._in_flight, self._warmup_reader, self._budget is not None)
            except Exception as exc:  # noqa: BLE001 - `add` reports it as its own load's failure
                loaded[version] = exc
        return loaded

    async def evict(self, name: str) -> None:
        """Stop routing to a model at once, then let its in-flight requests finish, unload it and drop its record
        (a multi-model cache's eviction; a model gone from a polled repository)."""
        record = self._records.get(name)
        if record is None:
            raise not_found(f"Request for unknown model: '{name}' is not found")
        await self._evict_record(record)

    async def _evict_record(self, record: ModelRecord) -> None:
        if self._records.get(record.name) is record:
            del self._records[record.name]
        drained = [self._retire(record, v, "unloaded") for v in list(record.versions)]
        await asyncio.gather(*(task for task in drained if task is not None))
        await self._removed(record)

    async def _removed(self, record: ModelRecord) -> None:
        """A model left, drained: its budget charge and the files its store fetched for it are released, unless
        it is being loaded again meanwhile (an evicted model's next request, under a new record; a load after an
        unload, holding the record's lock): that load may be using the same fetched files, and its own unload
        releases them."""
        name = record.name
        if self._budget is not None:
            self._budget.removed(name)
        current = self._records.get(name)
        loading_again = current is not None and (current is not record or record.lock.locked())
        if self._store is not None and record.from_store and not loading_again:
            await asyncio.to_thread(self._store.release, name)

    # routing and reporting

    def acquire(self, name: str, version: str = "") -> ModelHold:
        """`async with manager.acquire(name, version) as model:` the version `get` gives, held for the block: a
        reload, unload or eviction meanwhile lets it finish before the version stops."""
        return ModelHold(lambda: self.hold(name, version))

    def in_use(self, name: str) -> bool:
        """Whether a request holds a version of the model now (the multi-model cache evicts only idle models)."""
        record = self._records.get(name)
        return record is not None and any(
            status.served is not None and status.served.pins.count for status in record.versions.values())

    async def idle(self, name: str) -> None:
        """Returns once no request holds a version of the model (at once when none does or it is unknown)."""
        while (record := self._records.get(name)) is not None and self.in_use(name):
            await asyncio.gather(*(status.served.pins.released() for status in record.versions.values()
                                   if status.served is not None))

    def hold(self, name: str, version: str = "") -> ServedModel:
        """The version `get` gives, pinned (what `acquire` does on entry, without its objects, for a hot path):
        the caller must call `served.pins.release()` once done."""
        served = self.get(name, version)
        served.pins.hold()
        if self._budget is not None:
            self._budget.used(name)
        return served

    def get(self, name: str, version: str = "") -> ServedModel:
        """The ready model a request should use; raises NOT_FOUND or UNAVAILABLE."""
        record = self._records.get(name)
        if record is None:
            raise _unknown(name)
        if record.unloaded:
            raise not_found(f"Request for unknown model: '{name}' has no available versions (it is unloaded)")
        if not version:
            ready = record.ready_versions()
            if not ready:
                raise unavailable(f"model '{name}' is not ready: {record.why_not_ready()}")
            served = record.versions[ready[-1]].served
        else:
            if not version.isdigit():
                raise invalid(f"model version '{version}' of model '{name}' is not a number")
            status = record.versions.get(int(version))
            if status is None and record.failure:
                raise unavailable(f"model '{name}' version {version} is not ready: {record.failure}")
            if status is None:
                raise not_found(f"Request for unknown model: '{name}' version {version} is not found")
            if status.state is not ModelState.READY:
                raise unavailable(f"model '{name}' version {version} is not ready: {status.reason}")
            served = status.served
        assert served is not None
        return served

    def versions(self, name: str) -> list[int]:
        record = self._records.get(name)
        return record.ready_versions() if record else []

    def names(self) -> list[str]:
        return sorted(self._records)

    def knows(self, name: str) -> bool:
        return name in self._records

    def fingerprint(self, name: str) -> ModelFingerprint | None:
        """The repository files a model was last loaded from (None: unknown, or loaded from elsewhere)."""
        record = self._records.get(name)
        return record.fingerprint if record else None

    def all_ready(self) -> bool:
        """Every model and version the repository asked for is READY (Triton's strict readiness);
        models unloaded on request are not asked for."""
        return all(r.unloaded or r.all_ready() for r in self._records.values())

    def all_serving(self) -> bool:
        """At least one model, and every model the repository asked for has a READY version (a reload in
        progress still serves the old one); models unloaded on request are not asked for."""
        asked = [r for r in self._records.values() if not r.unloaded]
        return bool(asked) and all(r.ready_versions() for r in asked)

    def index(self, ready_only: bool = False) -> list[IndexEntry]:
        entries = [entry for record in sorted(self._records.values(), key=lambda r: r.name) for entry in record.index()]
        if ready_only:
            entries = [e for e in entries if e.state == ModelState.READY.value]
        return entries

    def index_of(self, name: str) -> list[IndexEntry]:
        """One model's entries of `index` (NOT_FOUND when it is unknown)."""
        record = self._records.get(name)
        if record is None:
            raise _unknown(name)
        return record.index()

    def served(self, name: str = "") -> list[ServedModel]:
        """Loaded versions, of every model or of the one named (NOT_FOUND when it is unknown)."""
        if name and name not in self._records:
            raise _unknown(name)
        records = [self._records[name]] if name else list(self._records.values())
        return [s.served for r in records for s in r.versions.values() if s.served is not None]

    async def stop(self) -> None:
        """Drain every model's in-flight requests, then unload them."""
        for served in self._finishing:  # a reloaded-away version's open sequences do not hold the stop up
            assert served.sequences is not None
            served.sequences.close_all()
        await asyncio.gather(*(served.scheduler.stop() for served in self.served()), *self._retiring)


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


def _unknown(name: str) -> ModelhostError:
    """NOT_FOUND for a name the manager does not hold; INVALID_INPUT when it is not a model name at all.
    (Checked on a miss only: names held, such as a multi-model archive's "dir/m.tar.gz", are never checked.)"""
    try:
        check_model_name(name)
    except ModelhostError as exc:
        return exc
    return not_found(f"Request for unknown model: '{name}' is not found")
