"""Per-model scheduling: each request runs on the next free instance, off the event loop.

One scheduler per loaded model version, shared by every protocol. The contract is
submit (awaitable) / inflight / stop; dynamic batching plugs in behind `submit`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from modelhost.backends.base import Model
from modelhost.errors import unavailable


class Scheduler:
    """Owns the model's instances: one call at a time per instance, one thread per instance."""

    def __init__(self, label: str, instances: Sequence[Model]) -> None:
        self._label = label
        self._instances = list(instances)
        self._executor = ThreadPoolExecutor(max_workers=len(self._instances), thread_name_prefix=label)
        self._free: asyncio.Queue[Model] = asyncio.Queue()
        for instance in self._instances:
            self._free.put_nowait(instance)
        self._inflight = 0
        self._accepting = True
        self._drained = asyncio.Event()

    async def submit(self, inputs: dict[str, np.ndarray], outputs: Sequence[str]) -> dict[str, np.ndarray]:
        if not self._accepting:
            raise unavailable(f"model {self._label} is stopping")
        self._inflight += 1
        try:
            instance = await self._free.get()
            try:
                loop = asyncio.get_running_loop()
                return await loop.run_in_executor(self._executor, instance.infer, inputs, outputs)
            finally:
                self._free.put_nowait(instance)
        finally:
            self._inflight -= 1
            if self._inflight == 0 and not self._accepting:
                self._drained.set()

    def inflight(self) -> int:
        return self._inflight

    async def stop(self) -> None:
        """Stop accepting, wait for the requests already accepted, then unload the instances."""
        self._accepting = False
        if self._inflight:
            await self._drained.wait()
        await asyncio.get_running_loop().run_in_executor(self._executor, self._unload)
        self._executor.shutdown(wait=True)

    def _unload(self) -> None:
        for instance in self._instances:
            instance.unload()
