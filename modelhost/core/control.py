"""Repository control (Triton's model control modes): the index, and load/unload where the mode allows them."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from modelhost.core.load_request import LoadOverride, LoadRequest, check_load_request
from modelhost.core.manager import IndexEntry, ModelManager
from modelhost.core.model_record import for_clients
from modelhost.errors import ErrorKind, ModelhostError
from modelhost.store.model_store import ModelStore


@dataclass(frozen=True, slots=True)
class ControlChange:
    """A load or unload a client asked for and the server made: `request` the load's (None: an unload)."""

    name: str
    request: LoadRequest | None
    unload_dependents: bool = False


ControlListener = Callable[[ControlChange], Awaitable[None]]


class Control:
    def __init__(self, manager: ModelManager, mode: str = "none", store: ModelStore | None = None) -> None:
        self._manager = manager
        self._mode = mode
        self._store = store
        self._listeners: list[ControlListener] = []

    def on_change(self, listener: ControlListener) -> None:
        """`listener` is awaited after each load or unload a client asked for succeeded, before it is answered
        (Ray Serve's replicas tell their peers)."""
        self._listeners.append(listener)

    async def index(self, ready_only: bool = False) -> list[IndexEntry]:
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

    def _check_mode(self, action: str, name: str) -> None:
        if self._mode != "explicit":
            how = "every model loads at start" if self._mode == "none" else "the repository's changes are polled"
            # Triton's status and words, which its clients match (model_analyzer: "polling is enabled"), in every
            # mode but explicit; then what it means here.
            raise ModelhostError(
                ErrorKind.UNAVAILABLE,
                f"explicit model load / unload is not allowed if polling is enabled: cannot {action} model "
                f"'{name}': model control mode is '{self._mode}' ({how}); load and unload need "
                "--model-control-mode explicit",
            )


def load_override(name: str, request: LoadRequest | None) -> LoadOverride | None:
    """What the manager loads `name` with for a client's load request: None for the repository's own files."""
    override = check_load_request(name, request) if request is not None else None
    return override if override and (override.config or override.files) else None
