"""The RAM cache in front of the tables' disk rows: a pool of fixed-size slots shared by every table whose rows
have one size, under one byte budget, replaced by CLOCK (LRU's one-bit approximation, which a batch of hits
updates in one vectorized write) with an optional frequency filter on admission (TinyLFU: a missed row replaces a
victim only if it was asked for more often lately, so one-off ids in a skewed stream do not wash out hot rows).

A cached row is found through the pool's index of the rows it holds (slot_index.py: 16 bytes a slot, nothing for
rows not cached), which makes a batch's lookup one gather of hash buckets. Rows are cached in the table's encoding
(rows.py), so an int8 table caches four times the rows of a float32 one in the same bytes.

Thread-safe: one lock per pool, held while slots are read, admitted or refreshed, never while the disk is read.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import numpy as np

from modelhost.embeddings.frequency_sketch import FrequencySketch
from modelhost.embeddings.slot_index import SlotIndex

POLICIES = ("clock", "tinylfu")


@dataclass(slots=True)
class CacheCounts:
    """A table's cache activity since it was opened (for its metrics)."""

    hits: int = 0
    misses: int = 0
    admitted: int = 0
    evictions: int = 0


class SlotPool:
    """`capacity` slots of `row_bytes` each. Tables register to get an id and their slot map."""

    def __init__(self, row_bytes: int, capacity: int, policy: str = "tinylfu") -> None:
        if policy not in POLICIES:
            raise ValueError(f"cache policy must be one of {', '.join(POLICIES)}, got '{policy}'")
        self.row_bytes = row_bytes
        self.capacity = capacity
        self.policy = policy
        self.lock = threading.Lock()
        self._data = np.zeros((capacity, row_bytes), dtype=np.uint8)
        self._owner = np.full(capacity, -1, dtype=np.int32)  # table id, -1 free
        self._row = np.zeros(capacity, dtype=np.uint32)  # a cached table has fewer than 2^32 rows (register)
        self._referenced = np.zeros(capacity, dtype=bool)
        self._hand = 0
        self._used = 0
        # Free slots: those never used (from `_fresh` on) and those freed since (`_spare`), so that finding free
        # slots never scans the pool.
        self._fresh = 0
        self._spare = np.empty(0, dtype=np.int64)
        self._index = SlotIndex(capacity)
        self.counts: dict[int, CacheCounts] = {}
        # 2 counters a slot in each of 4 rows (8 MB for 1M slots): 4 would keep 0.7 % more hits under Zipf 1.0 for
        # twice the memory (benchmarks/embedding_cache_policy.py)
        self._sketch = FrequencySketch(max(capacity, 1) * 2) if policy == "tinylfu" else None

    @property
    def nbytes(self) -> int:
        return self.capacity * self.row_bytes

    def register(self, table: int, rows: int) -> None:
        if rows >= 1 << 32:
            raise ValueError(f"a table of {rows} rows cannot be cached (at most 2^32 - 1)")
        with self.lock:
            self.counts[table] = CacheCounts()

    def forget(self, table: int) -> None:
        """Drop a table and free its slots (a table closed, or replaced by a new version)."""
        with self.lock:
            freed = np.flatnonzero(self._owner == table)
            self._index.remove(table, self._row[freed], freed)
            self._owner[freed] = -1
            self._referenced[freed] = False
            self._used -= len(freed)
            self._spare = np.concatenate((self._spare, freed))
            self.counts.pop(table, None)

    def cached_rows(self, table: int) -> int:
        with self.lock:
            return int((self._owner == table).sum())

    def get(self, table: int, rows: np.ndarray, out: np.ndarray) -> np.ndarray:
        """Copy the cached ones of `rows` (row numbers) into `out` [len(rows), row_bytes]; returns a mask of
        the rows that were not cached."""
        if not self.capacity:
            with self.lock:
                self.counts[table].misses += len(rows)
            return np.ones(len(rows), dtype=bool)
        with self.lock:
            counts = self.counts[table]
            slots = self._index.find(table, rows, self._owner, len(self.counts) > 1)
            hit = slots >= 0
            found = slots[hit]
            out[hit] = self._data[found]
            self._referenced[found] = True
            if self._sketch is not None:
                self._sketch.add(table, rows)
            counts.hits += len(found)
            counts.misses += len(rows) - len(found)
        missed: np.ndarray = ~hit
        return missed

    def admit(self, table: int, rows: np.ndarray, data: np.ndarray, unless_changed: np.ndarray | None = None) -> None:
        """Offer rows read from disk (unique row numbers, their data [n, row_bytes]). Rows cached meanwhile (by a
        concurrent lookup) are skipped, as are those in `unless_changed` (updated since they were read)."""
        if not len(rows) or not self.capacity:
            return
        with self.lock:
            counts = self.counts.get(table)
            if counts is None:  # the table was replaced while its rows were read
                return
            fresh = self._index.find(table, rows, self._owner, len(self.counts) > 1) < 0
            if unless_changed is not None and len(unless_changed):
                fresh &= ~np.isin(rows, unless_changed)
            rows, data = rows[fresh], data[fresh]
            if len(rows) > self.capacity:
                rows, data = rows[: self.capacity], data[: self.capacity]
            slots = self._free_slots(len(rows))
            victims = self._victims(len(rows) - len(slots))
            if self._sketch is not None and len(victims):
                rows, data, victims = self._filter(table, rows, data, slots, victims)
            self._evict(victims)
            slots = np.concatenate((slots, victims))[: len(rows)]
            entered = self._index.insert(table, rows, slots)  # a row whose bucket is full is not cached
            self._spare = np.concatenate((self._spare, slots[~entered]))
            slots, rows, data = slots[entered], rows[entered], data[entered]
            self._data[slots] = data
            self._owner[slots] = table
            self._row[slots] = rows
            self._referenced[slots] = False
            self._used += len(slots)
            counts.admitted += len(slots)

    def refresh(self, table: int, rows: np.ndarray, data: np.ndarray) -> None:
        """Replace the cached copies of updated rows (those not cached stay uncached)."""
        with self.lock:
            if table not in self.counts or not self.capacity:
                return
            slots = self._index.find(table, rows, self._owner, len(self.counts) > 1)
            cached = slots >= 0
            self._data[slots[cached]] = data[cached]

    def held(self, table: int) -> tuple[np.ndarray, np.ndarray]:
        """The slots `table` holds now and their rows."""
        with self.lock:
            slots = np.flatnonzero(self._owner == table)
            return slots, self._row[slots].astype(np.int64)

    def move(self, old: int, new: int, slots: np.ndarray, rows: np.ndarray, new_rows: np.ndarray) -> None:
        """Give table `new` the slots of `old` that still hold `rows` (from `held`), as its `new_rows` (a compacted
        version's row numbers for the same ids); `new` takes `old`'s counts. Slots evicted meanwhile stay as they
        are; a slot whose new key finds its bucket full is freed."""
        with self.lock:
            if new not in self.counts or old not in self.counts:
                return
            still = (self._owner[slots] == old) & (self._row[slots] == rows)
            slots, rows, new_rows = slots[still], rows[still], new_rows[still]
            self._index.remove(old, rows, slots)
            entered = self._index.insert(new, new_rows, slots)
            self._owner[slots[entered]] = new
            self._row[slots[entered]] = new_rows[entered]
            refused = slots[~entered]
            self._owner[refused] = -1
            self._referenced[refused] = False
            self._used -= len(refused)
            self._spare = np.concatenate((self._spare, refused))
            self.counts[new] = self.counts[old]

    def carry_counts(self, table: int, rows: np.ndarray, to_table: int, to_rows: np.ndarray) -> None:
        """Give `to_table`'s `to_rows` the admission filter's counts of `table`'s `rows` (the same ids in a
        compacted version): a compaction must not make the filter forget which rows are hot."""
        if self._sketch is not None:
            with self.lock:
                self._sketch.carry(table, rows, to_table, to_rows)

    def _free_slots(self, wanted: int) -> np.ndarray:
        if self._used >= self.capacity or not wanted:
            return np.empty(0, dtype=np.int64)
        taken, self._spare = self._spare[:wanted], self._spare[wanted:]
        fresh = np.arange(self._fresh, min(self.capacity, self._fresh + wanted - len(taken)))
        self._fresh += len(fresh)
        return np.concatenate((taken, fresh))

    def _victims(self, wanted: int) -> np.ndarray:
        """CLOCK: from the hand on, slots whose referenced bit is clear are taken; set bits are cleared as the hand
        passes them (a second chance). One lap at most; if every slot was referenced, the rest come from a second
        lap, among the slots the first did not take."""
        capacity = self.capacity
        chosen: list[np.ndarray] = []
        needed, swept = wanted, 0
        while needed > 0 and swept < capacity:
            size = min(capacity - swept, max(needed * 4, 1024))
            window = (self._hand + np.arange(size)) % capacity
            take = np.flatnonzero(~self._referenced[window] & (self._owner[window] >= 0))[:needed]  # free: placed
            stop = int(take[-1]) + 1 if len(take) == needed else size
            chosen.append(window[take])
            self._referenced[window[:stop]] = False
            self._hand = (self._hand + stop) % capacity
            swept += stop
            needed -= len(take)
        if needed > 0:
            picked = np.concatenate(chosen)
            window = (self._hand + np.arange(capacity)) % capacity
            rest = window[~np.isin(window, picked) & (self._owner[window] >= 0)][:needed]
            chosen.append(rest)
            self._hand = (int(rest[-1]) + 1) % capacity
        return np.concatenate(chosen) if chosen else np.empty(0, dtype=np.int64)

    def _filter(self, table: int, rows: np.ndarray, data: np.ndarray, slots: np.ndarray,
                victims: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """TinyLFU admission: the rows that would take victims' slots, kept only where asked for more often than
        their victim; the victims they would have taken are spared."""
        assert self._sketch is not None
        placed = len(slots)
        contenders = rows[placed:placed + len(victims)]
        theirs = self._sketch.estimate(table, contenders)
        owners = self._owner[victims]
        victims_frequency = np.zeros(len(victims), dtype=np.int64)
        for owner in np.unique(owners[owners >= 0]).tolist():
            same = owners == owner
            victims_frequency[same] = self._sketch.estimate(owner, self._row[victims[same]])
        admitted = theirs > victims_frequency
        keep = np.concatenate((np.ones(placed, dtype=bool), admitted))
        return rows[keep], data[keep], victims[admitted]

    def _evict(self, victims: np.ndarray) -> None:
        if not len(victims):
            return
        owners = self._owner[victims]
        for owner in np.unique(owners[owners >= 0]).tolist():
            same = victims[owners == owner]
            self._index.remove(owner, self._row[same], same)
            self.counts[owner].evictions += len(same)
        self._owner[victims] = -1
        self._used -= int((owners >= 0).sum())
