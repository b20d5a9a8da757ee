"""Compaction of a served table's delta log into a new version, on a thread of its own, once the log has grown
past the store's `compact_log_bytes`.

1. freeze: the log's first `cut` records and the rows they updated (updates wait for this copy only);
2. write: the version with them applied, beside the served one (table_rewrite.py: streamed, paced);
3. open it (its ids index, its empty log), copy into its log the records appended since `cut`, and plan the
   cache's hand-over (each cached row's new row number; the admission filter's counts carried to them);
4. switch, with updates held back (lookups go on): copy the last records appended, make it CURRENT, retire the
   old one (an update that waited retries on the new one), hand the cached rows over (cache_hand_over.py), serve
   it. Then close the old one once its lookups in progress finish, and remove the version before it from disk.

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

from modelhost.embeddings.cache_hand_over import CacheHandOver
from modelhost.embeddings.table import EmbeddingTable
from modelhost.embeddings.table_files import TableError, current_version, point_current, remove_versions
from modelhost.embeddings.table_rewrite import write_compacted

if TYPE_CHECKING:
    from modelhost.embeddings.store import EmbeddingStore

log = logging.getLogger("modelhost.embeddings")

DEFAULT_COMPACT_LOG_BYTES = 1 << 30

# Called with each step's name as it is reached ("frozen", "written", "opened", "switching", "current",
# "served", "pruned"): a test's crash point (a process that exits there, as a crash would).
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

    def running(self, key: Path) -> bool:
        """Whether a compaction of the table at `key` is under way (its CURRENT may name the version it is
        switching to before that version serves: the watcher must not swap it in beside the compaction)."""
        with self._lock:
            return key in self._running

    def wait(self, timeout: float | None = None) -> None:
        """Until the compactions under way finish."""
        with self._lock:
            threads = list(self._running.values())
        for thread in threads:
            thread.join(timeout)

    def _run(self, key: Path) -> None:
        try:
            compact(self._store, key)
            self._store.trimmer.trim()  # the old version's structures and the rewrite's buffers, back to the OS
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
    version, ids = write_compacted(old, frozen)
    _reached("written")
    new: EmbeddingTable | None = None
    switched = False
    try:
        new = store.open_version(old, version, ids)
        copied = old.log.count
        new.apply_records(*old.log.records(frozen.cut, copied))
        hand_over = CacheHandOver(old, new)
        hand_over.plan()
        _reached("opened")
        with old.updates_held():  # only what must not race an update: the tail, CURRENT, the cached rows
            new.apply_records(*old.log.records(copied, old.log.count))
            _reached("switching")
            if current_version(key) != old.version:
                raise CompactionAbandoned(f"{key.name}: a new version was made current meanwhile")
            point_current(key, version)
            switched = True
            old.retire()  # from here on an update to the old version would be lost at a restart
            _reached("current")
            hand_over.move()
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
    # Off the hold: removing a version frees gigabytes, which the disk may take a while over.
    remove_versions(key, keep=(version.name, old.version.name, _current_name(key)))
    _reached("pruned")
    counts = new.counts
    counts.compactions += 1
    counts.compaction_seconds += time.monotonic() - started
    log.info("embedding table '%s': delta log of %d records compacted into %s in %.1f s", new.name, frozen.cut,
             version.name, time.monotonic() - started)
    return new


def _current_name(key: Path) -> str | None:
    try:
        return current_version(key).name
    except TableError:
        return None
