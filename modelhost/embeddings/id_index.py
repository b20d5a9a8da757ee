"""A version's sorted ids in RAM, compressed (Elias-Fano): id -> row for a batch of ids in one vectorized pass.

Each id is split, after subtracting the smallest, into its low L bits and its high bits, with L chosen from the
ids' spread (log2(range / rows)). The low bits are kept per row (4 bytes a row when L <= 32, as for this
project's 10,000,000-row benchmark table; 5 when L <= 40, as for 64-bit hashes of 10^7 ids), the high bits as a
bit vector holding, for each bucket of high bits in order, a 1 per row in it and then a 0 (rows + buckets bits,
about 2 bits a row). The row where bucket h starts is the position of its (h-1)-th 0 less h-1; those positions
are found with a count of 0s before each 64-bit word (a binary search over those counts, then the bit within the
word through byte tables). The rows of a bucket (about one on average) are then searched for the low bits, a
vectorized binary search whose steps are as many as the largest bucket's size needs.

8 bytes a row as a plain sorted int64 array; ~4.4-5.4 here.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

_POPCOUNT = np.array([bin(byte).count("1") for byte in range(256)], dtype=np.uint8)
# _SELECT[byte, r]: the position of the byte's r-th set bit
_SELECT = np.array([[[i for i in range(8) if byte >> i & 1][r] if r < _POPCOUNT[byte] else 0 for r in range(8)]
                    for byte in range(256)], dtype=np.uint8)
_LOW_TYPES = ((8, np.uint8), (16, np.uint16), (32, np.uint32))


class IdIndex:
    def __init__(self, rows: int, first: int, last: int) -> None:
        """An index of `rows` ids from `first` to `last` (sorted); filled by `add` in order, then `seal`."""
        if last < first:
            raise ValueError("the ids are not sorted and unique")
        self.rows = rows
        self.first = first
        spread = last - first if rows else 0
        self.low_bits = max(0, (spread // max(rows, 1)).bit_length() - 1) if spread else 0
        self._buckets = (spread >> self.low_bits) + 1
        self.last = min(first + ((self._buckets - 1) << self.low_bits) + (1 << self.low_bits) - 1, 2**63 - 1)
        size = rows + self._buckets
        self._bits = np.zeros(-(-size // 64), dtype=np.uint64)
        self._zeros_before = np.zeros(1, dtype=np.int64)
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
        return self._bits.nbytes + self._zeros_before.nbytes + self._low.nbytes + extra

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
        low = offsets & np.uint64((1 << self.low_bits) - 1)
        self._low[where] = low.astype(self._low.dtype)  # the low 32 bits (or fewer): astype keeps them
        if self._high_low is not None:
            self._high_low[where] = (low >> np.uint64(32)).astype(self._high_low.dtype)
        high = offsets >> np.uint64(self.low_bits)
        places = high.astype(np.int64) + np.arange(self._filled, self._filled + len(ids))
        words = places >> 6
        starts = np.flatnonzero(np.concatenate(([True], words[1:] != words[:-1])))
        ones = np.left_shift(np.uint64(1), (places & 63).astype(np.uint64))
        self._bits[words[starts]] |= np.bitwise_or.reduceat(ones, starts)
        self._filled += len(ids)
        self._previous = int(ids[-1])

    def seal(self) -> None:
        if self._filled != self.rows:
            raise ValueError(f"{self._filled} ids given, {self.rows} expected")
        ones = _POPCOUNT[self._bits.view(np.uint8)].reshape(-1, 8).sum(axis=1, dtype=np.int64)
        self._zeros_before = np.concatenate(([0], np.cumsum(64 - ones)))

    def rows_of(self, ids: np.ndarray) -> np.ndarray:
        """The row of each id (int64), -1 for an id not held."""
        found = np.full(len(ids), -1, dtype=np.int64)
        if not self.rows:
            return found
        inside = np.flatnonzero((ids >= self.first) & (ids <= self.last))
        if not len(inside):
            return found
        offsets = self._offsets(ids[inside])
        buckets = (offsets >> np.uint64(self.low_bits)).astype(np.int64)
        lows = offsets & np.uint64((1 << self.low_bits) - 1)
        previous = np.maximum(buckets - 1, 0)
        both = self._select_zero(np.concatenate((buckets, previous))) - np.concatenate((buckets, previous))
        ends = both[: len(buckets)]  # rows in the buckets up to this one
        starts = np.where(buckets > 0, both[len(buckets):], 0)
        places = self._lower_bound(starts, ends, lows)
        hit = places < ends
        hit[hit] = self._low_of(places[hit]) == lows[hit]
        found[inside[hit]] = places[hit]
        return found

    def ids_of(self, rows: np.ndarray) -> np.ndarray:
        """The id of each row (0 <= row < rows)."""
        rows = rows.astype(np.int64)
        ones_before = np.arange(len(self._zeros_before), dtype=np.int64) * 64 - self._zeros_before
        high = _select(self._bits, ones_before, rows, invert=False) - rows
        offsets = (high.astype(np.uint64) << np.uint64(self.low_bits)) | self._low_of(rows)
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

    def _select_zero(self, ranks: np.ndarray) -> np.ndarray:
        return _select(self._bits, self._zeros_before, ranks, invert=True)

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


def _select(bits: np.ndarray, before: np.ndarray, ranks: np.ndarray, invert: bool) -> np.ndarray:
    """The position of each rank-th (0-based) 1 of `bits` (0 with `invert`); `before`: the count before each
    word."""
    words = np.searchsorted(before, ranks, side="right") - 1
    remaining = ranks - before[words]
    chosen = bits[words]
    if invert:
        chosen = ~chosen
    as_bytes = chosen.astype("<u8").view(np.uint8).reshape(-1, 8)
    counted = np.cumsum(_POPCOUNT[as_bytes], axis=1, dtype=np.int64)
    byte = (counted <= remaining[:, None]).sum(axis=1)
    before_byte = np.where(byte > 0, counted[np.arange(len(byte)), np.maximum(byte - 1, 0)], 0)
    bit = _SELECT[as_bytes[np.arange(len(byte)), byte], remaining - before_byte]
    positions: np.ndarray = words * 64 + byte * 8 + bit
    return positions


def _low_type(bits: int) -> type[np.unsignedinteger]:
    for width, kind in _LOW_TYPES:
        if bits <= width:
            return kind
    raise AssertionError(bits)
