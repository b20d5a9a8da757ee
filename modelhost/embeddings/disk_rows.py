"""A version's rows.bin, read a batch of rows at a time: the units that hold them (the 512-byte sectors holding a
row where O_DIRECT allows reads that small and no row straddles one, else its 4 KiB block), each unit once, runs
of adjacent units in one read, the reads spread over the store's I/O threads (the GIL is released while each
waits on the disk). Sector reads keep the read buffer 8x smaller than block reads (a Zipf 1.0 request's 2,200
rows: 1.1 MB, not 9) for the same number of reads.

The file is opened with O_DIRECT where its filesystem allows: the OS page cache would otherwise be a second RAM
tier, unbounded by the cache budget and hiding the disk's real cost. Elsewhere (tmpfs) reads are buffered, with
readahead off (POSIX_FADV_RANDOM).
"""

from __future__ import annotations

import os
import threading
import time
from concurrent.futures import Executor
from pathlib import Path

import numpy as np

from modelhost.core.statistics import Histogram
from modelhost.embeddings.table_files import BLOCK, TableMeta

MAX_RUN_BYTES = 128 << 10  # adjacent units read at once, at most
SECTOR = 512
_READS_PER_THREAD = 8  # a batch of fewer reads than this per thread stays on the calling thread
KEEP_BUFFER_BYTES = 16 << 20  # a thread's read buffer kept between batches, at most
READ_SECONDS_BOUNDS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0)


class DiskRows:
    def __init__(self, path: Path, meta: TableMeta, executor: Executor | None, direct: bool = True) -> None:
        self.meta = meta
        self._executor = executor
        self._threads = getattr(executor, "_max_workers", 1) if executor is not None else 1
        self.direct = False
        flags = os.O_RDONLY | getattr(os, "O_CLOEXEC", 0)
        if direct and hasattr(os, "O_DIRECT"):
            try:
                self._fd = os.open(path, flags | os.O_DIRECT)
                self.direct = True
            except OSError:
                self._fd = os.open(path, flags)
        else:
            self._fd = os.open(path, flags)
        if not self.direct and hasattr(os, "posix_fadvise"):
            os.posix_fadvise(self._fd, 0, 0, os.POSIX_FADV_RANDOM)
        self.unit = _read_unit(meta, self._fd, self.direct)
        self.reads = 0  # read calls made, for the metrics
        self.bytes_read = 0
        self.latency = Histogram(READ_SECONDS_BOUNDS)  # seconds each batch's reads took together

    def read(self, rows: np.ndarray) -> np.ndarray:
        """The rows (row numbers, ascending, unique) as uint8 [n, row_bytes]."""
        meta = self.meta
        row_bytes = meta.codec.row_bytes
        if not len(rows):
            return np.empty((0, row_bytes), dtype=np.uint8)
        per_block = meta.rows_per_block
        if per_block == 0:  # each row its own run of blocks, one after another in the buffer
            stride = meta.row_stride_blocks
            first = rows.astype(np.int64) * stride
            data = self._read_units((first[:, None] + np.arange(stride)).reshape(-1), BLOCK)
            whole: np.ndarray = data.reshape(len(rows), stride * BLOCK)[:, :row_bytes].copy()
            return whole
        rows = rows.astype(np.int64)
        where = rows // per_block * BLOCK + rows % per_block * row_bytes  # each row's byte in rows.bin
        unit_of = where // self.unit
        starts = np.concatenate(([True], unit_of[1:] != unit_of[:-1]))
        data = self._read_units(unit_of[starts], self.unit)
        windows = np.lib.stride_tricks.as_strided(data, (len(data) - row_bytes + 1, row_bytes), (1, 1),
                                                  writeable=False)
        result: np.ndarray = windows[(np.cumsum(starts) - 1) * self.unit + where % self.unit]
        return result

    def _read_units(self, units: np.ndarray, size: int) -> np.ndarray:
        """Read `units` of `size` bytes (ascending, unique) into the calling thread's buffer, one after another:
        uint8, valid until this thread's next read."""
        runs = _runs(units, MAX_RUN_BYTES // size)
        data = _buffer(len(units) * size)
        started = time.monotonic()
        threads = min(self._threads, len(runs) // _READS_PER_THREAD)
        if threads <= 1 or self._executor is None:
            self._read_runs(runs, data, size)
        else:
            share = -(-len(runs) // threads)
            futures = [self._executor.submit(self._read_runs, runs[i:i + share], data, size)
                       for i in range(0, len(runs), share)]
            for future in futures:
                future.result()
        self.latency.observe(time.monotonic() - started)
        self.reads += len(runs)
        self.bytes_read += len(units) * size
        return data

    def _read_runs(self, runs: list[tuple[int, int, int]], data: np.ndarray, size: int) -> None:
        view = memoryview(data)  # type: ignore[arg-type]
        for place, unit, count in runs:
            got = os.preadv(self._fd, [view[place * size:(place + count) * size]], unit * size)
            if got != count * size:
                raise OSError(f"short read of rows.bin: {got} of {count * size} bytes at {unit * size}")

    def close(self) -> None:
        os.close(self._fd)


def _runs(units: np.ndarray, longest: int) -> list[tuple[int, int, int]]:
    """(place in the buffer, first unit, units) of each read: adjacent units together, `longest` at most."""
    places = np.arange(len(units))
    adjacent = np.concatenate(([False], np.diff(units) == 1))
    segment_start = np.maximum.accumulate(np.where(adjacent, 0, places))
    starts = np.flatnonzero(~adjacent | ((places - segment_start) % longest == 0))
    counts = np.diff(np.append(starts, len(units)))
    return list(zip(starts.tolist(), units[starts].tolist(), counts.tolist(), strict=True))


def _read_unit(meta: TableMeta, fd: int, direct: bool) -> int:
    """The smallest read (512 B .. 4 KiB) that no row straddles and that the file's O_DIRECT allows (a sector read
    is tried: EINVAL where the filesystem needs whole blocks)."""
    row_bytes, per_block = meta.codec.row_bytes, meta.rows_per_block
    if per_block == 0:
        return BLOCK
    starts = np.arange(per_block) * row_bytes
    for unit in (SECTOR, 2 * SECTOR, 4 * SECTOR, BLOCK):
        if np.any(starts // unit != (starts + row_bytes - 1) // unit):
            continue
        if direct and unit < BLOCK:
            try:
                os.preadv(fd, [memoryview(_buffer(unit)[:unit])], unit)  # type: ignore[arg-type]
            except OSError:
                return BLOCK
        return unit
    return BLOCK


_local = threading.local()


def release_buffer() -> None:
    """Free the calling thread's read buffer (a thread that reads once, as a table's warm start does, would
    otherwise keep up to KEEP_BUFFER_BYTES for good)."""
    _local.__dict__.pop("buffer", None)


def _buffer(size: int) -> np.ndarray:
    """The calling thread's read buffer, at least `size` bytes, BLOCK-aligned (O_DIRECT needs it), reused: fresh
    memory for every batch would cost a page fault per 4 KiB."""
    buffer: np.ndarray | None = getattr(_local, "buffer", None)
    if buffer is None or len(buffer) < size:
        raw = np.empty(max(size, 1 << 20) + BLOCK, dtype=np.uint8)
        skip = -raw.ctypes.data % BLOCK
        buffer = raw[skip:skip + max(size, 1 << 20)]
        if size <= KEEP_BUFFER_BYTES:  # a larger one (a request of uniform ids, nearly all misses) is not kept
            _local.buffer = buffer
    return buffer[:size]
