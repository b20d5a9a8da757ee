"""Cores an execution may borrow while the rest of the server leaves them idle.

An instance computes on `InstanceSettings.threads` threads, its share of the cores: cores / instances, and
with --workers N cores / N per worker, so that every instance busy at once does not oversubscribe the cores.
But a single large request with the rest of the server idle then runs on that share alone: `rank` x 500 rows
at concurrency 1 under `--workers 2` on 2 cores served 0.71x the requests/s of one process. Giving every
worker every core fixed that and cost concurrency 4 a sixth (both workers' thread pools on the same cores).

So every process of the server counts, in its own slot of a shared array, the cores its instance threads
compute on now (`computing`), and an execution that can use more (backends/onnx.py splits a batch along its
rows; a TorchServe worker sets torch's thread count for the batch) asks how many are idle across the server and
claims them while it runs (`borrow`, `give_back`). With
--workers the array is a file the parent makes in the workers' directory, mapped by each worker; one process
alone keeps it in memory. A claim reads the others' slots without a lock: two processes may claim the same
idle core at once, which costs a moment's oversubscription, never a wrong answer.
"""

from __future__ import annotations

import mmap
import os
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import TypeVar

from modelhost.core import compute_threads
from modelhost.core.in_flight import InFlight

T = TypeVar("T")

SLOT_BYTES = 4  # a signed 32-bit count per process
FILE_NAME = "spare-cores"  # the array's file in the workers' directory


class SpareCores:
    def __init__(self, total: int, slots: memoryview, index: int, in_flight: InFlight | None = None) -> None:
        """`in_flight`: this process's requests; while more than one is in flight, nothing is lent (its instances
        have the next one to run, and the other workers as likely theirs)."""
        self.total = total
        self._slots = slots
        self._index = index
        self._in_flight = in_flight
        self._lock = threading.Lock()  # this process's threads update its slot one at a time
        self._helpers: ThreadPoolExecutor | None = None

    @classmethod
    def alone(cls, total: int, in_flight: InFlight | None = None) -> SpareCores:
        """For a server of one process."""
        return cls(total, memoryview(bytearray(SLOT_BYTES)).cast("i"), 0, in_flight)

    @classmethod
    def shared(cls, path: Path, index: int, total: int, in_flight: InFlight | None = None) -> SpareCores:
        """For worker `index` of the processes that map the array at `path` (made by `make_shared`)."""
        with open(path, "r+b") as file:
            mapped = mmap.mmap(file.fileno(), 0)
        return cls(total, memoryview(mapped).cast("i"), index, in_flight)

    def computing(self, cores: int) -> None:
        """`cores` more of this process's threads compute now (negative: fewer)."""
        with self._lock:
            self._slots[self._index] += cores

    def borrow(self, most: int) -> int:
        """Claim up to `most` cores that no process of the server computes on now; how many were claimed."""
        if self._in_flight is not None and self._in_flight.requests > 1:
            return 0
        with self._lock:
            idle = self.total - sum(self._slots)
            claimed = max(0, min(most, idle))
            self._slots[self._index] += claimed
        return claimed

    def submit(self, work: Callable[[], T]) -> Future[T]:
        """Run `work` on a helper thread at the compute priority (core/compute_threads.py)."""
        with self._lock:
            if self._helpers is None:
                self._helpers = ThreadPoolExecutor(thread_name_prefix="modelhost-part",
                                                   initializer=compute_threads.enter)
        return self._helpers.submit(work)

    def give_back(self, cores: int) -> None:
        self.computing(-cores)


def make_shared(path: Path, processes: int) -> None:
    """The array for `processes` workers, all slots 0 (the parent makes it before starting them)."""
    with open(path, "wb") as file:
        file.write(bytes(SLOT_BYTES * processes))
    os.chmod(path, 0o600)


_current: SpareCores | None = None


def configure(spare: SpareCores | None) -> None:
    """Set for the process as the server starts (app.py); None: nothing is lent."""
    global _current
    _current = spare


def current() -> SpareCores | None:
    return _current
