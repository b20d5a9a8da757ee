"""Holds the loaded models: (name, version) -> ServedModel, with each version's state and reason.

Models load concurrently at start; a model that fails to load is UNAVAILABLE with its
reason and never affects the others.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field

from modelhost.config.overrides import ModelOverrides
from modelhost.core.lifecycle import ModelState
from modelhost.core.load import ServerLoad
from modelhost.core.loader import ServedModel, load_version, plan_model
from modelhost.errors import ErrorKind, ModelhostError, invalid, not_found, unavailable
from modelhost.store.local import LocalStore, ModelSource

log = logging.getLogger("modelhost.manager")


@dataclass(slots=True)
class VersionStatus:
    state: ModelState
    reason: str = ""
    served: ServedModel | None = None


@dataclass(slots=True)
class ModelRecord:
    name: str
    versions: dict[int, VersionStatus] = field(default_factory=dict)
    # Set when the model failed before any version could be tried (unreadable config, no backend).
    failure: str = ""

    def ready_versions(self) -> list[int]:
        return sorted(v for v, status in self.versions.items() if status.state is ModelState.READY)


@dataclass(frozen=True, slots=True)
class IndexEntry:
    name: str
    version: str
    state: str
    reason: str


class ModelManager:
    def __init__(
        self, store: LocalStore | None, cpu_count: int, default_max_batch_size: int, load: ServerLoad | None = None,
        overrides: ModelOverrides | None = None,
    ) -> None:
        self._store = store
        self._overrides = overrides
        self._load = load or ServerLoad()
        self._cpu_count = cpu_count
        self._default_max_batch_size = default_max_batch_size
        self._records: dict[str, ModelRecord] = {}

    async def load_all(self) -> None:
        """Load every model of the store (none without one: a multi-model endpoint adds its models)."""
        if self._store is None:
            return
        names = await asyncio.to_thread(self._store.list)
        await asyncio.gather(*(self._load_model(name) for name in names))

    async def _load_model(self, name: str) -> None:
        record = self._records.setdefault(name, ModelRecord(name))
        try:
            assert self._store is not None
            source = await asyncio.to_thread(self._store.fetch, name)
        except Exception as exc:
            record.failure = _reason(exc)
            log.error("model %s failed to load: %s", name, record.failure)
            return
        await self._load_source(record, source)

    async def _load_source(self, record: ModelRecord, source: ModelSource) -> None:
        name = record.name
        try:
            plan = await asyncio.to_thread(plan_model, source, self._overrides)
        except Exception as exc:
            record.failure = _reason(exc)
            log.error("model %s failed to load: %s", name, record.failure)
            return
        for version in plan.versions:
            record.versions[version] = VersionStatus(ModelState.LOADING)
        for version in plan.versions:
            status = record.versions[version]
            try:
                status.served = await asyncio.to_thread(
                    load_version, source, version, plan, self._cpu_count, self._default_max_batch_size, self._load
                )
            except Exception as exc:
                status.state, status.reason = ModelState.UNAVAILABLE, _reason(exc)
                log.error("model %s version %d failed to load: %s", name, version, status.reason)
                continue
            status.state = ModelState.READY
            log.info("loaded model %s version %d from %s (%s)", name, version, source.path, plan.backend.name)

    async def add(self, source: ModelSource) -> None:
        """Load a model the store does not list (a multi-model endpoint's archive) under `source.name`.

        Raises ALREADY_EXISTS for a name in use, and UNAVAILABLE (forgetting the model) when no version loads.
        """
        if source.name in self._records:
            raise ModelhostError(ErrorKind.ALREADY_EXISTS, f"model '{source.name}' is already loaded")
        record = self._records[source.name] = ModelRecord(source.name)
        try:
            await self._load_source(record, source)
        except BaseException:
            await self._forget(record)
            raise
        if not record.ready_versions():
            await self._forget(record)
            raise unavailable(f"model '{source.name}' failed to load: {self._why_not_ready(record)}")

    async def remove(self, name: str) -> None:
        """Stop routing to a model at once, then drain its in-flight requests and unload it."""
        record = self._records.get(name)
        if record is None:
            raise not_found(f"Request for unknown model: '{name}' is not found")
        await self._forget(record)

    async def _forget(self, record: ModelRecord) -> None:
        if self._records.get(record.name) is record:
            del self._records[record.name]
        for status in record.versions.values():
            status.state = ModelState.UNLOADING
        await asyncio.gather(*(s.served.scheduler.stop() for s in record.versions.values() if s.served is not None))

    def get(self, name: str, version: str = "") -> ServedModel:
        """The ready model a request should use; raises NOT_FOUND or UNAVAILABLE."""
        record = self._records.get(name)
        if record is None:
            raise not_found(f"Request for unknown model: '{name}' is not found")
        if not version:
            ready = record.ready_versions()
            if not ready:
                raise unavailable(f"model '{name}' is not ready: {self._why_not_ready(record)}")
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

    def _why_not_ready(self, record: ModelRecord) -> str:
        if record.failure:
            return record.failure
        reasons = [f"version {v}: {s.reason or s.state.value}" for v, s in sorted(record.versions.items())]
        return "; ".join(reasons) or "no version loaded"

    def versions(self, name: str) -> list[int]:
        record = self._records.get(name)
        return record.ready_versions() if record else []

    def all_ready(self) -> bool:
        """Every model and version the repository asked for is READY (Triton's strict readiness)."""
        return all(
            not r.failure and all(s.state is ModelState.READY for s in r.versions.values())
            for r in self._records.values()
        )

    def loading(self) -> bool:
        return any(s.state is ModelState.LOADING for r in self._records.values() for s in r.versions.values())

    def index(self, ready_only: bool = False) -> list[IndexEntry]:
        entries = []
        for record in sorted(self._records.values(), key=lambda r: r.name):
            if record.failure:
                entries.append(IndexEntry(record.name, "", ModelState.UNAVAILABLE.value, record.failure))
            for version, status in sorted(record.versions.items()):
                entries.append(IndexEntry(record.name, str(version), status.state.value, status.reason))
        if ready_only:
            entries = [e for e in entries if e.state == ModelState.READY.value]
        return entries

    def served(self, name: str = "") -> list[ServedModel]:
        """Loaded versions, of every model or of the one named (NOT_FOUND when it is unknown)."""
        if name and name not in self._records:
            raise not_found(f"Request for unknown model: '{name}' is not found")
        records = [self._records[name]] if name else list(self._records.values())
        return [s.served for r in records for s in r.versions.values() if s.served is not None]

    async def stop(self) -> None:
        """Drain every model's in-flight requests, then unload them."""
        await asyncio.gather(*(served.scheduler.stop() for served in self.served()))


def _reason(exc: Exception) -> str:
    if isinstance(exc, ModelhostError):
        return exc.message
    return str(exc) or type(exc).__name__
