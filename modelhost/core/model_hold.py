"""Holding a model version while a request uses it: the version is not retired, unloaded or evicted under it.

`ModelManager.acquire(name, version)` gives a `ModelHold`: `async with manager.acquire("m") as model:`
looks the version up and pins it in one step (no `await` between), and a version swapped out by a reload
or taken away by an unload waits for its pins to go before its scheduler stops (`Pins.released`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from types import TracebackType
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from modelhost.core.served_model import ServedModel


class Pins:
    """How many requests hold one model version. Runs on the event loop only."""

    __slots__ = ("count", "_released")

    def __init__(self) -> None:
        self.count = 0
        self._released: asyncio.Event | None = None

    def hold(self) -> None:
        self.count += 1

    def release(self) -> None:
        self.count -= 1
        if not self.count and self._released is not None:
            self._released.set()

    async def released(self) -> None:
        """Returns once no request holds the version (at once if none does); any number may wait."""
        while self.count:
            if self._released is None or self._released.is_set():
                self._released = asyncio.Event()
            await self._released.wait()


class ModelHold:
    """`async with` gives the version `hold` looks up and pins (ModelManager.hold), released when the block ends."""

    __slots__ = ("_hold", "_served")

    def __init__(self, hold: Callable[[], ServedModel]) -> None:
        self._hold = hold
        self._served: ServedModel | None = None

    def take(self) -> ServedModel:
        """The version, pinned; raises NOT_FOUND or UNAVAILABLE, pinning nothing."""
        self._served = self._hold()
        return self._served

    def give_back(self) -> None:
        assert self._served is not None
        self._served.pins.release()
        self._served = None

    async def __aenter__(self) -> ServedModel:
        return self.take()

    async def __aexit__(self, kind: type[BaseException] | None, error: BaseException | None,
                        traceback: TracebackType | None) -> None:
        self.give_back()
