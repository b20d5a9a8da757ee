"""What the model cache holds against its budget, and making room in it: the entries charged (least recently used
first), the expected peaks reserved for the loads being measured, and idle entries evicted, in the eviction policy's
order, until a load fits. Runs on the event loop."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

from modelhost.core.cache_entry import CacheEntry
from modelhost.core.cache_evictions import CacheEvictions
from modelhost.core.cache_memory import CacheMemory
from modelhost.core.eviction_policy import EvictionPolicy
from modelhost.errors import ErrorKind, ModelhostError


class CacheRoom:
    """`in_use`: whether a request holds the manager's model (ModelManager.in_use); `changed`: notified when a load
    ends (CacheLoads), which a load that cannot fit while others are measured waits for."""

    def __init__(self, budget_bytes: int, policy: EvictionPolicy, memory: CacheMemory, evictions: CacheEvictions,
                 in_use: Callable[[str], bool], changed: asyncio.Condition) -> None:
        self.budget_bytes = budget_bytes
        self._policy = policy
        self._memory = memory
        self._evictions = evictions
        self._model_in_use = in_use
        self._changed = changed
        self._entries: dict[str, CacheEntry] = {}  # least recently used first
        self._by_name: dict[str, CacheEntry] = {}  # the manager's model -> the entry charged for it
        self._reserved = 0  # the expected peaks of the loads being measured
        self._measuring = 0  # those loads
        self._measured = 0  # loads measured, ever
        self._first_runs: asyncio.Future[None] | None = None  # done when an entry's first run is over

    # what is charged

    def entries(self) -> list[CacheEntry]:
        return sorted(self._entries.values(), key=lambda e: e.key)

    def by_use(self) -> list[CacheEntry]:
        """The entries, least recently used first."""
        return list(self._entries.values())

    def entry(self, key: str) -> CacheEntry | None:
        return self._entries.get(key)

    def holds(self, entry: CacheEntry) -> bool:
        """Whether `entry` is still charged: false from the moment its eviction starts."""
        return self._entries.get(entry.key) is entry

    def charging(self, name: str) -> CacheEntry | None:
        """The entry charged for the manager's model `name`, if any."""
        return self._by_name.get(name)

    def used(self, entry: CacheEntry) -> None:
        """A request used the charged `entry`: the most recently used, last in order, and one more use to the policy."""
        del self._entries[entry.key]
        self._entries[entry.key] = entry
        self._policy.used(entry.key, len(self._entries))

    def charge(self, entry: CacheEntry) -> None:
        self._entries[entry.key] = entry
        self._by_name.update(dict.fromkeys(entry.names, entry))
        self._policy.charged(entry.key)
        self._memory.keep(entry.size)

    def uncharge(self, entry: CacheEntry) -> None:
        del self._entries[entry.key]
        for name in entry.names:
            if self._by_name.get(name) is entry:
                del self._by_name[name]
        self._policy.uncharged(entry.key)
        self._memory.forget(entry.size)

    def over_budget(self) -> bool:
        """Whether what is charged and reserved exceeds the budget."""
        return self._memory.used + self._reserved > self.budget_bytes

    # making room

    async def reserve_load(self, peak: int, key: str) -> None:
        """Make room for a load expected to peak at `peak` bytes, reserved until `load_ended`."""
        await self.fit(peak, key)
        self._measuring += 1

    def load_ended(self, peak: int) -> None:
        """A load `reserve_load` made room for ended (loaded or failed): its reservation goes."""
        self._reserved -= peak
        self._measuring -= 1
        self._measured += 1

    async def fit(self, needed: int, key: str) -> None:
        """Make room for `needed` more bytes beside the expected peaks of the loads being measured, and reserve them
        (in `_reserved`, which the caller gives back); while that cannot be done, wait for the evictions under way
        or else for one of those loads to end, and raise NO_MEMORY once none is left. Victims are chosen and the
        room reserved in one step, so two loads never count on the same room; then the evictions are awaited, so
        loads making room at once wait for those under way together, not in turn. Memory stays within the budget:
        this returns once every eviction under way when its victims were chosen has freed its memory."""
        while True:
            measured = self._measured
            try:
                evictions = self._start_evictions(needed + self._reserved, key)
                break
            except _FirstRunPending:  # its request would load it again at once: choose again once it has run
                if self._first_runs is None:
                    self._first_runs = asyncio.get_running_loop().create_future()
                await asyncio.shield(self._first_runs)
            except ModelhostError:
                if under_way := self._evictions.under_way():  # memory being freed: choose again once it is
                    await asyncio.shield(asyncio.gather(*under_way))
                elif self._measuring or self._reserved:
                    await self._measured_since(measured)
                else:
                    raise
        self._reserved += needed
        if not evictions:
            return
        try:
            await asyncio.shield(asyncio.gather(*evictions))
        except BaseException:
            self._reserved -= needed
            raise

    async def fit_quietly(self, key: str) -> None:
        with contextlib.suppress(ModelhostError):  # what is in use stays; the next load makes room again
            await self.fit(0, key)

    async def _measured_since(self, measured: int) -> None:
        """Returns once a load has been measured since `_measured` was `measured`."""
        async with self._changed:
            await self._changed.wait_for(lambda: self._measured != measured)

    def first_run_over(self, entry: CacheEntry) -> None:
        """The entry's first request ended, it left, or ALONE_AFTER_LOAD_S passed since it was kept."""
        if entry.first_run:
            entry.first_run = False
            self._memory.first_run_ended()
            if self._first_runs is not None:
                self._first_runs.set_result(None)
                self._first_runs = None

    def start_eviction(self, entry: CacheEntry) -> asyncio.Task[None]:
        """The entry uncharged now (no request finds it from here) and unloaded (CacheEvictions.start)."""
        self.uncharge(entry)
        return self._evictions.start(entry)

    def _start_evictions(self, needed: int, key: str) -> list[asyncio.Future[None]]:
        """What to wait for before `needed` more bytes fit the budget: nothing when they fit with the memory of the
        evictions under way still counted; else idle entries' evictions started, in the policy's order, until they
        fit once every eviction under way is done, and all of those."""
        if self._memory.used + self._memory.freeing + needed <= self.budget_bytes:
            return []
        started = []
        while self._memory.used + needed > self.budget_bytes:
            victim = self._policy.victim(self._entries, key, self._in_use)
            if victim is None:
                raise self.no_memory(key, f"about {needed} bytes to load")
            if victim.first_run:
                raise _FirstRunPending
            started.append(self.start_eviction(victim))
        return [*started, *self._evictions.under_way()]

    def _in_use(self, entry: CacheEntry) -> bool:
        return any(self._model_in_use(name) for name in entry.names)

    def no_memory(self, key: str, needed: str) -> ModelhostError:
        held = sum(e.size for e in self._entries.values() if e.key != key and self._in_use(e))
        return ModelhostError(
            ErrorKind.NO_MEMORY,
            f"model '{key}' needs {needed}: the model cache holds at most {self.budget_bytes} bytes "
            f"(--model-cache-bytes) and models in use hold {held}",
        )


class _FirstRunPending(Exception):
    """The only entry that could make room is one whose first request has not run yet (ModelCache.keep)."""
