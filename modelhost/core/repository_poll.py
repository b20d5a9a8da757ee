"""Poll mode: read the repository every few seconds and apply what changed.

A new model directory loads; a removed one unloads; a changed config.pbtxt (or any file beside it)
reloads every version; a new, changed or removed version directory loads, reloads or unloads that
version as the version policy says. Every reload is the manager's zero-downtime one, and a failed
one keeps the loaded versions serving. Changes are found from file names, sizes and modification
times, so a model whose files are rewritten in place reloads too.
"""

from __future__ import annotations

import asyncio
import logging

from modelhost.core.manager import ModelManager
from modelhost.store.local import ModelFingerprint
from modelhost.store.model_store import ModelStore

log = logging.getLogger("modelhost.poll")


class RepositoryPoller:
    def __init__(self, manager: ModelManager, store: ModelStore, interval_seconds: float) -> None:
        self._manager = manager
        self._store = store
        self._interval = interval_seconds
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self._interval)
            try:
                await self.poll()
            except Exception:
                log.exception("polling the model repository failed")

    async def poll(self) -> None:
        """Apply every change since the last poll; models change concurrently and fail alone. The store is read in
        one job off the loop: a job per model (300 of them) cost the loop and the GIL 0.2 s a poll."""
        known = set(self._manager.names())
        names, current = await asyncio.to_thread(self._read, known)
        changes = [self._apply(name, current[name]) for name in sorted(names & known)]
        changes += [self._add(name) for name in sorted(names - known)]
        changes += [self._evict(name) for name in sorted(known - names)]
        await asyncio.gather(*changes, return_exceptions=True)

    def _read(self, known: set[str]) -> tuple[set[str], dict[str, ModelFingerprint | None]]:
        """The store's models, and the fingerprints of those already known (blocking)."""
        names = set(self._store.list())
        return names, self._store.fingerprints(sorted(names & known))

    async def _add(self, name: str) -> None:
        log.info("poll: new model %s", name)
        await self._manager.load_all([name])

    async def _evict(self, name: str) -> None:
        log.info("poll: model %s left the repository, unloading it", name)
        await self._manager.evict(name)

    async def _apply(self, name: str, current: ModelFingerprint | None) -> None:
        loaded = self._manager.fingerprint(name)
        if current is None or current == loaded:
            return
        versions = loaded.changed_versions(current) if loaded is not None else None
        log.info("poll: model %s changed (%s), applying", name,
                 "config" if versions is None else f"versions {sorted(versions)}" if versions else "versions removed")
        await self._manager.reload_changed(name, versions)
