"""Evicting the model cache's entries: each one's models unloaded through the manager once no request holds them
(their own lookups included), in a task of its own, then its owner's `release`; a load of the same key, and a second
eviction of the entry, wait for that. Runs on the event loop."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Coroutine
from typing import Any

from modelhost.core.cache_entry import CacheEntry, CacheStatistics
from modelhost.core.cache_memory import CacheMemory
from modelhost.core.manager import ModelManager

log = logging.getLogger("modelhost.model_cache")  # the cache's own log: these are its evictions


class CacheEvictions:
    """`background` runs an eviction's task where the cache's stop awaits it; `released` is the cache's own account
    of an entry whose models are unloaded (ModelCache._released)."""

    def __init__(self, manager: ModelManager, memory: CacheMemory, statistics: CacheStatistics,
                 background: Callable[[Coroutine[Any, Any, None]], asyncio.Task[None]],
                 released: Callable[[CacheEntry], None]) -> None:
        self._manager = manager
        self._memory = memory
        self._statistics = statistics
        self._background = background
        self._released = released
        self._evicting: dict[str, asyncio.Future[None]] = {}  # key -> done when its eviction is

    def start(self, entry: CacheEntry) -> asyncio.Task[None]:
        """Unload an entry uncharged just now (no request finds it from here) in a task of its own, which raises what
        unloading it raised; `of(entry.key)` is done, without raising, once it is."""
        self._statistics.evictions += 1
        self._memory.unloading(entry.size)
        self._evicting[entry.key] = asyncio.get_running_loop().create_future()
        return self._background(self._unloaded(entry, entry.size))

    def of(self, key: str) -> asyncio.Future[None] | None:
        """Done when the eviction of `key` under way is (None when none is)."""
        return self._evicting.get(key)

    def under_way(self) -> list[asyncio.Future[None]]:
        """Each eviction under way, done when it is."""
        return list(self._evicting.values())

    async def cleared(self, key: str) -> None:
        """Returns once no eviction of `key` is under way (a load of it waits for that)."""
        while (evicting := self._evicting.get(key)) is not None:
            await asyncio.shield(evicting)  # its models still hold their names in the manager

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
        self._statistics.unload.observe(time.monotonic() - started)
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
