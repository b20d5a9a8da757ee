"""One served embedding table: its current version's ids and rows on disk, the rows updated since (delta.log), and
its share of the RAM cache.

A lookup takes any int64 ids, looks each distinct id up once (a request's 500 candidates repeat user and context
ids), finds rows in the cache, reads the rest from the log (rows updated since the version was written) or from
rows.bin, offers what it read to the cache, and answers float32 vectors; an id the table does not hold gets the
table's default vector and is counted.

Updates (table_updates.py) append to the log and publish the rows' new records; a lookup sees, for each row, the
record it found when it looked: the old vector or the new, whole (records and rows.bin are never rewritten). A
lookup that read a row before an update does not cache what it read. Which row holds an id: row_map.py.
"""

from __future__ import annotations

import threading
from concurrent.futures import Executor
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from modelhost.embeddings.delta_log import DeltaLog
from modelhost.embeddings.disk_rows import DiskRows, release_buffer
from modelhost.embeddings.id_index import IdIndex
from modelhost.embeddings.row_cache import SlotPool
from modelhost.embeddings.row_map import RowMap
from modelhost.embeddings.table_files import DELTA, ROWS, TableMeta, current_version, read_ids, read_meta
from modelhost.embeddings.table_updates import CachedCopies, FrozenLog, TableClosed, TableUpdates


@dataclass(slots=True)
class TableCounts:
    """A table's lookups since it was opened (for its metrics)."""

    lookups: int = 0
    ids: int = 0
    missing_ids: int = 0
    log_reads: int = 0
    updates: int = 0
    updated_rows: int = 0
    compactions: int = 0  # of the table's delta log into a new version (compaction.py)
    compaction_seconds: float = 0.0


