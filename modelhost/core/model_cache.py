"""A multi-model endpoint's memory budget: the models in memory stay within `--model-cache-bytes`; idle ones are
evicted to make room, by `--model-cache-policy`: `lfu` (the default) the least used lately first
(core/eviction_policy.py), the least recently used among equals; `lru` the least recently used first.

What the cache charges is an entry: the manager's models that loaded together (one model of the store, loaded
through the manager's `LoadBudget`; or all the models of one SageMaker archive, which
protocols/sagemaker/target_models.py loads through `load` and `keep`). Concurrency contract (everything runs
on the event loop):
- a model a request holds, over any protocol (ModelManager.hold; `pinned` here), is never evicted; an
  eviction waits for those requests, and a load of the same key waits for the eviction;
- the budget is compared with what the models hold in memory as core/cache_memory.py counts it (the sum of
  their charges, each measured from its load's start to its first request's end until the key's charge is
  known); the backends a load needs are warmed up before it is measured;
- up to CONCURRENT_LOADS loads run at once, so that a busy endpoint's misses do not queue behind each other.
  Before one starts, idle entries are evicted until its expected peak (`CacheMemory.estimate`) fits beside
  the peaks of those under way, so memory stays within the budget during loads too, not only after them (loads
  making room at once evict at once, each waiting for every eviction under way when it chose its victims); a
  load that cannot fit while others run waits for them, and is refused (NO_MEMORY) only when it cannot fit
  alone. A load that warms a backend up, or is measured to its first request, runs alone: no other load is
  under way from its start to its end (a warm-up's memory is the process's) or to its first request's end (a
  measurement that others' loads and evictions do not disturb: at most ALONE_AFTER_LOAD_S after the load). Each
  entry's charge is kept as its `size`;
- an entry kept for a request that has not run it yet is not evicted to make room: a load that could make room
  only with it waits for that request (at most ALONE_AFTER_LOAD_S), since two loads whose expected peaks do not
  fit the budget together would otherwise each evict the other's new model before its request ran, for ever.

Its parts: core/cache_loads.py (when each load runs, and its measurement), core/cache_room.py (what is charged against
the budget, and making room), core/cache_evictions.py (unloading what is evicted).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Sequence
from contextlib import asynccontextmanager
from functools import partial
from typing import Any

from modelhost.backends import backend_is_warm
from modelhost.core.cache_entry import CacheEntry, CacheStatistics
from modelhost.core.cache_evictions import CacheEvictions
from modelhost.core.cache_loads import ALONE_AFTER_LOAD_S, CacheLoads
from modelhost.core.cache_memory import CacheMemory
from modelhost.core.cache_room import CacheRoom
from modelhost.core.eviction_policy import EvictionPolicy
from modelhost.core.manager import ModelManager
from modelhost.core.model_loading import backend_of, warm_up_backend_of
from modelhost.core.served_model import ServedModel
from modelhost.errors import ModelhostError
from modelhost.store.local import ModelSource

log = logging.getLogger("modelhost.model_cache")

UNUSED_GRACE_S = 1.0  # how long a store model loaded for a request is kept from eviction, waiting for it


class ModelCache:
    """The manager's `LoadBudget` on a multi-model endpoint, and the eviction policy over what it admitted."""

    def __init__(self, manager: ModelManager, budget_bytes: int, policy: str = "lfu") -> None:
        self._manager = manager
        self.statistics = CacheStatistics()
        self._memory = CacheMemory()
        self._background: set[asyncio.Task[None]] = set()  # evictions, and what a measurement's end starts
        changed = asyncio.Condition()  # a load started or ended, or a warm-up ended
        self._evictions = CacheEvictions(manager, self._memory, self.statistics, self._in_background, self._released)
        self._room = CacheRoom(budget_bytes, EvictionPolicy(policy), self._memory, self._evictions, manager.in_use,
                               changed)
        self._loads = CacheLoads(self._room, self._memory, self.statistics, changed, self._in_background)

    @property
    def budget_bytes(self) -> int:
        """The most memory the cached models may hold (`--model-cache-bytes`)."""
        return self._room.budget_bytes

    @budget_bytes.setter
    def budget_bytes(self, budget_bytes: int) -> None:
        self._room.budget_bytes = budget_bytes

    @property
    def used_bytes(self) -> int:
        """Memory the loaded models hold, as the budget counts it."""
        return self._memory.used

    def entries(self) -> list[CacheEntry]:
        return self._room.entries()

    def entry(self, key: str) -> CacheEntry | None:
        return self._room.entry(key)

    def holds(self, entry: CacheEntry) -> bool:
        """Whether `entry` is still charged: false from the moment its eviction starts."""
        return self._room.holds(entry)

    @asynccontextmanager
    async def pinned(self, entry: CacheEntry) -> AsyncIterator[None]:
        """Hold an entry's models for one request, as a request over any protocol holds its model: the caller
        looked the entry up with no await since. The first request to end settles a new entry's charge."""
        held: list[ServedModel] = []
        try:
            for name in entry.names:
                held.append(self._manager.hold(name))
            yield
        finally:
            for served in held:
                served.pins.release()
            entry.last_used = time.monotonic()
            if self._room.holds(entry):
                self._room.used(entry)
            if entry.measuring is not None:
                self._settle(entry, first_use=True)
            if entry.first_run:
                self._room.first_run_over(entry)

    def used(self, name: str) -> None:
        """A request holds model `name` (ModelManager.hold): a store model's entry becomes the most recently used,
        and its use is counted. An archive's models are counted once per request by `pinned` instead."""
        entry = self._room.entry(name)
        if entry is not None and entry.store:
            entry.unused = False
            self._room.used(entry)

    @staticmethod
    def _first_use_over(entry: CacheEntry) -> None:
        entry.unused = False

    # loads

    @asynccontextmanager
    async def admitting(self, name: str, source: ModelSource) -> AsyncIterator[None]:
        """The manager's load of a model of its store (the repository API in explicit mode, an ensemble's composing
        model): one measured load, cached under its name. The manager unloads it when this raises NO_MEMORY."""
        on_disk, backend = await asyncio.to_thread(_inspect, source)
        warm = None if backend is not None and backend_is_warm(backend) else partial(warm_up_backend_of, source)
        async with self._loads.measured(name, on_disk, warm) as entry:
            yield
        entry.names = (name,)
        if entry.measuring is not None:
            self._settle(entry, first_use=False)
        entry.store = entry.unused = True
        asyncio.get_running_loop().call_later(UNUSED_GRACE_S, self._first_use_over, entry)
        self._room.charge(entry)
        try:
            await self._room.fit(0, name)  # never its own victim: the manager unloads it, holding its lock
        except ModelhostError:
            self._room.uncharge(entry)
            self._memory.released()
            raise self._room.no_memory(name, f"{entry.size} bytes") from None
        self._log_cached(entry)

    async def load(self, key: str, on_disk: int, warm: Callable[[], bool] | None,
                   add: Callable[[], Awaitable[Sequence[str]]], first_use: bool = False) -> CacheEntry:
        """One measured load of models the store does not list: `add` loads them into the manager and returns
        their names (unloading any it loaded when it fails). The entry is charged by `keep`, or undone by `discard`.
        `first_use`: a request follows at once (as `keep`'s), and the load runs alone while the key is measured."""
        await self._evictions.cleared(key)
        async with self._loads.measured(key, on_disk, warm, first_use) as entry:
            entry.names = tuple(await add())
        return entry

    async def load_expected(self, key: str, on_disk: int,
                            add: Callable[[], Awaitable[Sequence[str] | None]]) -> CacheEntry | None:
        """`load` with `first_use`, for models whose files are expected to take `on_disk` bytes (as at the key's last
        load) and whose backends are warm: room is made before `add` fetches the files, so that it fetches and loads
        in one go. When they turn out otherwise, `add` loads nothing and returns None, and so does this (the caller
        then `load`s them as they are)."""
        await self._evictions.cleared(key)
        try:
            async with self._loads.measured(key, on_disk, None, first_use=True) as entry:
                names = await add()
                if names is None:
                    raise _NotLoaded
                entry.names = tuple(names)
        except _NotLoaded:
            return None
        return entry

    async def keep(self, entry: CacheEntry, first_use: bool = False) -> None:
        """Charge a loaded entry: others are evicted until it fits, or it is (NO_MEMORY). `first_use`: a request
        for it follows at once (ModelCache.pinned), whose end completes its measurement; otherwise it is complete
        now."""
        if not first_use and entry.measuring is not None:
            self._settle(entry, first_use=False)
        if first_use:  # its first run is part of what others' measurements must not see
            entry.first_run = True
            self._memory.awaiting_first_run()
            asyncio.get_running_loop().call_later(ALONE_AFTER_LOAD_S, self._room.first_run_over, entry)
        self._room.charge(entry)
        if not self._room.over_budget():
            self._log_cached(entry)
            return
        try:
            await self._room.fit(0, entry.key)  # never its own victim
        except ModelhostError:
            await self.evict(entry)
            raise self._room.no_memory(entry.key, f"{entry.size} bytes") from None
        self._log_cached(entry)

    async def discard(self, entry: CacheEntry) -> None:
        """Unload a loaded entry that `keep` never charged (its owner could not finish setting it up)."""
        try:
            await asyncio.gather(*(self._manager.evict(n) for n in entry.names), return_exceptions=True)
        finally:
            self._released(entry)

    def _settle(self, entry: CacheEntry, first_use: bool) -> None:
        """Its measurement ends: the entry is charged what it measured from here on."""
        measuring, entry.measuring = entry.measuring, None
        assert measuring is not None
        size = self._memory.finish(measuring, first_use)
        self._loads.end_alone(measuring)
        charged = self._room.holds(entry)
        if charged:
            self._memory.keep(size - entry.size)
        entry.size = size
        if not charged:
            return
        if size > self.budget_bytes:  # alone over the budget: it goes once idle, and its next load is measured again
            self._memory.forget_key(entry.key)
            self._in_background(self.evict(entry))
        elif self._room.over_budget():  # it took more than expected: others go
            self._in_background(self._room.fit_quietly(entry.key))

    def _in_background(self, work: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        task = asyncio.get_running_loop().create_task(work)
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        return task

    def _released(self, entry: CacheEntry) -> None:
        """The entry's models are unloaded: its memory is free (and its measurement over)."""
        if entry.measuring is not None:
            self._memory.abandon(entry.measuring)
            self._loads.end_alone(entry.measuring)
            entry.measuring = None
        self._room.first_run_over(entry)
        self._memory.released()

    def _log_cached(self, entry: CacheEntry) -> None:
        # Debug: the manager has logged the load; a log line costs a busy multi-model endpoint's loop 2 % of a load.
        if log.isEnabledFor(logging.DEBUG):
            log.debug("cached model %s: %d bytes (%d of %d used)", entry.key, entry.size, self._memory.used,
                      self.budget_bytes)

    # evictions

    async def evict(self, entry: CacheEntry) -> None:
        """No request finds the entry from now; once the requests holding its models are done (their own
        lookups included), they unload and its owner's `release` runs. A load of the same key waits for that,
        and so does a second eviction of the entry."""
        if not self._room.holds(entry):
            evicting = self._evictions.of(entry.key)
            if evicting is not None:
                await asyncio.shield(evicting)
            return
        await asyncio.shield(self._room.start_eviction(entry))

    def removed(self, name: str) -> None:
        """The manager unloaded or evicted `name` by itself (the repository API): what it held is no longer
        charged, and the rest of its entry (an archive's other models, its files) goes too."""
        entry = self._room.charging(name)
        if entry is None:  # not charged, or its eviction already under way
            return
        if entry.names == (name,) and entry.release is None:
            self._room.uncharge(entry)
            self._released(entry)
            self.statistics.evictions += 1
            return
        self._in_background(self.evict(entry))

    async def stop(self) -> None:
        await asyncio.gather(*(self.evict(e) for e in self._room.by_use()), return_exceptions=True)
        await asyncio.gather(*self._background, return_exceptions=True)


class _NotLoaded(Exception):
    """`load_expected`'s load found its files other than expected, and loaded nothing."""


def _inspect(source: ModelSource) -> tuple[int, str | None]:
    """A model's bytes on disk, and the backend that will load it (None when that cannot be told)."""
    on_disk = sum(path.stat().st_size for path in source.path.resolve().rglob("*") if path.is_file())
    return on_disk, backend_of(source)
