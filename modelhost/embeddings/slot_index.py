"""Where a cached row is: (table, row) -> slot, for the rows a slot pool holds and only those.

A hash of buckets of WAYS entries each (a row number and its slot), two entries a slot on average, so its size
follows the cache, not the tables (16 bytes a slot: 16 MB for a million slots, where a dense row -> slot map of
a 10,000,000-row table takes 40 MB). A key lives in the one bucket its hash names, so a batch's lookup is one
gather of its buckets and one compare, and a removal just frees its entry (no probe chains, no tombstones). A
full bucket refuses a key: the row is then not cached (at two entries a slot, a bucket of 16 holds its expected
8 keys with room to spare: a fraction of a percent of admissions are refused when the cache is full).

Not thread-safe: the slot pool's lock guards it.
"""

from __future__ import annotations

import numpy as np

WAYS = 16
_MIX = np.uint64(0x9E3779B97F4A7C15)
_FREE = -1


class SlotIndex:
    def __init__(self, slots: int) -> None:
        buckets = 1 << max(1, (max(slots, 1) * 2 // WAYS - 1).bit_length())
        self._shift = np.uint64(64 - (buckets.bit_length() - 1))
        # A bucket's rows, then its slots: the two cache lines a lookup reads are adjacent.
        self._entries = np.zeros((buckets, 2 * WAYS), dtype=np.uint32)
        self._rows = self._entries[:, :WAYS]
        self._slots = self._entries[:, WAYS:].view(np.int32)
        self._slots[:] = _FREE

    @property
    def nbytes(self) -> int:
        return self._entries.nbytes

    def find(self, table: int, rows: np.ndarray, owners: np.ndarray, shared: bool = True) -> np.ndarray:
        """The slot of each of `rows` of `table`, -1 for a row not cached. `owners`: each slot's table; `shared`:
        whether other tables have entries (else a slot's owner need not be checked: entries are removed with
        their rows, so every entry that holds a slot is a cached row's)."""
        entries = self._entries[self._bucket(table, rows)]  # one gather: each bucket's rows and slots
        matches = np.flatnonzero(entries[:, :WAYS] == rows.astype(np.uint32)[:, None])  # in [len(rows), WAYS]
        which = matches // WAYS
        slots = entries[which, WAYS + matches % WAYS].view(np.int32)
        mine = slots >= 0  # not a freed entry
        if shared:
            mine[mine] = owners[slots[mine]] == table  # not the same row of another table
        found = np.full(len(rows), -1, dtype=np.int64)
        found[which[mine]] = slots[mine]
        return found

    def insert(self, table: int, rows: np.ndarray, slots: np.ndarray) -> np.ndarray:
        """Enter rows (not in the index, unique) at their slots; returns a mask of those entered (False: their
        bucket was full)."""
        if not len(rows):
            return np.zeros(0, dtype=bool)
        buckets = self._bucket(table, rows)
        order = np.argsort(buckets, kind="stable")
        sorted_buckets = buckets[order]
        first = np.concatenate(([True], sorted_buckets[1:] != sorted_buckets[:-1]))
        starts = np.maximum.accumulate(np.where(first, np.arange(len(order)), 0))
        rank = np.empty(len(order), dtype=np.int64)
        rank[order] = np.arange(len(order)) - starts  # the key's place among the batch's keys for its bucket
        free = np.flatnonzero(self._slots[buckets] == _FREE)  # in [len(rows), WAYS], by key then way
        first = np.searchsorted(free, np.arange(len(rows)) * WAYS)  # each key's first free entry
        count = np.diff(np.append(first, len(free)))
        entered: np.ndarray = rank < count
        way = free[first[entered] + rank[entered]] % WAYS
        self._rows[buckets[entered], way] = rows[entered].astype(np.uint32)
        self._slots[buckets[entered], way] = slots[entered]
        return entered

    def remove(self, table: int, rows: np.ndarray, slots: np.ndarray) -> None:
        """Free the entries of `rows` of `table`, cached at `slots`."""
        if not len(rows):
            return
        buckets = self._bucket(table, rows)
        matches = np.flatnonzero(self._slots[buckets] == slots[:, None])
        self._slots[buckets[matches // WAYS], matches % WAYS] = _FREE

    def _bucket(self, table: int, rows: np.ndarray) -> np.ndarray:
        keys = rows.astype(np.uint64) ^ (np.uint64(table) << np.uint64(40))
        with np.errstate(over="ignore"):
            buckets: np.ndarray = ((keys * _MIX) >> self._shift).astype(np.intp)
        return buckets
