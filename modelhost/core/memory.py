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


def _malloc_trim() -> Callable[[int], int] | None:
    try:
        function = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):  # not glibc
        return None
    function.argtypes = [ctypes.c_size_t]
    function.restype = ctypes.c_int
    return function


# glibc's malloc_trim(pad): gives free heap pages back to the OS (glibc keeps freed memory for reuse, so resident
# memory would stay at a burst's peak); None off glibc.
malloc_trim = _malloc_trim()


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
    """`with PeakMeter() as meter:` samples held_bytes() every `interval` while the block runs; then `growth` is
    what the block kept and `peak_growth` the most it held at once (a load reads files and builds tensors
    from them: its peak is well above what it keeps). Sampling can miss a spike shorter than `interval`.

    One sampler thread serves every meter of the process and sleeps while none is open, so opening a meter
    (on the event loop, once per load) starts no thread. A reading walks malloc's free lists (about 50 µs in
    a process that has loaded and unloaded a few hundred models): every 5 ms costs a load about 1 % of a core,
    and catches the peak of any load long enough for its peak to matter (what a short load peaks at is
    below the cache's default estimate, twice its files plus 1 MiB)."""

    def __init__(self, interval: float = 0.005, start: int | None = None) -> None:
        """`start`: a held_bytes() reading the caller has just taken, to count from instead of taking another."""
        self.interval = interval
        self.start = self.peak = self.end = 0
        self._given_start = start

    def __enter__(self) -> PeakMeter:
        self.start = self.peak = held_bytes() if self._given_start is None else self._given_start
        _SAMPLER.add(self)
        return self

    def stop_sampling(self) -> None:
        """No more samples: the peak is what was sampled so far, and what `__exit__` reads then."""
        _SAMPLER.remove(self)

    def __exit__(self, *exc_info: object) -> None:
        _SAMPLER.remove(self)
        self.end = held_bytes()
        self.peak = max(self.peak, self.end)

    @property
    def growth(self) -> int:
        return self.end - self.start

    @property
    def peak_growth(self) -> int:
        return self.peak - self.start


class _Sampler:
    """The thread that samples for every open PeakMeter, started with the first one."""

    def __init__(self) -> None:
        self._open: set[PeakMeter] = set()
        self._changed = threading.Condition()
        self._thread: threading.Thread | None = None

    def add(self, meter: PeakMeter) -> None:
        with self._changed:
            self._open.add(meter)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="modelhost-peak-meter", daemon=True)
                self._thread.start()
            self._changed.notify()

    def remove(self, meter: PeakMeter) -> None:
        with self._changed:
            self._open.discard(meter)

    def _run(self) -> None:
        with self._changed:
            while True:
                while not self._open:
                    self._changed.wait()
                interval = min(meter.interval for meter in self._open)
                self._changed.wait(interval)  # releases the lock: meters open and close meanwhile
                if self._open:
                    held = held_bytes()
                    for meter in self._open:
                        meter.peak = max(meter.peak, held)


_SAMPLER = _Sampler()
