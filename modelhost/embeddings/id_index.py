"""A version's sorted ids in RAM, compressed: id -> row for a batch of ids in one vectorized pass.

Each id, less the smallest, is split into its high bits (its bucket) and its low L bits. The low bits are kept
per row (as a uint32 and, beyond 32 bits, a uint8/16/32 more), and each bucket's first row in an array of
(buckets + 1) row numbers. L is chosen per table, the fewest bytes with at most MEAN_ROWS rows a bucket on
average: the benchmark's 10,000,000 ids spread over 2^54.6 take 34 low bits (5 bytes a row) and 1.55 M buckets
(0.6 bytes a row), 56 MB instead of a plain int64 array's 80; 64-bit hashes 6.5 bytes a row; ids packed into a
small range 1-2 bytes; the worst case (a far outlier among dense ids) ~8.4.

A lookup reads its bucket's bounds (two adjacent numbers) and compares its low bits with the bucket's first
WINDOW rows at once, two random memory accesses an id where a binary search over the sorted ids makes ~23; an id
whose bucket holds more rows (rare: buckets hold ~8 on average) is found by a binary search within its bucket.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

MEAN_ROWS = 10  # rows a bucket holds on average, at most
WINDOW = 16  # a bucket's rows compared at once
_LOW_TYPES = ((8, np.uint8), (16, np.uint16), (32, np.uint32))


class IdIndex:
    def __init__(self, rows: int, first: int, last: int) -> None:
        """An index of `rows` ids from `first` to `last` (sorted); filled by `add` in order, then `seal`."""
        if last < first:
            raise ValueError("the ids are not sorted and unique")
        self.rows = rows
        self.first = first
        spread = last - first
        self.low_bits = _low_bits(rows, spread)
        self._mask = np.uint64((1 << self.low_bits) - 1)
        self._buckets = (spread >> self.low_bits) + 1
        self.last = min(first + (self._buckets << self.low_bits) - 1, 2**63 - 1)
        self._counts = np.zeros(self._buckets + 1, dtype=np.int64)  # until `seal`: rows per bucket
        self._starts = self._counts
        low32, extra = min(self.low_bits, 32), self.low_bits - min(self.low_bits, 32)
        self._low = np.zeros(rows, dtype=_low_type(low32))
        self._high_low = np.zeros(rows, dtype=_low_type(extra)) if extra else None
        self._filled = 0
        self._previous: int | None = None

    @classmethod
    def of(cls, ids: np.ndarray) -> IdIndex:
        """The index of `ids` (int64, sorted, unique)."""
        return cls.from_chunks(len(ids), int(ids[0]) if len(ids) else 0, int(ids[-1]) if len(ids) else 0, [ids])

    @classmethod
    def from_chunks(cls, rows: int, first: int, last: int, chunks: Iterable[np.ndarray]) -> IdIndex:
        index = cls(rows, first, last)
        for chunk in chunks:
            index.add(chunk)
        index.seal()
        return index

    @property
    def nbytes(self) -> int:
        extra = self._high_low.nbytes if self._high_low is not None else 0
        return self._starts.nbytes + self._low.nbytes + extra

    def __len__(self) -> int:
        return self.rows

    def add(self, ids: np.ndarray) -> None:
        """The next ids in order (int64); ValueError unless the whole sequence is sorted, unique and within
        first..last."""
        if not len(ids):
            return
        if len(ids) > 1 and not bool(np.all(ids[1:] > ids[:-1])) or (
                self._previous is not None and int(ids[0]) <= self._previous):
            raise ValueError("the ids are not sorted and unique")
        if int(ids[0]) < self.first or int(ids[-1]) > self.last or self._filled + len(ids) > self.rows:
            raise ValueError("the ids are outside the range given")
        offsets = self._offsets(ids)
        where = slice(self._filled, self._filled + len(ids))
        low = offsets & self._mask
        self._low[where] = low.astype(self._low.dtype)  # the low 32 bits (or fewer): astype keeps them
        if self._high_low is not None:
            self._high_low[where] = (low >> np.uint64(32)).astype(self._high_low.dtype)
        buckets, counts = np.unique((offsets >> np.uint64(self.low_bits)).astype(np.int64), return_counts=True)
        self._counts[buckets + 1] += counts
        self._filled += len(ids)
        self._previous = int(ids[-1])

    def seal(self) -> None:
        if self._filled != self.rows:
            raise ValueError(f"{self._filled} ids given, {self.rows} expected")
        starts = np.cumsum(self._counts)
        self._starts = starts.astype(np.uint32) if self.rows < 1 << 32 else starts
        del self._counts

    def rows_of(self, ids: np.ndarray) -> np.ndarray:
        """The row of each id (int64), -1 for an id not held."""
        found = np.full(len(ids), -1, dtype=np.int64)
        if not self.rows:
            return found
        inside = np.flatnonzero((ids >= self.first) & (ids <= self.last))
        offsets = self._offsets(ids[inside])
        buckets = (offsets >> np.uint64(self.low_bits)).astype(np.intp)
        lows = offsets & self._mask
        starts = self._starts[buckets].astype(np.int64)
        sizes = self._starts[buckets + 1].astype(np.int64) - starts
        places = np.minimum(starts[:, None] + np.arange(WINDOW), self.rows - 1)
        same = (self._low[places] == lows.astype(self._low.dtype)[:, None]) & (np.arange(WINDOW) < sizes[:, None])
        matches = np.flatnonzero(same)
        which, rows = matches // WINDOW, starts[matches // WINDOW] + matches % WINDOW
        if self._high_low is not None:  # the low 32 bits matched; the rest must too
            whole = self._high_low[rows] == (lows[which] >> np.uint64(32)).astype(self._high_low.dtype)
            which, rows = which[whole], rows[whole]
        found[inside[which]] = rows
        large = np.flatnonzero(sizes > WINDOW)
        if len(large):  # buckets beyond the window: a binary search within each
            ends = starts[large] + sizes[large]
            places_large = self._lower_bound(starts[large] + WINDOW, ends, lows[large])
            hit = places_large < ends
            hit[hit] = self._low_of(places_large[hit]) == lows[large][hit]
            found[inside[large[hit]]] = places_large[hit]
        return found

    def ids_of(self, rows: np.ndarray) -> np.ndarray:
        """The id of each row (0 <= row < rows)."""
        rows = rows.astype(np.int64)
        buckets = np.searchsorted(self._starts, rows, side="right") - 1
        offsets = (buckets.astype(np.uint64) << np.uint64(self.low_bits)) | self._low_of(rows)
        with np.errstate(over="ignore"):
            ids: np.ndarray = (offsets + np.uint64(self.first & (2**64 - 1))).view(np.int64)
        return ids

    def _offsets(self, ids: np.ndarray) -> np.ndarray:
        with np.errstate(over="ignore"):
            offsets: np.ndarray = ids.astype(np.int64).view(np.uint64) - np.uint64(self.first & (2**64 - 1))
        return offsets

    def _low_of(self, rows: np.ndarray) -> np.ndarray:
        low: np.ndarray = self._low[rows].astype(np.uint64)
        if self._high_low is not None:
            low |= self._high_low[rows].astype(np.uint64) << np.uint64(32)
        return low

    def _lower_bound(self, starts: np.ndarray, ends: np.ndarray, lows: np.ndarray) -> np.ndarray:
        """For each query, the first row in [start, end) whose low bits are not below its low bits."""
        low, high = starts.copy(), ends.copy()
        active = np.flatnonzero(low < high)
        while len(active):
            middle = (low[active] + high[active]) >> 1
            right = self._low_of(middle) < lows[active]
            low[active[right]] = middle[right] + 1
            high[active[~right]] = middle[~right]
            active = active[low[active] < high[active]]
        found: np.ndarray = low
        return found


def _low_bits(rows: int, spread: int) -> int:
    """The low bits that make the index smallest with at most MEAN_ROWS rows a bucket on average."""
    best, best_bytes = 0, None
    for bits in range(64):
        buckets = (spread >> bits) + 1
        if rows > MEAN_ROWS * buckets:
            break
        size = rows * _low_bytes(bits) + 4 * (buckets + 1)
        if best_bytes is None or size < best_bytes:
            best, best_bytes = bits, size
    return best


def _low_bytes(bits: int) -> int:
    return 1 if bits <= 8 else 2 if bits <= 16 else 4 if bits <= 32 else 5 if bits <= 40 else 6 if bits <= 48 else 8


def _low_type(bits: int) -> type[np.unsignedinteger]:
    for width, kind in _LOW_TYPES:
        if bits <= width:
            return kind
    raise AssertionError(bits)
