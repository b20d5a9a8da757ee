"""The model cache's loads, one measured load at a time as CacheMemory counts it: when each may start (up to
CONCURRENT_LOADS at once, and alone when it warms a backend up or is measured to its first request), room made for
its expected peak (CacheRoom), and its measurement. Runs on the event loop."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Coroutine
from contextlib import asynccontextmanager
from typing import Any

from modelhost.core.cache_entry import CacheEntry, CacheStatistics
from modelhost.core.cache_memory import CacheMemory, Measurement
from modelhost.core.cache_room import CacheRoom

CONCURRENT_LOADS = 4
ALONE_AFTER_LOAD_S = 0.1  # the longest a measured load's first request keeps other loads from starting


class CacheLoads:
    """`changed`: notified when a load starts or ends, or a warm-up ends (shared with CacheRoom, which waits on it);
    `background` runs the notification that ends a measured load's window where the cache's stop awaits it."""

    def __init__(self, room: CacheRoom, memory: CacheMemory, statistics: CacheStatistics, changed: asyncio.Condition,
                 background: Callable[[Coroutine[Any, Any, None]], asyncio.Task[None]]) -> None:
        self._room = room
        self._memory = memory
        self._statistics = statistics
        self._changed = changed
        self._background = background
        self._loading = 0  # loads under way, waiting for room or measured
        self._alone = False  # a load runs alone (a backend's warm-up, or a measurement): no other starts
        self._alone_for: Measurement | None = None  # the measurement that keeps `_alone` set once its load ended

    @asynccontextmanager
    async def measured(self, key: str, on_disk: int, warm: Callable[[], bool] | None,
                       first_use: bool = False) -> AsyncIterator[CacheEntry]:
        """One load among those under way, room made for its expected peak; gives its entry, charged that peak until
        its measurement ends (or its known charge). A load that warms a backend up (`warm`, None when they are
        warm) or is measured to its first request (`first_use`) runs alone: it waits for the loads under way, and
        no load starts until it has ended and, when measured, its measurement has (`end_alone`; at most
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
            await self._room.reserve_load(peak, key)
            expected = peak
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
            self._statistics.load.observe(time.monotonic() - started)
        finally:
            if expected is not None:
                self._room.load_ended(expected)
            self._loading -= 1
            if alone and loaded and measuring is not None:  # alone until its first request ends
                self._alone_for = measuring
                asyncio.get_running_loop().call_later(ALONE_AFTER_LOAD_S, self.end_alone, measuring)
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

    def end_alone(self, measuring: Measurement) -> None:
        """A measured load's window ends (its first request ended, it left, or ALONE_AFTER_LOAD_S passed): other
        loads may start."""
        if self._alone_for is measuring:
            self._alone_for = None
            self._alone = False
            self._background(self._notify())

    async def _notify(self) -> None:
        async with self._changed:
            self._changed.notify_all()
