"""How much memory this process holds, for charging loaded models to the multi-model cache.

`held_bytes()` prefers glibc's count of bytes allocated and not freed (mallinfo2): a model load's
growth in it is what the model keeps, even when the load reuses memory an unloaded model freed.
Resident memory (the fallback, outside glibc) undercounts such loads: freed pages stay resident
and are reused without growing it.
"""

from __future__ import annotations

import ctypes
import os
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
