"""Repository control (Triton's model control modes): the index, and load/unload where the mode allows them."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Protocol

from modelhost.core.lifecycle import ModelState
from modelhost.core.load_request import LoadOverride, LoadRequest, check_load_request
from modelhost.core.manager import IndexEntry, ModelManager
from modelhost.core.model_record import for_clients
from modelhost.digits import is_digits
from modelhost.errors import ErrorKind, ModelhostError
from modelhost.store.model_store import ModelStore


@dataclass(frozen=True, slots=True)
class ControlChange:
    """A load or unload a client asked for and the server made: `request` the load's (None: an unload)."""

    name: str
    request: LoadRequest | None
    unload_dependents: bool = False

    @property
    def action(self) -> str:
        return "unload" if self.request is None else "load"


ControlListener = Callable[[ControlChange], Awaitable[None]]
# An index entry's states, from the least to the most a server can say of a version.
_STATE_RANK = {"": 0, ModelState.UNAVAILABLE.value: 1, ModelState.UNLOADING.value: 2, ModelState.LOADING.value: 3,
               ModelState.READY.value: 4}


class IndexPeers(Protocol):
    """The other servers of one application (Ray Serve's replicas), whose indexes the index merges."""

    async def gather_index(self, ready_only: bool) -> list[list[IndexEntry]]: ...


class Control:
    def __init__(self, manager: ModelManager, mode: str = "none", store: ModelStore | None = None) -> None:
        self._manager = manager
        self._mode = mode
        self._store = store
        self._listeners: list[ControlListener] = []
        self._peers: IndexPeers | None = None
        self._refusal: tuple[str, str] | None = None

    def on_change(self, listener: ControlListener) -> None:
        """`listener` is awaited after each load or unload a client asked for succeeded, before it is answered
        (Ray Serve's replicas tell their peers)."""
        self._listeners.append(listener)

    def merge_index_with(self, peers: IndexPeers) -> None:
        self._peers = peers

    async def index(self, ready_only: bool = False) -> list[IndexEntry]:
        """This server's index, merged with its peers' where it has any: each version in the state of the server
        that says most of it (READY on one of them is READY)."""
        own = await self.local_index(ready_only)
        if self._peers is None:
            return own
        return merged_index([own, *await self._peers.gather_index(ready_only)])

    async def local_index(self, ready_only: bool = False) -> list[IndexEntry]:
        """Every model the manager knows; in explicit mode also the repository's models never loaded
        (name only, as Triton lists them). Reasons are for clients: no server paths (the log has them)."""
        entries = [for_clients(e) for e in self._manager.index(ready_only)]
        if self._mode == "explicit" and self._store is not None and not ready_only:
            known = set(self._manager.names())
            names = await asyncio.to_thread(self._store.list)
            entries += [IndexEntry(name, "", "", "") for name in names if name not in known]
            entries.sort(key=lambda e: e.name)
        return entries

    async def load(self, name: str, request: LoadRequest | None = None, announce: bool = True) -> None:
        """Load a model, or reload a loaded one (zero-downtime), optionally from the request's config and files.
        `announce`: tell the listeners (not for a change a peer made and this server adopts)."""
        self._check_mode("load", name)
        await self._manager.load(name, load_override(name, request))
        if announce:
            await self._announce(ControlChange(name, request or LoadRequest()))

    async def unload(self, name: str, unload_dependents: bool = False, announce: bool = True) -> None:
        self._check_mode("unload", name)
        await self._manager.unload(name, unload_dependents)
        if announce:
            await self._announce(ControlChange(name, None, unload_dependents))

    async def _announce(self, change: ControlChange) -> None:
        for listener in self._listeners:
            await listener(change)

    def refuse_changes(self, mode: str, how: str) -> None:
        """Clients may not load or unload whatever mode the manager runs in: the operator chose `mode`, in which
        models load `how` (Ray Serve's replicas, which load models on first use)."""
        self._refusal = (mode, how)

    def _check_mode(self, action: str, name: str) -> None:
        if self._refusal is not None or self._mode != "explicit":
            how = "every model loads at start" if self._mode == "none" else "the repository's changes are polled"
            mode, how = self._refusal or (self._mode, how)
            # Triton's status and words, which its clients match (model_analyzer: "polling is enabled"), in every
            # mode but explicit; then what it means here.
            raise ModelhostError(
                ErrorKind.UNAVAILABLE,
                f"explicit model load / unload is not allowed if polling is enabled: cannot {action} model "
                f"'{name}': model control mode is '{mode}' ({how}); load and unload need "
                "--model-control-mode explicit",
            )


def load_override(name: str, request: LoadRequest | None) -> LoadOverride | None:
    """What the manager loads `name` with for a client's load request: None for the repository's own files."""
    override = check_load_request(name, request) if request is not None else None
    return override if override and (override.config or override.files) else None


def merged_index(indexes: Iterable[list[IndexEntry]]) -> list[IndexEntry]:
    """Several servers' indexes as one: per model version the entry of the highest state; a model's name-only
    entry (never loaded there) only where no server has a version of it."""
    best: dict[tuple[str, str], IndexEntry] = {}
    for entries in indexes:
        for entry in entries:
            held = best.get((entry.name, entry.version))
            if held is None or _STATE_RANK.get(entry.state, 0) > _STATE_RANK.get(held.state, 0):
                best[(entry.name, entry.version)] = entry
    versioned = {name for name, version in best if version}
    return sorted((entry for (name, version), entry in best.items() if version or name not in versioned),
                  key=lambda entry: (entry.name, int(entry.version) if is_digits(entry.version) else -1))
