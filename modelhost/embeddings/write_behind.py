"""A large file written front to back without its pages piling up dirty in the OS page cache until one final
fsync: each piece written is sent to the disk at once (`sync_file_range`, asynchronous), the piece before it is
waited for and dropped from the page cache. The disk then takes the writer's pace in small requests all along,
and the final sync has at most two pieces left to flush.

Why: a compaction rewrites a whole table (gigabytes) paced over minutes; left to the kernel, its pages stay dirty
until 30 s old or the final fsync, which then flushes hundreds of megabytes at once while lookups' disk reads
queue behind them (a lookup waited 0.3 s for it). Where `sync_file_range` is missing (not Linux) each piece is
synced with fdatasync instead.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
from collections.abc import Callable

_WAIT_BEFORE, _WRITE, _WAIT_AFTER = 1, 2, 4  # SYNC_FILE_RANGE_* (linux/fs.h)
PIECE = 1 << 20  # bytes written (and then paced) at a time; the unit sent to the disk


def _sync_file_range() -> Callable[[int, int, int, int], int] | None:
    name = ctypes.util.find_library("c")
    try:
        function = ctypes.CDLL(name, use_errno=True).sync_file_range  # the call releases the GIL
    except (OSError, AttributeError):
        return None
    function.argtypes = (ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint)
    function.restype = ctypes.c_int
    found: Callable[[int, int, int, int], int] = function
    return found


_sync_range = _sync_file_range()


def sync_range(fd: int, offset: int, size: int, flags: int) -> None:
    if _sync_range is None:
        if flags & _WAIT_AFTER:
            os.fdatasync(fd)
        return
    if _sync_range(fd, offset, size, flags) != 0:
        error = ctypes.get_errno()
        raise OSError(error, os.strerror(error))


class WriteBehind:
    """Writes to a file opened for writing from its start (`fd`, owned by the caller), a PIECE at a time; `paced`
    is called with each piece's size after it is written (the writer's pace)."""

    def __init__(self, fd: int, paced: Callable[[int], None] | None = None) -> None:
        self._fd = fd
        self._paced = paced
        self._end = 0  # bytes written
        self._sent = 0  # bytes sent to the disk (the last piece's writeback may still be under way)
        self._done = 0  # bytes on the disk and dropped from the page cache

    def write(self, data: bytes | memoryview) -> int:
        view = memoryview(data).cast("B")
        for start in range(0, len(view), PIECE):
            part = view[start:start + PIECE]
            while len(part):
                part = part[os.write(self._fd, part):]
            size = min(PIECE, len(view) - start)
            self._end += size
            if self._end - self._sent >= PIECE:
                self._behind()
            if self._paced is not None:
                self._paced(size)
        return len(view)

    def _behind(self) -> None:
        """Send what was written since the last call to the disk; wait for the piece before it and drop it."""
        sync_range(self._fd, self._sent, self._end - self._sent, _WRITE)
        if self._sent > self._done:
            sync_range(self._fd, self._done, self._sent - self._done, _WAIT_BEFORE | _WRITE | _WAIT_AFTER)
            os.posix_fadvise(self._fd, self._done, self._sent - self._done, os.POSIX_FADV_DONTNEED)
            self._done = self._sent
        self._sent = self._end

    def finish(self) -> None:
        """Make the whole file durable (fsync: its last pieces and its size) and drop its pages."""
        os.fsync(self._fd)
        os.posix_fadvise(self._fd, 0, 0, os.POSIX_FADV_DONTNEED)
