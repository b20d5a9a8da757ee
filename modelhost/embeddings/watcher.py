"""What changes a served table from outside the server, checked every few seconds on a thread of its own:

- a new version made current (`modelhost embeddings build` into the served table's directory): swapped in,
  lookups in progress finishing on the old one;
- delta files dropped into the table's `deltas/` directory: `*.npz` files holding `ids` (int64 [n]) and `vectors`
  (float32 [n, dim]), applied in name order as updates (durable, atomic per row), then removed. A writer makes
  the file under another name and renames it to `.npz` when it is whole; a file that cannot be applied is
  renamed `*.rejected` and the reason logged.
"""

from __future__ import annotations

import logging
import threading
import zipfile
from pathlib import Path

import numpy as np

from modelhost.embeddings.store import EmbeddingStore
from modelhost.embeddings.table import EmbeddingTable
from modelhost.embeddings.table_files import CURRENT, TableError
from modelhost.embeddings.table_updates import TableClosed

log = logging.getLogger("modelhost.embeddings")

DELTAS = "deltas"
DELTA_SUFFIX = ".npz"
REJECTED_SUFFIX = ".rejected"


class TableWatcher:
    def __init__(self, store: EmbeddingStore, poll_seconds: float) -> None:
        self._store = store
        self._poll = poll_seconds
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="embedding-watcher", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    def check_now(self) -> None:
        """One pass over the open tables (what the thread does every poll)."""
        for table in self._store.tables():
            try:
                table = self._swap_if_new(table)
                self._apply_deltas(table)
            except TableClosed:
                continue  # closed while we looked: the next pass sees what replaced it
            except Exception:
                log.exception("embedding table '%s': checking for new versions and deltas failed", table.name)

    def _run(self) -> None:
        while not self._stop.wait(self._poll):
            self.check_now()

    def _swap_if_new(self, table: EmbeddingTable) -> EmbeddingTable:
        try:
            current = (table.path / CURRENT).read_text().strip()
        except OSError:
            return table
        if current == table.version.name or self._store.compactor.running(table.path):
            return table  # a compaction makes its version current and serves it itself
        try:
            swapped = self._store.swap(table.path)
        except TableError as exc:
            log.error("embedding table '%s': version %s cannot be served, %s stays: %s", table.name, current,
                      table.version.name, exc)
            return table
        log.info("embedding table '%s': now serving %s (was %s)", table.name, current, table.version.name)
        return swapped

    def _apply_deltas(self, table: EmbeddingTable) -> None:
        directory = table.path / DELTAS
        if not directory.is_dir() or not self._store.settings.updates:
            return  # several processes (--workers): none applies them (docs/embeddings.md)
        for path in sorted(directory.glob(f"*{DELTA_SUFFIX}")):
            problem = _apply(table, path)
            if problem is None:
                path.unlink()
                continue
            log.error("embedding table '%s': delta file %s rejected: %s", table.name, path.name, problem)
            path.rename(path.with_name(path.name + REJECTED_SUFFIX))


def _apply(table: EmbeddingTable, path: Path) -> str | None:
    """Apply one delta file; the reason it cannot be applied, or None."""
    try:
        with np.load(path, allow_pickle=False) as arrays:
            if "ids" not in arrays.files or "vectors" not in arrays.files:
                return f"it must hold arrays 'ids' and 'vectors', holds {', '.join(arrays.files) or 'none'}"
            ids, vectors = arrays["ids"], arrays["vectors"]
    except (OSError, ValueError, zipfile.BadZipFile) as exc:
        return f"not a readable .npz file ({exc})"
    if ids.ndim != 1 or not np.issubdtype(ids.dtype, np.integer):
        return f"'ids' must be integers [n], is {ids.dtype} {list(ids.shape)}"
    if vectors.shape != (len(ids), table.dim):
        return f"'vectors' must be [{len(ids)}, {table.dim}], is {list(vectors.shape)}"
    try:
        added = table.update(ids.astype(np.int64), vectors.astype(np.float32))
    except ValueError as exc:
        return str(exc)
    log.info("embedding table '%s': %s applied, %d rows (%d new)", table.name, path.name, len(ids), added)
    return None