class EmbeddingTable:
    def __init__(self, name: str, path: Path, table_id: int, executor: Executor | None, direct_io: bool = True,
                 pool: SlotPool | None = None, version: Path | None = None, ids: IdIndex | None = None) -> None:
        self.name = name
        self.path = path
        self.version = current_version(path) if version is None else version
        self.meta: TableMeta = read_meta(self.version)
        self._map = RowMap(read_ids(self.version, self.meta) if ids is None else ids)
        self._codec = self.meta.codec
        self._default = self.meta.default_vector()
        self._cached = CachedCopies(table_id)  # its pool (None: nothing cached)
        self.table_id = table_id
        self.counts = TableCounts()
        self._disk = DiskRows(self.version / ROWS, self.meta, executor, direct_io)
        self._updates = TableUpdates(self.version / DELTA, self._codec, self._map, name, self._cached)
        self._in_flight = 0
        self._closing = False
        self._idle = threading.Condition()
        if pool is not None:
            self.use_pool(pool)

    @property
    def pool(self) -> SlotPool | None:
        return self._cached.pool

    def use_pool(self, pool: SlotPool) -> None:
        """Cache in `pool` from now on (starting empty), no longer in the last one."""
        with self._updates.publish_lock:
            old, self._cached.pool = self._cached.pool, None
            pool.register(self.table_id, self.rows)
            self._cached.pool = pool
        if old is not None:
            old.forget(self.table_id)

    @property
    def rows(self) -> int:
        """Rows the table holds: the version's and those added since."""
        return self._map.rows

    @property
    def dim(self) -> int:
        return self.meta.dim

    @property
    def direct_io(self) -> bool:
        return self._disk.direct

    @property
    def disk(self) -> DiskRows:
        """The version's rows.bin reader (its reads, bytes and latency, for the metrics)."""
        return self._disk

    def lookup(self, ids: np.ndarray) -> np.ndarray:
        """float32 [*ids.shape, dim]: each id's vector, the default vector for an id the table does not hold.
        Raises TableClosed once the table is closing (a newer version replaced it)."""
        self._enter()
        try:
            return self._lookup(ids)
        finally:
            self._leave()

    def update(self, ids: np.ndarray, vectors: np.ndarray) -> int:
        """Add or replace rows: durable when this returns. Returns how many rows were new. Raises ValueError for
        vectors of the wrong shape or values the table's dtype cannot hold, TableClosed as `lookup`."""
        self._enter()
        try:
            updated, added = self._updates.update(ids, vectors)
        finally:
            self._leave()
        self.counts.updates += 1
        self.counts.updated_rows += updated
        return added

    def warm(self, ids: np.ndarray, chunk: int = 65_536) -> int:
        """Fill the cache with the rows of `ids` (hottest first) until it is full; returns the rows cached."""
        pool = self._cached.pool
        if pool is None or not pool.capacity:
            return 0
        start = 0
        try:
            # Chunks no larger than the room left: a lookup caches its rows in row order, not in the list's.
            while start < len(ids) and (room := pool.capacity - pool.cached_rows(self.table_id)) > 0:
                self.lookup(ids[start:start + min(chunk, room)])
                start += min(chunk, room)
        finally:
            release_buffer()
        return pool.cached_rows(self.table_id)

    def _enter(self) -> None:
        with self._idle:
            if self._closing:
                raise TableClosed(self.name)
            self._in_flight += 1

    def _leave(self) -> None:
        with self._idle:
            self._in_flight -= 1
            self._idle.notify_all()

    def _lookup(self, ids: np.ndarray) -> np.ndarray:
        flat = ids.reshape(-1).astype(np.int64, copy=False)
        unique, inverse = np.unique(flat, return_inverse=True)
        rows = self._map.rows_of(unique)
        known = rows >= 0
        wanted = rows[known]
        data = np.empty((len(wanted), self._codec.row_bytes), dtype=np.uint8)
        generation = self._updates.generation
        pool = self._cached.pool
        missed = pool.get(self.table_id, wanted, data) if pool is not None else np.ones(len(wanted), dtype=bool)
        if missed.any():
            self._read_missed(wanted, data, missed, generation, pool)
        if len(wanted) == len(unique):  # every id held (the usual case): no second copy of the vectors
            vectors = self._codec.decode(data)
        else:
            vectors = np.empty((len(unique), self.meta.dim), dtype=np.float32)
            vectors[known] = self._codec.decode(data)
            vectors[~known] = self._default
        counts = self.counts
        counts.lookups += 1
        counts.ids += len(flat)
        counts.missing_ids += int(len(unique) - len(wanted))
        result: np.ndarray = vectors[inverse].reshape(*ids.shape, self.meta.dim)
        return result

    def _read_missed(self, wanted: np.ndarray, data: np.ndarray, missed: np.ndarray, generation: int,
                     pool: SlotPool | None) -> None:
        """Fill `data` for the rows the cache did not have: updated ones from the log, the rest from rows.bin."""
        places = np.flatnonzero(missed)
        rows = wanted[places]
        records = self._updates.records.of(rows)
        from_log = records >= 0
        if from_log.any():
            data[places[from_log]] = self._updates.log.read(records[from_log])
            self.counts.log_reads += int(from_log.sum())
        from_disk = ~from_log
        data[places[from_disk]] = self._disk.read(rows[from_disk])
        if pool is None:
            return
        with self._updates.publish_lock:  # an update between the read and now must not undo it in the cache
            changed = self._updates.changed_since(rows, generation)
            pool.admit(self.table_id, rows, data[places], changed)

    @property
    def ids(self) -> IdIndex:
        """The version's ids (rows 0..len-1; rows added since are not in it)."""
        return self._map.ids

    @property
    def log(self) -> DeltaLog:
        return self._updates.log

    def rows_of(self, unique: np.ndarray) -> np.ndarray:
        """Rows of ids (sorted, unique); -1 for an id the table does not hold."""
        return self._map.rows_of(unique)

    def ids_of(self, rows: np.ndarray) -> np.ndarray:
        """The id of each row (rows < self.rows)."""
        return self._map.ids_of(rows)

    def freeze(self) -> FrozenLog:
        """The log as it is now, for a compaction (updates wait for this copy, lookups do not)."""
        return self._updates.freeze()

    def updates_held(self) -> AbstractContextManager[None]:
        """Hold updates back (a compaction's switch to the new version)."""
        return self._updates.held()

    def retire(self) -> None:
        """Refuse updates from now on (TableClosed: the caller retries on the version that replaced this one);
        under `updates_held`."""
        self._updates.retire()

    def apply_records(self, ids: np.ndarray, encoded: np.ndarray) -> None:
        """Apply log records (ids and encoded rows, in log order) copied from the version this one replaces."""
        self._updates.apply_records(ids, encoded)

    def close(self) -> None:
        """Free the table's cache share and files once its lookups in progress finish."""
        with self._idle:
            self._closing = True
            self._idle.wait_for(lambda: self._in_flight == 0)
        if self._cached.pool is not None:
            self._cached.pool.forget(self.table_id)
        self._disk.close()
        self._updates.log.close()

