"""One served embedding table: its current version's ids and rows on disk, the rows updated since (delta.log), and
its share of the RAM cache.

A lookup takes any int64 ids, looks each distinct id up once (a request's 500 candidates repeat user and context
ids), finds rows in the cache, reads the rest from the log (rows updated since the version was written) or from
rows.bin, offers what it read to the cache, and answers float32 vectors; an id the table does not hold gets the
table's default vector and is counted.

An update appends its rows to the log (durable before it returns), then, under the cache's lock, points the
rows at their new records and refreshes cached copies. A lookup sees, for each row, the record it found when it
looked: the old vector or the new, whole (records and rows.bin are never rewritten). A lookup that read a row
before an update does not cache what it read.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent.futures import Executor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from modelhost.embeddings.delta_log import DeltaLog
from modelhost.embeddings.disk_rows import DiskRows, release_buffer
from modelhost.embeddings.id_index import IdIndex
from modelhost.embeddings.row_cache import SlotPool
from modelhost.embeddings.row_records import RowRecords
from modelhost.embeddings.table_files import DELTA, ROWS, TableMeta, current_version, read_ids, read_meta

_PUBLISH_ROWS = 2048  # updated rows made visible under the cache lock at a time


class TableClosed(Exception):
    """The table was closed (replaced by a newer version, or its last model unloaded)."""


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


@dataclass(frozen=True, slots=True)
class FrozenLog:
    """What a compaction writes into the new version: the log's first `cut` records, as the rows they updated
    (sorted, with each one's latest record) and the ids they added (sorted, with their rows)."""

    cut: int
    rows: np.ndarray
    records: np.ndarray
    added_ids: np.ndarray
    added_rows: np.ndarray


class EmbeddingTable:
    def __init__(self, name: str, path: Path, table_id: int, executor: Executor | None, direct_io: bool = True,
                 pool: SlotPool | None = None, version: Path | None = None) -> None:
        self.name = name
        self.path = path
        self.version = current_version(path) if version is None else version
        self.meta: TableMeta = read_meta(self.version)
        self._ids = read_ids(self.version, self.meta)
        self._codec = self.meta.codec
        self._default = self.meta.default_vector()
        self._pool: SlotPool | None = None  # None: nothing cached
        self.table_id = table_id
        self.counts = TableCounts()
        self._disk = DiskRows(self.version / ROWS, self.meta, executor, direct_io)
        self._log = DeltaLog(self.version / DELTA, self._codec.row_bytes)
        self._added: dict[int, int] = {}  # id not in the version -> its row (from len(ids) on)
        self._records = RowRecords()  # each updated row's latest log record
        self._generation = 0
        self._update_lock = threading.Lock()
        # Held while updated rows are published and while a lookup caches what it read: an update between a
        # lookup's read and its caching is seen (outside: then the pool's lock).
        self._publish_lock = threading.Lock()
        self._in_flight = 0
        self._closing = False
        self._retired = False  # replaced by a compacted version: updates go to that one
        self._idle = threading.Condition()
        self._replay(self._log.replayed_ids)
        if pool is not None:
            self.use_pool(pool)

    @property
    def pool(self) -> SlotPool | None:
        return self._pool

    def use_pool(self, pool: SlotPool) -> None:
        """Cache in `pool` from now on (starting empty), no longer in the last one."""
        with self._publish_lock:
            old, self._pool = self._pool, None
            pool.register(self.table_id, self.rows)
            self._pool = pool
        if old is not None:
            old.forget(self.table_id)

    @property
    def rows(self) -> int:
        """Rows the table holds: the version's and those added since."""
        return len(self._ids) + len(self._added)

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
            return self._update(ids, vectors)
        finally:
            self._leave()

    def warm(self, ids: np.ndarray, chunk: int = 65_536) -> int:
        """Fill the cache with the rows of `ids` (hottest first) until it is full; returns the rows cached."""
        pool = self._pool
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
        rows = self.rows_of(unique)
        known = rows >= 0
        wanted = rows[known]
        data = np.empty((len(wanted), self._codec.row_bytes), dtype=np.uint8)
        generation = self._generation
        pool = self._pool
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
        records = self._records.of(rows)
        from_log = records >= 0
        if from_log.any():
            data[places[from_log]] = self._log.read(records[from_log])
            self.counts.log_reads += int(from_log.sum())
        from_disk = ~from_log
        data[places[from_disk]] = self._disk.read(rows[from_disk])
        if pool is None:
            return
        with self._publish_lock:  # an update between the read and now must not be undone by caching the old row
            changed = self._records.changed_since(rows, generation) if self._generation != generation else None
            pool.admit(self.table_id, rows, data[places], changed)

    @property
    def ids(self) -> IdIndex:
        """The version's ids (rows 0..len-1; rows added since are not in it)."""
        return self._ids

    @property
    def log(self) -> DeltaLog:
        return self._log

    def freeze(self) -> FrozenLog:
        """The log as it is now, for a compaction (updates wait for this copy, lookups do not)."""
        with self._update_lock:
            rows, records = self._records.entries()
            added_ids = np.fromiter(self._added.keys(), np.int64, len(self._added))
            added_rows = np.fromiter(self._added.values(), np.int64, len(self._added))
            order = np.argsort(added_ids)
            return FrozenLog(self._log.count, rows, records, added_ids[order], added_rows[order])

    @contextmanager
    def updates_held(self) -> Iterator[None]:
        """Hold updates back (a compaction's switch to the new version)."""
        with self._update_lock:
            yield

    def retire(self) -> None:
        """Refuse updates from now on (TableClosed: the caller retries on the version that replaced this one);
        under `updates_held`."""
        self._retired = True

    def ids_of(self, rows: np.ndarray) -> np.ndarray:
        """The id of each row (rows < self.rows)."""
        ids = np.empty(len(rows), dtype=np.int64)
        inside = rows < len(self._ids)
        ids[inside] = self._ids.ids_of(rows[inside])
        if not inside.all():
            added_ids = np.fromiter(self._added.keys(), np.int64, len(self._added))
            added_rows = np.fromiter(self._added.values(), np.int64, len(self._added))
            order = np.argsort(added_rows)
            ids[~inside] = added_ids[order][np.searchsorted(added_rows[order], rows[~inside])]
        return ids

    def apply_records(self, ids: np.ndarray, encoded: np.ndarray) -> None:
        """Apply log records (ids and encoded rows, in log order) copied from the version this one replaces."""
        if len(ids):
            with self._update_lock:
                self._apply(*_latest(ids, encoded))

    def _update(self, ids: np.ndarray, vectors: np.ndarray) -> int:
        ids = ids.reshape(-1).astype(np.int64, copy=False)
        encoded = self._codec.encode(vectors)
        if len(encoded) != len(ids):
            raise ValueError(f"{len(ids)} ids but {len(encoded)} vectors")
        unique, encoded = _latest(ids, encoded)
        with self._update_lock:  # updates one at a time, in log order
            if self._retired:
                raise TableClosed(self.name)
            added = self._apply(unique, encoded)
        self.counts.updates += 1
        self.counts.updated_rows += len(unique)
        return added

    def _apply(self, unique: np.ndarray, encoded: np.ndarray) -> int:
        """Log and publish rows (unique ids); under the update lock. Returns how many were new."""
        first = self._log.append(unique, encoded)
        rows = self.rows_of(unique)
        new = rows < 0
        rows[new] = self.rows + np.arange(int(new.sum()))
        records = np.arange(first, first + len(unique))
        for start in range(0, len(rows), _PUBLISH_ROWS):  # lookups wait for one slice at most
            end = start + _PUBLISH_ROWS
            with self._publish_lock:
                self._generation += 1
                self._records.set(rows[start:end], records[start:end], self._generation)
                # A new id is found by lookups only once its record is in.
                self._added.update((int(unique[i]), int(rows[i])) for i in np.flatnonzero(new[start:end]) + start)
                if self._pool is not None:
                    self._pool.refresh(self.table_id, rows[start:end], encoded[start:end])
        if self._records.full:  # merged off the publish lock: lookups wait for the swap only
            merged = self._records.compacted()
            with self._publish_lock:
                self._records.install(merged)
        return int(new.sum())

    def rows_of(self, unique: np.ndarray) -> np.ndarray:
        """Rows of ids (sorted, unique); -1 for an id the table does not hold."""
        rows = self._ids.rows_of(unique)
        if self._added:
            for index in np.flatnonzero(rows < 0).tolist():
                rows[index] = self._added.get(int(unique[index]), -1)
        return rows

    def _replay(self, logged: np.ndarray) -> None:
        """Point each row the log holds at its last record (the log's order is the updates' order)."""
        if not len(logged):
            return
        unique, last_from_end = np.unique(logged[::-1], return_index=True)
        rows = self.rows_of(unique)
        new = np.flatnonzero(rows < 0)
        rows[new] = len(self._ids) + np.arange(len(new))
        self._added.update(zip(unique[new].tolist(), rows[new].tolist(), strict=True))
        self._records.set(rows, len(logged) - 1 - last_from_end, 0)
        self._records.install(self._records.compacted())

    def close(self) -> None:
        """Free the table's cache share and files once its lookups in progress finish."""
        with self._idle:
            self._closing = True
            self._idle.wait_for(lambda: self._in_flight == 0)
        if self._pool is not None:
            self._pool.forget(self.table_id)
        self._disk.close()
        self._log.close()


def _latest(ids: np.ndarray, encoded: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each id once (sorted), with its last row: an id given twice keeps its last vector."""
    unique, last = np.unique(ids[::-1], return_index=True)
    return unique, encoded[len(ids) - 1 - last]
