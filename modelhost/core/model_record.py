"""What the manager knows of one model: its versions' states and reasons, and what it was loaded from."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field, replace

from modelhost.core.lifecycle import ModelState
from modelhost.core.served_model import ServedModel
from modelhost.errors import ModelhostError, public_message
from modelhost.store.local import ModelFingerprint


@dataclass(slots=True)
class VersionStatus:
    state: ModelState
    reason: str = ""
    served: ServedModel | None = None


@dataclass(frozen=True, slots=True)
class IndexEntry:
    name: str
    version: str
    state: str
    reason: str


@dataclass(slots=True)
class ModelRecord:
    name: str
    versions: dict[int, VersionStatus] = field(default_factory=dict)
    # Set when the model failed before any version could be tried (unreadable config, no backend).
    failure: str = ""
    # Unloaded on request: not routed to, and not counted against readiness.
    unloaded: bool = False
    # The repository's files as last loaded (None for a model loaded from elsewhere), for polling.
    fingerprint: ModelFingerprint | None = None
    # An ensemble's composing models.
    composing: tuple[str, ...] = ()
    # False for a model `ModelManager.add` loaded from elsewhere than the store (its files are not the store's).
    from_store: bool = True
    # Serializes this model's loads and unloads; requests never take it.
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    def ready_versions(self) -> list[int]:
        return sorted(v for v, status in self.versions.items() if status.state is ModelState.READY)

    def has_served(self, version: int) -> bool:
        status = self.versions.get(version)
        return status is not None and status.served is not None

    def all_ready(self) -> bool:
        return not self.failure and all(s.state is ModelState.READY for s in self.versions.values())

    def why_not_ready(self) -> str:
        if self.failure:
            return self.failure
        reasons = [f"version {v}: {s.reason or s.state.value}" for v, s in sorted(self.versions.items())]
        return "; ".join(reasons) or "no version loaded"

    def index(self) -> list[IndexEntry]:
        entries = [IndexEntry(self.name, "", ModelState.UNAVAILABLE.value, self.failure)] if self.failure else []
        for version, status in sorted(self.versions.items()):
            entries.append(IndexEntry(self.name, str(version), status.state.value, status.reason))
        if not entries:  # its config is being read: no version is known yet
            entries.append(IndexEntry(self.name, "", ModelState.LOADING.value if self.lock.locked() else "", ""))
        return entries


def for_clients(entry: IndexEntry) -> IndexEntry:
    """The entry with a reason fit for clients: no server paths (the log has them)."""
    return replace(entry, reason=public_message(entry.reason)) if entry.reason else entry


def reason_of(exc: BaseException) -> str:
    if isinstance(exc, ModelhostError):
        return exc.message
    return str(exc) or type(exc).__name__
