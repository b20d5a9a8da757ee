"""A served table's version rewritten with the first records of its delta log applied: the compaction's new
version (compaction.py), written beside the served one and not made current here.

Streamed a chunk of rows at a time (rows.bin read in order, the updated rows of the chunk taken from the log, the
ids added since merged in id order), so its memory is a chunk's, whatever the table's size; the pages it reads
and writes are dropped from the OS page cache as it goes (the store reads the table with O_DIRECT: a table copy in
the page cache would only push out other files), and what it writes goes to the disk a MiB at a time behind the
writer (write_behind.py), never all at the final sync. Paced: at most PACE_BYTES a second read and written together,
so that lookups' disk reads keep most of the disk. Written under a hidden name and renamed to `vN` only when
whole (a crash leaves a hidden directory, removed by the next compaction, never a partial version).
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import numpy as np

from modelhost.embeddings.id_index import IdIndex
from modelhost.embeddings.table import EmbeddingTable
from modelhost.embeddings.table_files import (
    BLOCK,
    IDS,
    META,
    ROWS,
    TableMeta,
    fsync_path,
    next_version_name,
    write_rows,
)
from modelhost.embeddings.table_updates import FrozenLog
from modelhost.embeddings.write_behind import PIECE, WriteBehind

CHUNK_ROWS = 65_536  # rows read, updated and written at a time, at most (rounded down to whole blocks)
PACE_BYTES = 32 << 20  # bytes a second read and written, at most (96 MiB/s raised lookups p50 1.5x, 32 did not)
STAGING = ".compacting-"


def remove_staging(table: Path) -> None:
    """Remove what an interrupted compaction left (only a compaction writes these names)."""
    for entry in table.glob(f"{STAGING}*"):
        shutil.rmtree(entry, ignore_errors=True)


def write_compacted(table: EmbeddingTable, frozen: FrozenLog) -> tuple[Path, IdIndex]:
    """Write the table's version with `frozen` applied as a new version directory (not current); its path and
    its ids' index, built as they were written (opening the version then neither reads ids.npy back from the
    disk nor builds the index in one burst at the switch)."""
    meta = table.meta
    rows = len(table.ids) + len(frozen.added_ids)
    new_meta = TableMeta(meta.dim, meta.dtype, rows, meta.default)
    name = next_version_name(table.path)
    staging = table.path / f"{STAGING}{name}"
    remove_staging(table.path)
    staging.mkdir()
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)
    rows_fd, ids_fd = os.open(staging / ROWS, flags, 0o644), os.open(staging / IDS, flags, 0o644)
    try:
        pace = _Pace()
        rows_out, ids_out = WriteBehind(rows_fd, pace), WriteBehind(ids_fd, pace)
        np.lib.format.write_array_header_1_0(ids_out, {"descr": "<i8", "fortran_order": False, "shape": (rows,)})
        index = _new_index(table, frozen, rows)
        _Rewrite(table, frozen, new_meta, rows_out, ids_out, pace, index).run()
        index.seal()
        rows_out.finish()
        ids_out.finish()
    finally:
        os.close(rows_fd)
        os.close(ids_fd)
    (staging / META).write_text(json.dumps(new_meta.to_json()))
    fsync_path(staging / META)
    fsync_path(staging)
    version = table.path / name
    os.replace(staging, version)
    fsync_path(table.path)
    return version, index


def _new_index(table: EmbeddingTable, frozen: FrozenLog, rows: int) -> IdIndex:
    """An empty index for the new version's ids: the old ones and those added, from the least to the greatest."""
    ends = [frozen.added_ids[[0, -1]]] if len(frozen.added_ids) else []
    if len(table.ids):
        ends.append(table.ids.ids_of(np.array([0, len(table.ids) - 1])))
    bounds = np.concatenate(ends) if ends else np.zeros(1, dtype=np.int64)
    return IdIndex(rows, int(bounds.min()), int(bounds.max()))


