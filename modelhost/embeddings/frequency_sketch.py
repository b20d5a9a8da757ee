"""How often each cached table's rows were asked for lately: the slot pool's TinyLFU admission filter (row_cache.py).

A count-min sketch keyed by (table, row): a key's estimate is never below its true count in the window, and a
collision only raises it. Not thread-safe: the slot pool's lock guards it.
"""

from __future__ import annotations

import numpy as np

_DEPTH = 4
_SEEDS = np.array([0x9E3779B97F4A7C15, 0xC2B2AE3D27D4EB4F, 0x165667B19E3779F9, 0xD6E8FEB86659FD93], dtype=np.uint64)


class FrequencySketch:
    """A count-min sketch of how often rows were asked for lately, halved every `window` requests (TinyLFU's
    reset), in 8-bit counters."""

    def __init__(self, width: int) -> None:
        self._width = 1 << max(10, (width - 1).bit_length())
        self._counters = np.zeros((_DEPTH, self._width), dtype=np.uint8)
        self._window = self._width * 8
        self._added = 0

    def add(self, table: int, rows: np.ndarray) -> None:
        """Count one request of each of `rows` (unique: two that share a counter count once)."""
        for depth, index in enumerate(self._indices(table, rows)):
            counters = self._counters[depth]
            counters[index] = np.minimum(counters[index], 254) + 1
        self._added += len(rows)
        if self._added >= self._window:
            self._counters >>= 1
            self._added //= 2

    def carry(self, table: int, rows: np.ndarray, to_table: int, to_rows: np.ndarray) -> None:
        """Move the counts of keys (table, rows) to (to_table, to_rows): the same items under new keys (a compacted
        version's rows), so that the admission filter does not forget which rows are hot. The old keys' counters
        lose what they gave (left there, each item would count twice and crowd the counters: every newcomer's
        estimate would rise)."""
        counts = self.estimate(table, rows).astype(np.uint8)
        for depth, index in enumerate(self._indices(table, rows)):
            counters = self._counters[depth]
            counters[index] -= np.minimum(counters[index], counts)
        order = np.argsort(counts, kind="stable")  # of keys sharing a counter, the largest count is written last
        counts = counts[order]
        for depth, index in enumerate(self._indices(to_table, to_rows[order])):
            counters = self._counters[depth]
            counters[index] = np.maximum(counters[index], counts)

    def estimate(self, table: int, rows: np.ndarray) -> np.ndarray:
        estimates = [self._counters[depth][index] for depth, index in enumerate(self._indices(table, rows))]
        smallest: np.ndarray = np.minimum.reduce(estimates).astype(np.int64)
        return smallest

    def _indices(self, table: int, rows: np.ndarray) -> list[np.ndarray]:
        keys = rows.astype(np.uint64) ^ (np.uint64(table) << np.uint64(48))
        shift = np.uint64(64 - (self._width.bit_length() - 1))
        with np.errstate(over="ignore"):
            return [((keys + seed) * np.uint64(0x9E3779B97F4A7C15) >> shift).astype(np.int64)
                    for seed in _SEEDS]
