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
        self._rows = np.zeros((buckets, WAYS), dtype=np.uint32)
        self._slots = np.full((buckets, WAYS), _FREE, dtype=np.int32)

    @property
    def nbytes(self) -> int:
        return self._rows.nbytes + self._slots.nbytes

    def find(self, table: int, rows: np.ndarray, owners: np.ndarray) -> np.ndarray:
        """The slot of each of `rows` of `table`, -1 for a row not cached. `owners`: each slot's table."""
        buckets = self._bucket(table, rows)
        slots = self._slots[buckets]
        match = (self._rows[buckets] == rows.astype(np.uint32)[:, None]) & (slots >= 0)
        match[match] = owners[slots[match]] == table
        found: np.ndarray = np.where(match.any(axis=1), slots[np.arange(len(rows)), match.argmax(axis=1)], -1)
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
        free = self._slots[buckets] == _FREE
        free_before = np.cumsum(free, axis=1)
        way = (free & (free_before == rank[:, None] + 1)).argmax(axis=1)
        entered: np.ndarray = free_before[:, -1] > rank
        self._rows[buckets[entered], way[entered]] = rows[entered].astype(np.uint32)
        self._slots[buckets[entered], way[entered]] = slots[entered]
        return entered

    def remove(self, table: int, rows: np.ndarray, slots: np.ndarray) -> None:
        """Free the entries of `rows` of `table`, cached at `slots`."""
        if not len(rows):
            return
        buckets = self._bucket(table, rows)
        match = self._slots[buckets] == slots[:, None]
        held = match.any(axis=1)
        self._slots[buckets[held], match[held].argmax(axis=1)] = _FREE

    def _bucket(self, table: int, rows: np.ndarray) -> np.ndarray:
        keys = rows.astype(np.uint64) ^ (np.uint64(table) << np.uint64(40))
        with np.errstate(over="ignore"):
            buckets: np.ndarray = ((keys * _MIX) >> self._shift).astype(np.intp)
        return buckets
