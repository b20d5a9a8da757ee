"""The process's embedding tables: each opened once by its resolved path (models naming the same table share it),
one RAM budget for all their cached rows, one pool of I/O threads for their disk reads.

The budget is split between row sizes (a slot pool each: float32 and int8 tables of one dim have different rows)
in proportion to their tables' bytes on disk, and re-split when a table of another size opens or the last of a
size closes; a re-split empties the pools whose capacity changed. One size, the usual case, has the whole budget.
"""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from modelhost.embeddings.compaction import DEFAULT_COMPACT_LOG_BYTES, Compactor
from modelhost.embeddings.heap_trim import HeapTrimmer
from modelhost.embeddings.id_index import IdIndex
from modelhost.embeddings.row_cache import SlotPool
from modelhost.embeddings.table import EmbeddingTable
from modelhost.embeddings.table_updates import TableClosed
from modelhost.errors import ErrorKind, ModelhostError

log = logging.getLogger("modelhost.embeddings")

DEFAULT_CACHE_BYTES = 1 << 30
HOT_IDS = "hot_ids.npy"  # a table's ids, hottest first: its cache is filled from them when it opens
DEFAULT_IO_THREADS = 16


@dataclass(frozen=True, slots=True)
class StoreSettings:
    cache_bytes: int = DEFAULT_CACHE_BYTES  # --embedding-cache-bytes
    io_threads: int = DEFAULT_IO_THREADS  # --embedding-io-threads
    policy: str = "tinylfu"
    direct_io: bool = True
    updates: bool = True  # False where several processes serve the same tables (--workers): each has its own state
    compact_log_bytes: int = DEFAULT_COMPACT_LOG_BYTES  # a log this large is compacted into a new version; 0: never


