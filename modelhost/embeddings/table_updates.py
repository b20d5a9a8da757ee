"""A served table version's updates since it was written: the delta log (durable before an update returns), each
updated row's latest record, and the locks that order updates and make them visible to lookups.

An update appends its rows to the log, then, a slice at a time under the publish lock, points the rows at their
new records (a new id gets the next row) and refreshes their cached copies. A lookup reads a row's record as it
finds it, and caches what it read only if the row did not change meanwhile (`changed_since`, under the same
lock): it sees the old vector or the new, whole, and never undoes an update in the cache.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from modelhost.embeddings.delta_log import DeltaLog
from modelhost.embeddings.row_cache import SlotPool
from modelhost.embeddings.row_map import RowMap
from modelhost.embeddings.row_records import RowRecords
from modelhost.embeddings.rows import RowCodec

_PUBLISH_ROWS = 2048  # updated rows made visible under the publish lock at a time


class TableClosed(Exception):
    """The table was closed (replaced by a newer version, or its last model unloaded)."""


@dataclass(frozen=True, slots=True)
class FrozenLog:
    """What a compaction writes into the new version: the log's first `cut` records, as the rows they updated
    (sorted, with each one's latest record) and the ids they added (sorted, with their rows)."""

    cut: int
    rows: np.ndarray
    records: np.ndarray
    added_ids: np.ndarray
    added_rows: np.ndarray


class CachedCopies:
    """Where a version's rows are cached (its pool, None: nowhere; its id there), for updates to refresh. Shared
    by the table and its updates: a holder, not the table, so that no reference cycle keeps a closed table (its
    ids index: 56 MB for 10,000,000 rows) alive until the garbage collector runs."""

    __slots__ = ("pool", "table_id")

    def __init__(self, table_id: int) -> None:
        self.pool: SlotPool | None = None
        self.table_id = table_id

    def refresh(self, rows: np.ndarray, encoded: np.ndarray) -> None:
        if self.pool is not None:
            self.pool.refresh(self.table_id, rows, encoded)


class TableUpdates:
    """`cached`: the copies an update refreshes (under the publish lock)."""

    def __init__(self, log: Path, codec: RowCodec, rows: RowMap, name: str, cached: CachedCopies) -> None:
        self.log = DeltaLog(log, codec.row_bytes)
        self.records = RowRecords()  # each updated row's latest log record
        self.generation = 0
        # Held while updated rows are published and while a lookup caches what it read: an update between a
        # lookup's read and its caching is seen (outside: then the pool's lock).
        self.publish_lock = threading.Lock()
        self._update_lock = threading.Lock()
        self._codec = codec
        self._rows = rows
        self._name = name
        self._cached = cached
        self._retired = False  # replaced by a compacted version: updates go to that one
        self._replay(self.log.replayed_ids)

    def update(self, ids: np.ndarray, vectors: np.ndarray) -> tuple[int, int]:
        """Log and publish rows: (rows updated, rows new). ValueError for vectors the codec cannot take,
        TableClosed once retired."""
        ids = ids.reshape(-1).astype(np.int64, copy=False)
        encoded = self._codec.encode(vectors)
        if len(encoded) != len(ids):
            raise ValueError(f"{len(ids)} ids but {len(encoded)} vectors")
        unique, encoded = _latest(ids, encoded)
        with self._update_lock:  # updates one at a time, in log order
            if self._retired:
                raise TableClosed(self._name)
            return len(unique), self._apply(unique, encoded)

    def apply_records(self, ids: np.ndarray, encoded: np.ndarray) -> None:
        """Apply log records (ids and encoded rows, in log order) copied from the version this one replaces."""
        if len(ids):
            with self._update_lock:
                self._apply(*_latest(ids, encoded))

    def changed_since(self, rows: np.ndarray, generation: int) -> np.ndarray | None:
        """Of `rows`, those updated after `generation` (None: none can have been); under the publish lock."""
        return self.records.changed_since(rows, generation) if self.generation != generation else None

    def freeze(self) -> FrozenLog:
        """The log as it is now, for a compaction (updates wait for this copy, lookups do not)."""
        with self._update_lock:
            rows, records = self.records.entries()
            return FrozenLog(self.log.count, rows, records, *self._rows.added_by_id())

    @contextmanager
    def held(self) -> Iterator[None]:
        """Hold updates back (a compaction's switch to the new version)."""
        with self._update_lock:
            yield

    def retire(self) -> None:
        """Refuse updates from now on (TableClosed); under `held`."""
        self._retired = True

    def _apply(self, unique: np.ndarray, encoded: np.ndarray) -> int:
        """Log and publish rows (unique ids); under the update lock. Returns how many were new."""
        first = self.log.append(unique, encoded)
        rows = self._rows.rows_of(unique)
        new = rows < 0
        rows[new] = self._rows.rows + np.arange(int(new.sum()))
        records = np.arange(first, first + len(unique))
        for start in range(0, len(rows), _PUBLISH_ROWS):  # lookups wait for one slice at most
            end = start + _PUBLISH_ROWS
            with self.publish_lock:
                self.generation += 1
                self.records.set(rows[start:end], records[start:end], self.generation)
                # A new id is found by lookups only once its record is in.
                added = np.flatnonzero(new[start:end]) + start
                self._rows.add(unique[added], rows[added])
                self._cached.refresh(rows[start:end], encoded[start:end])
        if self.records.full:  # merged off the publish lock: lookups wait for the swap only
            merged = self.records.compacted()
            with self.publish_lock:
                self.records.install(merged)
        return int(new.sum())

    def _replay(self, logged: np.ndarray) -> None:
        """Point each row the log holds at its last record (the log's order is the updates' order)."""
        if not len(logged):
            return
        unique, last_from_end = np.unique(logged[::-1], return_index=True)
        rows = self._rows.rows_of(unique)
        new = np.flatnonzero(rows < 0)
        rows[new] = self._rows.rows + np.arange(len(new))
        self._rows.add(unique[new], rows[new])
        self.records.set(rows, len(logged) - 1 - last_from_end, 0)
        self.records.install(self.records.compacted())


def _latest(ids: np.ndarray, encoded: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each id once (sorted), with its last row: an id given twice keeps its last vector."""
    unique, last = np.unique(ids[::-1], return_index=True)
    return unique, encoded[len(ids) - 1 - last]
