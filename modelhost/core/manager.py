"""Holds the loaded models: (name, version) -> ServedModel, with each version's state and reason.

Loads, reloads and unloads of one model are serialized by that model's own lock and never wait for
another model's. A reload is zero-downtime: the new version loads (and warms up) beside the old one,
which keeps serving; then requests route to the new one, and the old one finishes what it has queued
before it unloads. A failed reload keeps the old version serving. An ensemble's composing models are
found per request, so an ensemble follows their reloads.

The manager routes requests and reports the index; its loads are core/model_loader.py's, and versions leave
through core/version_retirement.py.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Collection, Iterable
from pathlib import Path

from modelhost.backends import freeze_long_lived
from modelhost.config.overrides import ModelOverrides
from modelhost.core.code_policy import CodePolicy
from modelhost.core.in_flight import InFlight
from modelhost.core.lifecycle import ModelState
from modelhost.core.load_request import LoadOverride
from modelhost.core.model_hold import ModelHold
from modelhost.core.model_loader import LoadBudget, Loaded, ModelLoader, discard_loaded
from modelhost.core.model_loading import LoadPlan
from modelhost.core.model_record import IndexEntry, ModelRecord, reason_of
from modelhost.core.served_model import ServedModel
from modelhost.core.version_retirement import VersionRetirement
from modelhost.core.warmup import WarmupReader
from modelhost.digits import is_digits
from modelhost.errors import ErrorKind, ModelhostError, invalid, not_found, unavailable
from modelhost.store.local import ModelFingerprint, ModelSource
from modelhost.store.model_store import ModelStore
from modelhost.store.paths import check_model_name

log = logging.getLogger("modelhost.manager")

__all__ = ["IndexEntry", "ModelManager"]


class ModelManager:
    def __init__(
        self, store: ModelStore | None, cpu_count: int, default_max_batch_size: int, in_flight: InFlight | None = None,
        overrides: ModelOverrides | None = None, work_dir: Path | None = None, code_policy: CodePolicy | None = None,
        warmup_reader: WarmupReader | None = None,
    ) -> None:
        """`warmup_reader`: warmup requests in another server's format that a version's directory may hold
        (TF Serving's), replayed with the config's model_warmup before the version serves."""
        self._store = store
        self._records: dict[str, ModelRecord] = {}
        self._budget: LoadBudget | None = None
        self._retirement = VersionRetirement()
        self._loader = ModelLoader(
            self._records, self._retirement, self.get, self.acquire, store, cpu_count, default_max_batch_size,
            in_flight or InFlight(), overrides, work_dir, code_policy or CodePolicy(), warmup_reader,
        )

    def set_budget(self, budget: LoadBudget) -> None:
        """Every later load of a model of the store goes through `budget` (a multi-model endpoint's cache)."""
        self._budget = self._loader.budget = budget

    # loading

    async def load_all(self, names: Iterable[str] | None = None) -> None:
        """Load the named models of the store, or all of them (none without a store). Models load
        concurrently and fail alone; an ensemble waits for its composing models (loading them if needed)."""
        if self._store is None:
            return
        wanted = list(names) if names is not None else await asyncio.to_thread(self._store.list)
        results = await asyncio.gather(*(self._loader.load_named(n, None, None) for n in wanted),
                                       return_exceptions=True)
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
        await self._loader.load_named(name, override, None)

    async def reload_changed(self, name: str, versions: Collection[int] | None) -> None:
        """Apply a repository change: load new versions, reload `versions` (None: all), unload the
        versions the policy no longer selects. Raises as `load` does."""
        await self._loader.load_named(name, None, versions)

    # unloading

    async def unload(self, name: str, unload_dependents: bool = False) -> None:
        """Stop routing to every version of a model, and return once they have drained and unloaded.
        With `unload_dependents`, an ensemble's composing models unload too, unless another loaded
        ensemble uses them."""
        record = self._records.get(name)
        if record is None:
            raise _unknown(name)
        async with record.lock:
            drained = [self._retirement.retire(record, v, "unloaded", keep=True) for v in list(record.versions)]
            record.failure, record.unloaded, record.fingerprint = "", True, None
            await asyncio.gather(*(task for task in drained if task is not None))
        await self._removed(record)
        log.info("unloaded model %s", name)
        if unload_dependents:
            for composing in record.composing:
                if not any(composing in r.composing for r in self._records.values() if r.ready_versions()):
                    await self.unload(composing, unload_dependents=True)

    def hold_sequence(self, name: str, sequence_id: int | str) -> ServedModel | None:
        """A reloaded-away version of the model on which this sequence is open, pinned as `hold` pins; None when
        there is none (the rare path: a sequence request the serving version does not know)."""
        return self._retirement.hold_sequence(name, sequence_id)

    # models that are not the store's (a multi-model endpoint's archives)

    def plan(self, source: ModelSource) -> LoadPlan:
        """How `add` would load `source` (its config read and completed by the overrides); blocking, for a caller
        that prepares a load in a thread of its own."""
        return self._loader.plan(source)

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
                plan = await asyncio.to_thread(self._loader.plan, source)
            elif plan.backend is not None:  # a plan made elsewhere: the policy still decides
                self._loader.code_check(source.name, uploaded=False)(plan.backend, plan.config)
            await self._loader.load_versions(record, source, plan, None, loaded)
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
        return self._loader.load_now(source, plan)

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
        drained = [self._retirement.retire(record, v, "unloaded") for v in list(record.versions)]
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
            if not is_digits(version):
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

    def names_view(self) -> Collection[str]:
        """The names of the models it knows, as a live view (membership and count without a copy)."""
        return self._records.keys()

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
        self._retirement.close_sequences()  # a reloaded-away version's open sequences do not hold the stop up
        await asyncio.gather(*(served.scheduler.stop() for served in self.served()), *self._retirement.under_way())


def _unknown(name: str) -> ModelhostError:
    """NOT_FOUND for a name the manager does not hold; INVALID_INPUT when it is not a model name at all.
    (Checked on a miss only: names held, such as a multi-model archive's "dir/m.tar.gz", are never checked.)"""
    try:
        check_model_name(name)
    except ModelhostError as exc:
        return exc
    return not_found(f"Request for unknown model: '{name}' is not found")
