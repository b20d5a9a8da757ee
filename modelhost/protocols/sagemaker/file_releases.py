"""What happens to an unloaded archive's files (kept for its next load, or removed: ArchiveModels.release), done
off the event loop without a thread hop of its own where a load follows.

A multi-model endpoint's miss usually evicts a model to make room for the one it loads: the evicted model's files
are released by that load's job on its loading thread, before it fetches (so a reload of the same archive finds
its kept copy). Files released while no load is under way, or left when a load ends (one that had passed its job
when they came), are released in a thread of their own, as before.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable

from modelhost.store.archive_models import FetchedModels

log = logging.getLogger("modelhost.model_cache")

Release = Callable[[str, FetchedModels], None]


class FileReleases:
    def __init__(self, release: Release) -> None:
        self._release = release
        self._pending: deque[tuple[str, FetchedModels]] = deque()  # appended on the loop, taken by any thread
        self._tasks: set[asyncio.Task[None]] = set()

    def add(self, key: str, fetched: FetchedModels, load_follows: bool) -> None:
        """On the loop: release `fetched`, the files of `key`'s unloaded models; `load_follows`: a load is under way,
        whose end calls `load_ended`."""
        self._pending.append((key, fetched))
        if not load_follows:
            self.load_ended()

    def load_ended(self) -> None:
        """On the loop: what no load's job released goes in a thread."""
        if self._pending:
            task = asyncio.create_task(asyncio.to_thread(self.run))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    def run(self) -> None:
        """Blocking, in any thread (a load's job runs it first): release every pending copy."""
        while True:
            try:
                key, fetched = self._pending.popleft()
            except IndexError:
                return
            try:
                self._release(key, fetched)
            except Exception:  # noqa: BLE001 - a copy that cannot be kept or removed must not fail a load
                log.warning("could not release the files of %s", key, exc_info=True)

    async def stop(self) -> None:
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await asyncio.to_thread(self.run)
