"""Rows updated while a version is served: appended to its delta.log, durable before the update is acknowledged,
replayed when the table is opened again.

    file   := header batch*
    header := b"MHDELTA1" row_bytes:u32
    batch  := count:u32 crc32(records):u32 record*count
    record := id:i64 row:row_bytes

A batch is written with one write and made durable with fdatasync; a crash while writing leaves a torn last
batch, which the replay drops (its CRC does not match) and cuts off. Records are never rewritten, so a record a
reader finds in the log is whole.
"""

from __future__ import annotations

import os
import struct
import threading
import zlib
from pathlib import Path

import numpy as np

MAGIC = b"MHDELTA1"
_HEADER = struct.Struct("<8sI")
_BATCH = struct.Struct("<II")


class DeltaLogError(Exception):
    """A log that belongs to another row size or is not a delta log."""


class DeltaLog:
    """One version's log. `replayed_ids`: the ids of the records found at open, in log order (record k is the
    k-th); their rows are read when asked for."""

    def __init__(self, path: Path, row_bytes: int) -> None:
        self.path = path
        self.row_bytes = row_bytes
        self._record = np.dtype([("id", "<i8"), ("row", np.uint8, (row_bytes,))])
        self._lock = threading.Lock()  # appends, one at a time; readers never wait for one (it syncs to disk)
        exists = path.exists()
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o644)
        self.count = 0  # records in the log
        # Per batch: its first record number and the byte offset of its records; `_batches` of them are valid.
        self._firsts = np.zeros(64, dtype=np.int64)
        self._offsets = np.zeros(64, dtype=np.int64)
        self._batches = 0
        if not exists or os.fstat(self._fd).st_size == 0:
            os.write(self._fd, _HEADER.pack(MAGIC, row_bytes))
            os.fsync(self._fd)
            self._end = _HEADER.size
            self.replayed_ids = np.empty(0, dtype=np.int64)
            return
        self.replayed_ids = self._replay()

    def append(self, ids: np.ndarray, rows: np.ndarray) -> int:
        """Append one batch and make it durable; returns the record number of its first record."""
        records = np.empty(len(ids), dtype=self._record)
        records["id"] = ids
        records["row"] = rows
        payload = records.tobytes()
        with self._lock:
            first = self.count
            os.pwrite(self._fd, _BATCH.pack(len(ids), zlib.crc32(payload)) + payload, self._end)
            os.fdatasync(self._fd)
            self._add_batch(first, self._end + _BATCH.size)
            self._end += _BATCH.size + len(payload)
            self.count += len(ids)
        return first

    def _add_batch(self, first: int, offset: int) -> None:
        """Record a batch's position; readers see it once `_batches` counts it (arrays are replaced, not resized,
        when they grow: a reader's arrays hold every batch it counted)."""
        count = self._batches
        if count == len(self._firsts):
            self._firsts = np.concatenate((self._firsts, np.zeros(count, dtype=np.int64)))
            self._offsets = np.concatenate((self._offsets, np.zeros(count, dtype=np.int64)))
        self._firsts[count] = first
        self._offsets[count] = offset
        self._batches = count + 1

    @property
    def size(self) -> int:
        """The log's bytes (header and whole batches)."""
        return self._end

    def records(self, start: int, end: int) -> tuple[np.ndarray, np.ndarray]:
        """Records `start`..`end`-1 (whole batches' records, in log order): their ids and rows."""
        count = self._batches
        firsts, offsets = self._firsts[:count], self._offsets[:count]
        parts = []
        for batch in range(max(int(np.searchsorted(firsts, start, side="right")) - 1, 0), count):
            first = int(firsts[batch])
            last = int(firsts[batch + 1]) if batch + 1 < count else self.count
            if first >= end:
                break
            skip, upto = max(start - first, 0), min(end, last) - first
            size = self._record.itemsize
            data = os.pread(self._fd, (upto - skip) * size, int(offsets[batch]) + skip * size)
            parts.append(np.frombuffer(data, dtype=self._record))
        found = np.concatenate(parts) if parts else np.empty(0, dtype=self._record)
        return found["id"].copy(), found["row"].copy()

    def read(self, numbers: np.ndarray) -> np.ndarray:
        """The rows of records `numbers` (record numbers), uint8 [n, row_bytes]."""
        rows = np.empty((len(numbers), self.row_bytes), dtype=np.uint8)
        count = self._batches
        firsts, offsets = self._firsts[:count], self._offsets[:count]
        batch = np.searchsorted(firsts, numbers, side="right") - 1
        places = offsets[batch] + (numbers - firsts[batch]) * self._record.itemsize + 8
        for index, position in enumerate(places.tolist()):
            data = os.pread(self._fd, self.row_bytes, position)
            rows[index] = np.frombuffer(data, dtype=np.uint8)
        return rows

    def _replay(self) -> np.ndarray:
        header = os.pread(self._fd, _HEADER.size, 0)
        if len(header) < _HEADER.size:
            raise DeltaLogError(f"{self.path}: not a delta log (too short)")
        magic, row_bytes = _HEADER.unpack(header)
        if magic != MAGIC:
            raise DeltaLogError(f"{self.path}: not a delta log")
        if row_bytes != self.row_bytes:
            raise DeltaLogError(f"{self.path}: its rows are {row_bytes} bytes, the table's {self.row_bytes}")
        size = os.fstat(self._fd).st_size
        position = _HEADER.size
        parts = []
        while position + _BATCH.size <= size:
            count, crc = _BATCH.unpack(os.pread(self._fd, _BATCH.size, position))
            length = count * self._record.itemsize
            payload = os.pread(self._fd, length, position + _BATCH.size)
            if len(payload) < length or zlib.crc32(payload) != crc:
                break  # a batch torn by a crash: it was never acknowledged
            parts.append(np.frombuffer(payload, dtype=self._record)["id"].copy())
            self._add_batch(self.count, position + _BATCH.size)
            self.count += count
            position += _BATCH.size + length
        if position < size:
            os.ftruncate(self._fd, position)
            os.fsync(self._fd)
        self._end = position
        ids: np.ndarray = np.concatenate(parts) if parts else np.empty(0, dtype=np.int64)
        return ids

    def close(self) -> None:
        os.close(self._fd)
