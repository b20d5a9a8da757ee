"""The repository extension's loads and unloads, for the whole Ray Serve application.

A client's load or unload reaches one replica (the model's holder, or its first-ranked replica), which makes it
as a single server would and answers the client. Every replica loads a model when a request first names it, so
without more the others would go on serving the repository's files after a load with a config override (what
`modelhost tune` and model_analyzer send), and serving a model a client unloaded. Here the replica that made a
change tells every other before it answers; each records it and applies it to what it holds: a load reloads the
model there with the same override, an unload unloads it. Later loads on first use take the recorded override,
and a model a client unloaded is not loaded on first use until a client loads it again. A replica that starts
asks its peers for their records, at its start and once more a moment later (a change made while it was not yet
reachable reaches it then). Of two changes to one model the later by wall clock wins.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from modelhost.core.control import Control, ControlChange, load_override
from modelhost.core.load_request import LoadOverride
from modelhost.errors import ModelhostError
from modelhost.ray_serve.peers import ReplicaPeers

log = logging.getLogger("modelhost.ray")

JOIN_AGAIN_S = 10.0  # longer than a started replica takes to reach every router
JOIN_WAIT_S = 5.0  # the longest a first-use load waits for the start's records


@dataclass(frozen=True, slots=True)
class LedgerEntry:
    change: ControlChange
    stamp: tuple[int, str]  # (wall-clock ns, the replica that made it)


class ControlLedger:
    """`holds(name)`: whether this replica has the model loaded or loading."""

    def __init__(self, replica_id: str, control: Control, peers: ReplicaPeers,
                 holds: Callable[[str], bool]) -> None:
        self._replica_id = replica_id
        self._control = control
        self._peers = peers
        self._holds = holds
        self._entries: dict[str, LedgerEntry] = {}
        self._overrides: dict[str, LoadOverride | None] = {}
        self._joined = asyncio.Event()
        self._joining: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._joining = asyncio.get_running_loop().create_task(self._join())

    async def stop(self) -> None:
        if self._joining is not None:
            self._joining.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._joining

    async def announced(self, change: ControlChange) -> None:
        """This replica made `change` for a client: record it, and wait for every peer to adopt it."""
        entry = LedgerEntry(change, (time.time_ns(), self._replica_id))
        self._record(entry)
        try:
            failures = await self._peers.tell("adopt_control", entry)
        except ModelhostError as exc:
            log.warning("not every replica was told of the %s of model %s: %s", change.action, change.name,
                        exc.message)
            return
        for failure in failures:
            log.warning("a replica could not apply the %s of model %s: %s", change.action, change.name, failure)

    async def adopt(self, entry: LedgerEntry) -> str:
        """A peer's change: recorded, and applied if this replica holds the model. What went wrong, or ""."""
        name = entry.change.name
        current = self._entries.get(name)
        if current is not None and current.stamp >= entry.stamp:
            return ""
        self._record(entry)
        if not self._holds(name):
            return ""
        change = entry.change
        try:
            if change.request is None:
                await self._control.unload(name, change.unload_dependents, announce=False)
            else:
                await self._control.load(name, change.request, announce=False)
        except ModelhostError as exc:
            return exc.message
        return ""

    def entries(self) -> list[LedgerEntry]:
        return list(self._entries.values())

    async def joined(self) -> None:
        """Until the records asked for at the start came (at most JOIN_WAIT_S)."""
        if not self._joined.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._joined.wait(), JOIN_WAIT_S)

    def refuses(self, name: str) -> bool:
        """Whether a client unloaded `name` (and none loaded it since)."""
        entry = self._entries.get(name)
        return entry is not None and entry.change.request is None

    def override(self, name: str) -> LoadOverride | None:
        return self._overrides.get(name)

    def _record(self, entry: LedgerEntry) -> None:
        change = entry.change
        self._overrides[change.name] = None if change.request is None else load_override(change.name, change.request)
        self._entries[change.name] = entry

    async def _join(self) -> None:
        try:
            await self._join_once()
        finally:
            self._joined.set()
        await asyncio.sleep(JOIN_AGAIN_S)
        await self._join_once()

    async def _join_once(self) -> None:
        try:
            answers = await self._peers.ask_every("control_entries")
        except ModelhostError as exc:
            log.info("no peer's loads and unloads to adopt: %s", exc.message)
            return
        for entries in answers:
            for entry in entries:
                await self.adopt(entry)
