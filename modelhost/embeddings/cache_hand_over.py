"""A compaction's cached rows moved from the version it replaces to the new one (the same ids at their new row
numbers), with their admission counts, so that the new version starts with the old one's warm cache and the
TinyLFU filter still knows which rows are hot.

Split in two so that updates are held back only for the part that needs it:
- `plan`, before the switch (updates and lookups go on): each cached row's new row number (its id looked up in
  the new version), and the filter's counts carried to the new keys;
- `move`, under the switch's update hold: the slots relabelled, a slice at a time under the cache's lock (lookups
  wait for one slice at most), then the few rows cached since the plan. It must run with updates held: a row
  updated between the move and the switch would otherwise be refreshed in the old version's slots only.
"""

from __future__ import annotations

import time

import numpy as np

from modelhost.embeddings.table import EmbeddingTable

SLICE = 16_384  # slots moved under the cache's lock at a time
# A pause after each slice: the lock is not fair, and a thread that takes it again at once keeps it from a
# waiting lookup for every slice in a row (a lookup waited out the whole move of 200,000 slots: +200 ms).
_PAUSE = 0.001


class CacheHandOver:
    def __init__(self, old: EmbeddingTable, new: EmbeddingTable) -> None:
        self._old = old
        self._new = new
        pool = old.pool
        self._pool = pool if pool is not None and new.pool is pool else None
        self._slots = self._rows = self._new_rows = np.empty(0, dtype=np.int64)

    def plan(self) -> None:
        """Map the old version's cached rows to the new one's and carry their counts (updates not held)."""
        if self._pool is None:
            return
        self._slots, self._rows, self._new_rows = self._mapped()
        for part in _slices(len(self._slots)):
            self._pool.carry_counts(self._old.table_id, self._rows[part], self._new.table_id, self._new_rows[part])
            time.sleep(_PAUSE)

    def move(self) -> None:
        """Give the new version the planned slots that still hold their rows, then those cached since the plan;
        under the update hold."""
        if self._pool is None:
            return
        self._move(self._slots, self._rows, self._new_rows)
        late = self._mapped()  # rows cached since the plan: a request's misses or so
        self._pool.carry_counts(self._old.table_id, late[1], self._new.table_id, late[2])
        self._move(*late)

    def _mapped(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The old version's cached slots, their rows and the same ids' rows in the new version."""
        assert self._pool is not None
        slots, rows = self._pool.held(self._old.table_id)
        new_rows = np.empty(len(rows), dtype=np.int64)
        for part in _slices(len(rows)):  # a slice at a time: a lookup of n ids takes ~200 n bytes meanwhile
            new_rows[part] = self._new.rows_of(self._old.ids_of(rows[part]))
        held = new_rows >= 0  # every one (the new version holds every id the old one did); left behind otherwise
        return slots[held], rows[held], new_rows[held]

    def _move(self, slots: np.ndarray, rows: np.ndarray, new_rows: np.ndarray) -> None:
        assert self._pool is not None
        for part in _slices(len(slots)):
            self._pool.move(self._old.table_id, self._new.table_id, slots[part], rows[part], new_rows[part])
            time.sleep(_PAUSE)


def _slices(count: int) -> list[slice]:
    return [slice(start, start + SLICE) for start in range(0, count, SLICE)]