class EmbeddingStore:
    def __init__(self, settings: StoreSettings) -> None:
        self.settings = settings
        self._executor = ThreadPoolExecutor(settings.io_threads, thread_name_prefix="embedding-io")
        self.trimmer = HeapTrimmer(self._executor)
        self._lock = threading.Lock()
        self._tables: dict[Path, tuple[EmbeddingTable, int]] = {}  # resolved path -> (table, holders)
        self._pools: dict[int, SlotPool] = {}  # row bytes -> pool
        self._next_id = 0
        self.compactor = Compactor(self)

    def open(self, path: Path, name: str) -> TableHandle:
        """The table at `path`, opened if no model holds it yet; raises TableError. Each open is released once."""
        key = path.resolve()
        with self._lock:
            held = self._tables.get(key)
            if held is not None:
                self._tables[key] = (held[0], held[1] + 1)
                return TableHandle(self, key)
            table = EmbeddingTable(name, key, self._next_id, self._executor, self.settings.direct_io)
            self._next_id += 1
            self._tables[key] = (table, 1)
            self._split()
        if _warm(table):  # outside the lock: the store's other tables and its metrics are not held up
            self.trimmer.trim()
        return TableHandle(self, key)

    def current(self, key: Path) -> EmbeddingTable:
        """The served version of the table at `key` (a resolved path); KeyError once it is closed."""
        with self._lock:
            return self._tables[key][0]

    def release(self, handle: TableHandle) -> None:
        """One holder less; the table closes (its cache share freed) with its last."""
        with self._lock:
            held = self._tables.get(handle.key)
            if held is None:
                return
            if held[1] > 1:
                self._tables[handle.key] = (held[0], held[1] - 1)
                return
            del self._tables[handle.key]
        held[0].close()
        with self._lock:
            self._split()

    def swap(self, path: Path) -> EmbeddingTable:
        """Serve the version CURRENT now names (written beside the served one): lookups started before go on
        against the old version, later ones see the new; the old one's cache share is freed."""
        key = path.resolve()
        with self._lock:
            old, holders = self._tables[key]
            table = EmbeddingTable(old.name, key, self._next_id, self._executor, self.settings.direct_io)
            self._next_id += 1
            self._tables[key] = (table, holders)
            self._split()
        old.close()
        return table

    def open_version(self, old: EmbeddingTable, version: Path, ids: IdIndex | None = None) -> EmbeddingTable:
        """`version` of the table `old` serves, opened beside it (caching in its pool, its counts carried over),
        for `install` to serve; `ids`: its ids' index, where the caller has it."""
        with self._lock:
            table_id, self._next_id = self._next_id, self._next_id + 1
        table = EmbeddingTable(old.name, old.path, table_id, self._executor, self.settings.direct_io, old.pool,
                               version, ids)
        table.counts = old.counts
        return table

    def install(self, key: Path, old: EmbeddingTable, new: EmbeddingTable) -> bool:
        """Serve `new` instead of `old` at `key` (a compaction's switch); False if `old` is no longer served."""
        with self._lock:
            held = self._tables.get(key)
            if held is None or held[0] is not old:
                return False
            self._tables[key] = (new, held[1])
            self._split()
            return True

    def tables(self) -> list[EmbeddingTable]:
        with self._lock:
            return [table for table, _ in self._tables.values()]

    def close(self) -> None:
        self.compactor.wait()
        for table in self.tables():
            table.close()
        self._executor.shutdown(wait=False)

    def _split(self) -> None:
        """Give each row size its share of the budget; move tables to pools whose capacity changed."""
        by_size: dict[int, list[EmbeddingTable]] = {}
        for table, _ in self._tables.values():
            by_size.setdefault(table.meta.codec.row_bytes, []).append(table)
        total = sum(table.meta.file_bytes() for tables in by_size.values() for table in tables) or 1
        pools: dict[int, SlotPool] = {}
        for row_bytes, tables in by_size.items():
            share = sum(table.meta.file_bytes() for table in tables) / total
            # No more slots than the tables have rows (and a little room for rows added while serving): a budget
            # far above the tables would only hold empty slots and their bookkeeping.
            rows = sum(table.rows for table in tables)
            capacity = min(int(self.settings.cache_bytes * share) // row_bytes, rows + rows // 8)
            pool = self._pools.get(row_bytes)
            if pool is None or pool.capacity != capacity:
                pool = SlotPool(row_bytes, capacity, self.settings.policy)
            pools[row_bytes] = pool
            for table in tables:
                if table.pool is not pool:
                    table.use_pool(pool)
        self._pools = pools


def _warm(table: EmbeddingTable) -> bool:
    """Fill a newly opened table's cache from its hot-id list (`<table>/hot_ids.npy`, hottest first), if it has
    one, so that its first requests find their rows in RAM. Whether it had one."""
    path = table.path / HOT_IDS
    if not path.is_file():
        return False
    started = time.monotonic()
    try:
        ids = np.load(path, mmap_mode="r", allow_pickle=False)
        if ids.ndim != 1 or not np.issubdtype(ids.dtype, np.integer):
            raise ValueError(f"it must hold integer ids [n], holds {ids.dtype} {list(ids.shape)}")
        cached = table.warm(np.asarray(ids, dtype=np.int64))
    except (OSError, ValueError) as exc:
        log.warning("embedding table '%s': %s not used: %s", table.name, HOT_IDS, exc)
        return True
    log.info("embedding table '%s': %d rows cached from %s in %.1f s", table.name, cached, HOT_IDS,
             time.monotonic() - started)
    return True


class TableHandle:
    """What a model holds: the table at a path, whichever version is served when it looks up."""

    def __init__(self, store: EmbeddingStore, key: Path) -> None:
        self._store = store
        self.key = key

    @property
    def table(self) -> EmbeddingTable:
        return self._store.current(self.key)

    @property
    def dim(self) -> int:
        return self.table.dim

    def lookup(self, ids: np.ndarray) -> np.ndarray:
        while True:
            try:
                found = self.table.lookup(ids)
            except TableClosed:  # swapped for a newer version after we found it: look again
                continue
            self._store.trimmer.lookup_done()
            return found

    def update(self, ids: np.ndarray, vectors: np.ndarray) -> int:
        """The served version's `update` (a RowUpdates: what the data plane's update calls reach)."""
        if not self._store.settings.updates:
            raise ModelhostError(ErrorKind.UNSUPPORTED, "embedding updates need a server of one process (--workers "
                                 "1): each process of several holds its own state of the table")
        while True:
            table = self.table
            try:
                added = table.update(ids, vectors)
            except TableClosed:
                continue
            limit = self._store.settings.compact_log_bytes
            if limit and table.log.size >= limit:
                self._store.compactor.request(self.key)
            return added


_shared: EmbeddingStore | None = None
_shared_lock = threading.Lock()


def configure_store(settings: StoreSettings) -> None:
    """Set the process's store (the composition root, once, before models load)."""
    global _shared
    with _shared_lock:
        if _shared is not None:
            _shared.close()
        _shared = EmbeddingStore(settings)


def shared_store() -> EmbeddingStore:
    """The process's store: the one configured, else one with the default settings."""
    global _shared
    with _shared_lock:
        if _shared is None:
            _shared = EmbeddingStore(StoreSettings())
        return _shared
