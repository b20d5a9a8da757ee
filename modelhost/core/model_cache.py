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
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Sequence
from contextlib import asynccontextmanager
from functools import partial
from typing import Any

from modelhost.backends import backend_is_warm
from modelhost.core.cache_entry import CacheEntry, CacheStatistics
from modelhost.core.cache_memory import CacheMemory, Measurement
from modelhost.core.eviction_policy import EvictionPolicy
from modelhost.core.manager import ModelManager
from modelhost.core.model_loading import backend_of, warm_up_backend_of
from modelhost.core.served_model import ServedModel
from modelhost.errors import ErrorKind, ModelhostError
from modelhost.store.local import ModelSource

log = logging.getLogger("modelhost.model_cache")

CONCURRENT_LOADS = 4
ALONE_AFTER_LOAD_S = 0.1  # the longest a measured load's first request keeps other loads from starting
UNUSED_GRACE_S = 1.0  # how long a store model loaded for a request is kept from eviction, waiting for it

class ModelCache:
    """The manager's `LoadBudget` on a multi-model endpoint, and the eviction policy over what it admitted."""

    def __init__(self, manager: ModelManager, budget_bytes: int, policy: str = "lfu") -> None:
        self._manager = manager
        self.budget_bytes = budget_bytes
        self._policy = EvictionPolicy(policy)
        self._memory = CacheMemory()
        self._entries: dict[str, CacheEntry] = {}  # least recently used first
        self._changed = asyncio.Condition()  # a load started or ended, or a warm-up ended
        self._loading = 0  # loads under way, waiting for room or measured
        self._running = 0  # loads being measured
        self._reserved = 0  # their expected peaks
        self._finished = 0  # loads measured, ever
        self._alone = False  # a load runs alone (a backend's warm-up, or a measurement): no other starts
        self._alone_for: Measurement | None = None  # the measurement that keeps `_alone` set once its load ended
        self._evicting: dict[str, asyncio.Future[None]] = {}  # key -> done when its eviction is
        self._first_runs: asyncio.Future[None] | None = None  # done when an entry's first run is over
        self._removals: set[asyncio.Task[None]] = set()
        self.statistics = CacheStatistics()

    @property
    def used_bytes(self) -> int:
        """Memory the loaded models hold, as the budget counts it."""
        return self._memory.used

    def entries(self) -> list[CacheEntry]:
        return sorted(self._entries.values(), key=lambda e: e.key)

    def entry(self, key: str) -> CacheEntry | None:
        return self._entries.get(key)

    def holds(self, entry: CacheEntry) -> bool:
        """Whether `entry` is still charged: false from the moment its eviction starts."""
        return self._entries.get(entry.key) is entry

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
            if self._entries.get(entry.key) is entry:  # the most recently used, last in order
                del self._entries[entry.key]
                self._entries[entry.key] = entry
                self._policy.used(entry.key, len(self._entries))
            if entry.measuring is not None:
                self._settle(entry, first_use=True)
            if entry.first_run:
                self._first_run_over(entry)

    def used(self, name: str) -> None:
        """A request holds model `name` (ModelManager.hold): a store model's entry becomes the most recently used,
        and its use is counted. An archive's models are counted once per request by `pinned` instead."""
        entry = self._entries.get(name)
        if entry is not None and entry.store:
            entry.unused = False
            del self._entries[name]
            self._entries[name] = entry
            self._policy.used(name, len(self._entries))

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
        async with self._measured(name, on_disk, warm) as entry:
            yield
        entry.names = (name,)
        if entry.measuring is not None:
            self._settle(entry, first_use=False)
        entry.store = entry.unused = True
        asyncio.get_running_loop().call_later(UNUSED_GRACE_S, self._first_use_over, entry)
        self._charge(entry)
        try:
            await self._fit(0, name)  # never its own victim: the manager unloads it, holding its lock
        except ModelhostError:
            self._uncharge(entry)
            self._memory.released()
            raise self._no_memory(name, f"{entry.size} bytes") from None
        self._log_cached(entry)

    async def load(self, key: str, on_disk: int, warm: Callable[[], bool] | None,
                   add: Callable[[], Awaitable[Sequence[str]]], first_use: bool = False) -> CacheEntry:
        """One measured load of models the store does not list: `add` loads them into the manager and returns
        their names (unloading any it loaded when it fails). The entry is charged by `keep`, or undone by `discard`.
        `first_use`: a request follows at once (as `keep`'s), and the load runs alone while the key is measured."""
        await self._evicted(key)
        async with self._measured(key, on_disk, warm, first_use) as entry:
            entry.names = tuple(await add())
        return entry

    async def load_expected(self, key: str, on_disk: int,
                            add: Callable[[], Awaitable[Sequence[str] | None]]) -> CacheEntry | None:
        """`load` with `first_use`, for models whose files are expected to take `on_disk` bytes (as at the key's last
        load) and whose backends are warm: room is made before `add` fetches the files, so that it fetches and loads
        in one go. When they turn out otherwise, `add` loads nothing and returns None, and so does this (the caller
        then `load`s them as they are)."""
        await self._evicted(key)
        try:
            async with self._measured(key, on_disk, None, first_use=True) as entry:
                names = await add()
                if names is None:
                    raise _NotLoaded
                entry.names = tuple(names)
        except _NotLoaded:
            return None
        return entry

    async def _evicted(self, key: str) -> None:
        while (evicting := self._evicting.get(key)) is not None:
            await asyncio.shield(evicting)  # its models still hold their names in the manager

    async def keep(self, entry: CacheEntry, first_use: bool = False) -> None:
        """Charge a loaded entry: others are evicted until it fits, or it is (NO_MEMORY). `first_use`: a request
        for it follows at once (ModelCache.pinned), whose end completes its measurement; otherwise it is complete
        now."""
        if not first_use and entry.measuring is not None:
            self._settle(entry, first_use=False)
        if first_use:  # its first run is part of what others' measurements must not see
            entry.first_run = True
            self._memory.awaiting_first_run()
            asyncio.get_running_loop().call_later(ALONE_AFTER_LOAD_S, self._first_run_over, entry)
        self._charge(entry)
        if self._memory.used + self._reserved <= self.budget_bytes:
            self._log_cached(entry)
            return
        try:
            await self._fit(0, entry.key)  # never its own victim
        except ModelhostError:
            await self.evict(entry)
            raise self._no_memory(entry.key, f"{entry.size} bytes") from None
        self._log_cached(entry)

    async def discard(self, entry: CacheEntry) -> None:
        """Unload a loaded entry that `keep` never charged (its owner could not finish setting it up)."""
        try:
            await asyncio.gather(*(self._manager.evict(n) for n in entry.names), return_exceptions=True)
        finally:
            self._released(entry)

    @asynccontextmanager
    async def _measured(self, key: str, on_disk: int, warm: Callable[[], bool] | None,
                        first_use: bool = False) -> AsyncIterator[CacheEntry]:
        """One load among those under way, room made for its expected peak; gives its entry, charged that peak until
        its measurement ends (or its known charge). A load that warms a backend up (`warm`, None when they are
        warm) or is measured to its first request (`first_use`) runs alone: it waits for the loads under way, and
        no load starts until it has ended and, when measured, its measurement has (`_end_alone`; at most
        ALONE_AFTER_LOAD_S after the load)."""
        alone = warm is not None or (first_use and self._memory.known_size(key, on_disk) is None)
        if alone or self._alone or self._loading >= CONCURRENT_LOADS:
            await self._wait_to_load(alone)
        self._loading += 1
        expected: int | None = None
        measuring: Measurement | None = None
        loaded = False
        try:
            await self._memory.warm_up(warm)
            peak = self._memory.estimate(key, on_disk)
            await self._fit(peak, key)  # reserves it
            expected = peak
            self._running += 1
            started = time.monotonic()
            measuring = self._memory.start(key, on_disk)
            entry = CacheEntry(key, (), peak if measuring is not None else self._memory.known_size(key, on_disk) or 0,
                               measuring=measuring)
            try:
                yield entry
            except BaseException:
                if measuring is not None:
                    self._memory.abandon(measuring)
                raise
            finally:
                self._memory.ended(measuring)
            loaded = True
            self.statistics.load.observe(time.monotonic() - started)
        finally:
            if expected is not None:
                self._reserved -= expected
                self._running -= 1
                self._finished += 1
            self._loading -= 1
            if alone and loaded and measuring is not None:  # alone until its first request ends
                self._alone_for = measuring
                asyncio.get_running_loop().call_later(ALONE_AFTER_LOAD_S, self._end_alone, measuring)
            elif alone:
                self._alone = False
            if self._changed._waiters:  # nobody waits: no lock, no wake-up
                await self._notify()

    async def _wait_to_load(self, alone: bool) -> None:
        """Wait for a place among the loads under way, and for a load that runs alone to end; `alone`: this load
        runs alone (`_alone` is then set, and it waits for the loads under way to end)."""
        async with self._changed:
            if not alone:
                await self._changed.wait_for(lambda: not self._alone and self._loading < CONCURRENT_LOADS)
                return
            await self._changed.wait_for(lambda: not self._alone)
            self._alone = True  # no load starts now
            try:
                await self._changed.wait_for(lambda: self._loading == 0)
            except BaseException:  # cancelled: the loads waiting for this one go on
                self._alone = False
                self._changed.notify_all()
                raise

    def _first_run_over(self, entry: CacheEntry) -> None:
        """The entry's first request ended, it left, or ALONE_AFTER_LOAD_S passed since it was kept."""
        if entry.first_run:
            entry.first_run = False
            self._memory.first_run_ended()
            if self._first_runs is not None:
                self._first_runs.set_result(None)
                self._first_runs = None

    def _end_alone(self, measuring: Measurement) -> None:
        """A measured load's window ends (its first request ended, it left, or ALONE_AFTER_LOAD_S passed): other
        loads may start."""
        if self._alone_for is measuring:
            self._alone_for = None
            self._alone = False
            self._in_background(self._notify())

    async def _notify(self) -> None:
        async with self._changed:
            self._changed.notify_all()

    async def _measured_since(self, finished: int) -> None:
        """Returns once a load has been measured since `_finished` was `finished`."""
        async with self._changed:
            await self._changed.wait_for(lambda: self._finished != finished)

    async def _fit(self, needed: int, key: str) -> None:
        """Make room for `needed` more bytes beside the expected peaks of the loads being measured, and reserve them
        (in `_reserved`, which the caller gives back); while that cannot be done, wait for the evictions under way
        or else for one of those loads to end, and raise NO_MEMORY once none is left. Victims are chosen and the
        room reserved in one step, so two loads never count on the same room; then the evictions are awaited, so
        loads making room at once wait for those under way together, not in turn. Memory stays within the budget:
        this returns once every eviction under way when its victims were chosen has freed its memory."""
        while True:
            finished = self._finished
            try:
                evictions = self._start_evictions(needed + self._reserved, key)
                break
            except _FirstRunPending:  # its request would load it again at once: choose again once it has run
                if self._first_runs is None:
                    self._first_runs = asyncio.get_running_loop().create_future()
                await asyncio.shield(self._first_runs)
            except ModelhostError:
                if self._evicting:  # memory being freed: choose again once it is
                    await asyncio.shield(asyncio.gather(*self._evicting.values()))
                elif self._running or self._reserved:
                    await self._measured_since(finished)
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

    def _settle(self, entry: CacheEntry, first_use: bool) -> None:
        """Its measurement ends: the entry is charged what it measured from here on."""
        measuring, entry.measuring = entry.measuring, None
        assert measuring is not None
        size = self._memory.finish(measuring, first_use)
        self._end_alone(measuring)
        charged = self.holds(entry)
        if charged:
            self._memory.keep(size - entry.size)
        entry.size = size
        if not charged:
            return
        if size > self.budget_bytes:  # alone over the budget: it goes once idle, and its next load is measured again
            self._memory.forget_key(entry.key)
            self._in_background(self.evict(entry))
        elif self._memory.used + self._reserved > self.budget_bytes:  # it took more than expected: others go
            self._in_background(self._fit_quietly(entry.key))

    def _in_background(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(work)
        self._removals.add(task)
        task.add_done_callback(self._removals.discard)

    async def _fit_quietly(self, key: str) -> None:
        with contextlib.suppress(ModelhostError):  # what is in use stays; the next load makes room again
            await self._fit(0, key)

    def _charge(self, entry: CacheEntry) -> None:
        self._entries[entry.key] = entry
        self._memory.keep(entry.size)

    def _uncharge(self, entry: CacheEntry) -> None:
        del self._entries[entry.key]
        self._memory.forget(entry.size)

    def _released(self, entry: CacheEntry) -> None:
        """The entry's models are unloaded: its memory is free (and its measurement over)."""
        if entry.measuring is not None:
            self._memory.abandon(entry.measuring)
            self._end_alone(entry.measuring)
            entry.measuring = None
        self._first_run_over(entry)
        self._memory.released()

    def _log_cached(self, entry: CacheEntry) -> None:
        # Debug: the manager has logged the load; a log line costs a busy multi-model endpoint's loop 2 % of a load.
        if log.isEnabledFor(logging.DEBUG):
            log.debug("cached model %s: %d bytes (%d of %d used)", entry.key, entry.size, self._memory.used,
                      self.budget_bytes)

    # evictions

    def _start_evictions(self, needed: int, key: str) -> list[asyncio.Future[None]]:
        """What to wait for before `needed` more bytes fit the budget: nothing when they fit with the memory of the
        evictions under way still counted; else idle entries' evictions started, in the policy's order, until they
        fit once every eviction under way is done, and all of those."""
        if self._memory.used + self._memory.freeing + needed <= self.budget_bytes:
            return []
        started = []
        while self._memory.used + needed > self.budget_bytes:
            victim = self._policy.victim(self._entries.values(), key, self._in_use)
            if victim is None:
                raise self._no_memory(key, f"about {needed} bytes to load")
            if victim.first_run:
                raise _FirstRunPending
            started.append(self._start_eviction(victim))
        return [*started, *self._evicting.values()]

    def _in_use(self, entry: CacheEntry) -> bool:
        return any(self._manager.in_use(name) for name in entry.names)

    def _no_memory(self, key: str, needed: str) -> ModelhostError:
        held = sum(e.size for e in self._entries.values() if e.key != key and self._in_use(e))
        return ModelhostError(
            ErrorKind.NO_MEMORY,
            f"model '{key}' needs {needed}: the model cache holds at most {self.budget_bytes} bytes "
            f"(--model-cache-bytes) and models in use hold {held}",
        )

    async def evict(self, entry: CacheEntry) -> None:
        """No request finds the entry from now; once the requests holding its models are done (their own
        lookups included), they unload and its owner's `release` runs. A load of the same key waits for that,
        and so does a second eviction of the entry."""
        if not self.holds(entry):
            evicting = self._evicting.get(entry.key)
            if evicting is not None:
                await asyncio.shield(evicting)
            return
        await asyncio.shield(self._start_eviction(entry))

    def _start_eviction(self, entry: CacheEntry) -> asyncio.Task[None]:
        """The entry uncharged now (no request finds it from here) and unloaded in a task of its own, which raises
        what unloading it raised; `_evicting` has its key until then (done without raising)."""
        self._uncharge(entry)
        self.statistics.evictions += 1
        self._memory.unloading(entry.size)
        self._evicting[entry.key] = asyncio.get_running_loop().create_future()
        task = asyncio.get_running_loop().create_task(self._unloaded(entry, entry.size))
        self._removals.add(task)
        task.add_done_callback(self._removals.discard)
        return task

    async def _unloaded(self, entry: CacheEntry, size: int) -> None:
        started = time.monotonic()
        try:
            try:
                await self._unload(entry.names)
                if entry.release is not None:
                    await entry.release()
            finally:
                self._memory.unloaded(size)
                self._released(entry)
        finally:
            self._evicting.pop(entry.key).set_result(None)
        self.statistics.unload.observe(time.monotonic() - started)
        log.debug("unloaded model %s (%d bytes)", entry.key, entry.size)  # counted: modelhost_model_cache_evictions

    async def _unload(self, names: tuple[str, ...]) -> None:
        """Once no request holds them, unload the manager's models `names` (one failing does not keep the others)."""
        if len(names) == 1:  # the usual entry: awaited in this task, not gathered in tasks of their own
            await self._manager.idle(names[0])
            with contextlib.suppress(Exception):
                await self._manager.evict(names[0])
            return
        await asyncio.gather(*(self._manager.idle(name) for name in names))
        await asyncio.gather(*(self._manager.evict(n) for n in names), return_exceptions=True)

    def removed(self, name: str) -> None:
        """The manager unloaded or evicted `name` by itself (the repository API): what it held is no longer
        charged, and the rest of its entry (an archive's other models, its files) goes too."""
        entry = next((e for e in self._entries.values() if name in e.names), None)
        if entry is None:  # not charged, or its eviction already under way
            return
        if entry.names == (name,) and entry.release is None:
            self._uncharge(entry)
            self._released(entry)
            self.statistics.evictions += 1
            return
        self._in_background(self.evict(entry))

    async def stop(self) -> None:
        await asyncio.gather(*(self.evict(e) for e in list(self._entries.values())), return_exceptions=True)
        await asyncio.gather(*self._removals, return_exceptions=True)


class _FirstRunPending(Exception):
    """The only entry that could make room is one whose first request has not run yet (ModelCache.keep)."""


class _NotLoaded(Exception):
    """`load_expected`'s load found its files other than expected, and loaded nothing."""


def _inspect(source: ModelSource) -> tuple[int, str | None]:
    """A model's bytes on disk, and the backend that will load it (None when that cannot be told)."""
    on_disk = sum(path.stat().st_size for path in source.path.resolve().rglob("*") if path.is_file())
    return on_disk, backend_of(source)
