"""How much memory this process holds, for charging loaded models to the multi-model cache.

`held_bytes()` prefers glibc's count of bytes allocated and not freed (mallinfo2): a model load's
growth in it is what the model keeps, even when the load reuses memory an unloaded model freed.
Resident memory (the fallback, outside glibc) undercounts such loads: freed pages stay resident
and are reused without growing it.
"""

from __future__ import annotations

import ctypes
import os
import threading
from collections.abc import Callable


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost",
    )]


def _mallinfo2() -> Callable[[], int] | None:
    try:
        function = ctypes.CDLL(None).mallinfo2
    except (OSError, AttributeError):  # not glibc, or glibc older than 2.33
        return None
    function.restype = _MallInfo2
    function.argtypes = []

    def allocated() -> int:
        info = function()
        return int(info.uordblks + info.hblkhd)  # in use in the heap arenas, plus mmap-ed blocks

    return allocated


def resident_bytes() -> int:
    """The process's resident memory (Linux /proc; 0 elsewhere)."""
    try:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


_allocated = _mallinfo2()
held_bytes: Callable[[], int] = _allocated or resident_bytes
# Whether held_bytes() drops when memory is freed (malloc's count does; resident memory mostly does not).
COUNTS_FREES = _allocated is not None


class PeakMeter:
    """`with PeakMeter() as meter:` samples held_bytes() in a thread while the block runs; then `growth` is
    what the block kept and `peak_growth` the most it held at once (a load reads files and builds tensors
    from them: its peak is well above what it keeps). Sampling can miss a spike shorter than `interval`."""

    def __init__(self, interval: float = 0.001) -> None:
        self._interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, name="modelhost-peak-meter", daemon=True)
        self.start = self.peak = self.end = 0

    def __enter__(self) -> PeakMeter:
        self.start = self.peak = held_bytes()
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        self._thread.join()
        self.end = held_bytes()
        self.peak = max(self.peak, self.end)

    @property
    def growth(self) -> int:
        return self.end - self.start

    @property
    def peak_growth(self) -> int:
        return self.peak - self.start

    def _sample(self) -> None:
        while not self._stop.wait(self._interval):
            self.peak = max(self.peak, held_bytes())