class _Rewrite:
    def __init__(self, table: EmbeddingTable, frozen: FrozenLog, meta: TableMeta, rows_out: WriteBehind,
                 ids_out: WriteBehind, pace: _Pace, index: IdIndex) -> None:
        self._table = table
        self._frozen = frozen
        self._meta = meta
        self._rows_out = rows_out
        self._ids_out = ids_out
        self._written = 0  # rows written
        self._pending = np.empty((0, meta.codec.row_bytes), dtype=np.uint8)  # the last, partial block's rows
        self._fd = os.open(table.version / ROWS, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        self._pace = pace
        self._index = index

    def run(self) -> None:
        try:
            old_rows = len(self._table.ids)
            added = self._frozen.added_ids
            taken = 0
            per_block = self._table.meta.rows_per_block
            # Whole blocks a chunk: each chunk's first row starts a block (85 float16 rows of 48 bytes fill one).
            step = per_block * max(1, CHUNK_ROWS // per_block) if per_block else CHUNK_ROWS
            for start in range(0, old_rows, step):
                end = min(start + step, old_rows)
                ids = self._table.ids.ids_of(np.arange(start, end))
                upto = len(added) if end == old_rows else int(np.searchsorted(added, ids[-1]))
                self._chunk(start, ids, self._old_rows(start, end), taken, upto)
                taken = upto
            if taken < len(added):  # a version that had no rows
                self._chunk(0, np.empty(0, np.int64), np.empty((0, self._meta.codec.row_bytes), np.uint8), taken,
                            len(added))
            self._emit(self._pending, final=True)
        finally:
            os.close(self._fd)

    def _chunk(self, start: int, ids: np.ndarray, data: np.ndarray, added_from: int, added_to: int) -> None:
        """Old rows start.. (`ids`, `data`) with their updates applied, merged with added ids [from, to)."""
        frozen, log = self._frozen, self._table.log
        first, last = np.searchsorted(frozen.rows, [start, start + len(ids)])
        if last > first:
            data[frozen.rows[first:last] - start] = log.read(frozen.records[first:last])
        if added_to > added_from:
            extra_ids = frozen.added_ids[added_from:added_to]
            places = np.searchsorted(frozen.rows, frozen.added_rows[added_from:added_to])
            extra = log.read(frozen.records[places])
            ids = np.concatenate((ids, extra_ids))
            order = np.argsort(ids, kind="stable")
            ids, data = ids[order], np.concatenate((data, extra))[order]
        self._ids_out.write(ids.astype("<i8").tobytes())
        self._index.add(ids)
        self._emit(np.concatenate((self._pending, data)) if len(self._pending) else data, final=False)

    def _emit(self, rows: np.ndarray, final: bool) -> None:
        """Write whole blocks of `rows` (all of them when final); keep the rest for the next chunk."""
        per_block = self._meta.rows_per_block
        whole = len(rows) if final or per_block == 0 else len(rows) - len(rows) % per_block
        if whole:
            write_rows(self._rows_out, self._meta, self._written, rows[:whole])
            self._written += whole
        self._pending = rows[whole:].copy()

    def _old_rows(self, start: int, end: int) -> np.ndarray:
        """Rows start..end-1 of the old rows.bin (start begins a block), uint8 [n, row_bytes]."""
        meta = self._table.meta
        row_bytes, per_block = meta.codec.row_bytes, meta.rows_per_block
        if per_block == 0:
            stride = meta.row_stride_blocks * BLOCK
            data = self._pread(start * stride, (end - start) * stride)
            whole: np.ndarray = np.ascontiguousarray(data.reshape(end - start, stride)[:, :row_bytes])
            return whole
        blocks = -(-(end - start) // per_block)
        data = self._pread(start // per_block * BLOCK, blocks * BLOCK).reshape(blocks, BLOCK)
        # A copy only where rows leave a block's end unused; else a view of the buffer read (not shared).
        rows: np.ndarray = np.ascontiguousarray(data[:, : per_block * row_bytes].reshape(-1, row_bytes)[: end - start])
        return rows

    def _pread(self, offset: int, size: int) -> np.ndarray:
        """`size` bytes at `offset`, read a piece at a time at the pace, dropped from the page cache."""
        buffer = bytearray(size)
        view = memoryview(buffer)
        for start in range(0, size, PIECE):
            part = view[start:start + PIECE]
            if os.preadv(self._fd, [part], offset + start) != len(part):
                raise OSError(f"short read of {ROWS} at {offset + start}")
            self._pace(len(part))
        os.posix_fadvise(self._fd, offset, size, os.POSIX_FADV_DONTNEED)
        return np.frombuffer(buffer, dtype=np.uint8)


class _Pace:
    """At most PACE_BYTES a second read and written together: called with each piece's size once it moved."""

    def __init__(self) -> None:
        self._started = time.monotonic()
        self._moved = 0

    def __call__(self, size: int) -> None:
        self._moved += size
        ahead = self._moved / PACE_BYTES - (time.monotonic() - self._started)
        if ahead > 0:
            time.sleep(ahead)
