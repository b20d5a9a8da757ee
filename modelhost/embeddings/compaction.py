"""Compaction of a served table's delta log into a new version, on a thread of its own, once the log has grown
past the store's `compact_log_bytes`.

1. freeze: the log's first `cut` records and the rows they updated (updates wait for this copy only);
2. write: the version with them applied, beside the served one (table_rewrite.py: streamed, paced);
3. open it (its ids index, its empty log) and copy into its log the records appended since `cut`;
4. switch, with updates held back (lookups go on): copy the last records appended, hand the cached rows over to
   the new version (same ids, new row numbers), make it CURRENT, serve it, retire the old one (an update that
   waited retries on the new one). Then close the old one once its lookups in progress finish.

Every acknowledged update is in the served version's files at each step: until CURRENT names the new version,
the old one's log holds them all; from then on the new one's rows.bin holds the first `cut` and its log the rest
(they were copied before CURRENT changed, while no update could be acknowledged). A crash at any step therefore
restarts with all of them; a new version left behind uncurrent is removed by the next version made current.
"""

from __future__ import annotations

import logging
import shutil
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from modelhost.embeddings.table import EmbeddingTable
from modelhost.embeddings.table_files import current_version, make_current
from modelhost.embeddings.table_rewrite import write_compacted

if TYPE_CHECKING:
    from modelhost.embeddings.store import EmbeddingStore

log = logging.getLogger("modelhost.embeddings")

DEFAULT_COMPACT_LOG_BYTES = 1 << 30
_HAND_OVER_SLOTS = 16_384  # cached rows handed over under the cache lock at a time (lookups wait for one slice)

# Called with each step's name as it is reached ("frozen", "written", "opened", "switching", "current",
# "served"): a test's crash point (a process that exits there, as a crash would).
crash_point: Callable[[str], None] | None = None


def _reached(step: str) -> None:
    if crash_point is not None:
        crash_point(step)


class CompactionAbandoned(Exception):
    """The table changed under the compaction (a new version made current by an operator): nothing is switched."""


class Compactor:
    """One compaction at a time per table, each on a thread of its own."""

    def __init__(self, store: EmbeddingStore) -> None:
        self._store = store
        self._lock = threading.Lock()
        self._running: dict[Path, threading.Thread] = {}

    def request(self, key: Path) -> None:
        """Compact the table at `key` unless a compaction of it is under way."""
        with self._lock:
            if key in self._running:
                return
            thread = threading.Thread(target=self._run, args=(key,), name="embedding-compaction", daemon=True)
            self._running[key] = thread
        thread.start()

    def wait(self, timeout: float | None = None) -> None:
        """Until the compactions under way finish."""
        with self._lock:
            threads = list(self._running.values())
        for thread in threads:
            thread.join(timeout)

    def _run(self, key: Path) -> None:
        try:
            compact(self._store, key)
        except CompactionAbandoned as exc:
            log.info("embedding table compaction abandoned: %s", exc)
        except Exception:
            log.exception("embedding table at %s: compaction failed (the log is kept and keeps serving)", key.name)
        finally:
            with self._lock:
                self._running.pop(key, None)


def compact(store: EmbeddingStore, key: Path) -> EmbeddingTable | None:
    """Compact the served table at `key`; the new version's table, or None when the table went away."""
    try:
        old = store.current(key)
    except KeyError:
        return None
    started = time.monotonic()
    frozen = old.freeze()
    _reached("frozen")
    version = write_compacted(old, frozen)
    _reached("written")
    new: EmbeddingTable | None = None
    switched = False
    try:
        new = store.open_version(old, version)
        copied = old.log.count
        new.apply_records(*old.log.records(frozen.cut, copied))
        _reached("opened")
        with old.updates_held():
            new.apply_records(*old.log.records(copied, old.log.count))
            _reached("switching")
            if current_version(key) != old.version:
                raise CompactionAbandoned(f"{key.name}: a new version was made current meanwhile")
            _hand_over(old, new)
            make_current(key, version)
            switched = True
            old.retire()  # from here on an update to the old version would be lost at a restart
            _reached("current")
            if not store.install(key, old, new):
                new.close()  # the table was closed (or the watcher swapped CURRENT in itself); its files are whole
                return None
        _reached("served")
    except BaseException:
        if not switched:
            if new is not None:
                new.close()
            shutil.rmtree(version, ignore_errors=True)
        raise
    old.close()
    counts = new.counts
    counts.compactions += 1
    counts.compaction_seconds += time.monotonic() - started
    log.info("embedding table '%s': delta log of %d records compacted into %s in %.1f s", new.name, frozen.cut,
             version.name, time.monotonic() - started)
    return new


def _hand_over(old: EmbeddingTable, new: EmbeddingTable) -> None:
    """Move the old version's cached rows to the new one (the same ids at their new rows), a slice at a time:
    the new version starts with the old one's cache, so its first lookups do not all go to disk."""
    pool = old.pool
    if pool is None or new.pool is not pool:
        return
    slots, rows = pool.held(old.table_id)
    new_rows = new.rows_of(old.ids_of(rows))
    held = new_rows >= 0  # every one (the new version holds every id the old one did); left behind otherwise
    slots, rows, new_rows = slots[held], rows[held], new_rows[held]
    for start in range(0, len(slots), _HAND_OVER_SLOTS):
        part = slice(start, start + _HAND_OVER_SLOTS)
        pool.move(old.table_id, new.table_id, slots[part], rows[part], new_rows[part])
