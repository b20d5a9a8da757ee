"""Which idle model a multi-model cache evicts first (`--model-cache-policy`): `lru` the least recently used; `lfu`
the least used lately, by the counts below, the least recently used among equals.

How often each key was used lately (`UseCounts`): every count is halved once the uses counted since the last
halving reach WINDOW_PER_ENTRY times the number of entries the cache holds (TinyLFU's reset): a model popular once
and idle since is forgotten within a few windows, and a key's count survives its eviction, so that a popular model
evicted by a burst of others keeps its rank when it comes back. Keys whose count halves to zero are dropped: at
most one key per use of the window is kept. Updated and read on the event loop.

Why a window of 100 entries' worth: simulated over 200 models, 50 cached, Zipf traffic (200,000 requests),
the hit ratio with the window at 10, 40, 100 and 400 entries' worth is 0.72, 0.75, 0.76, 0.76 for s=1.0 (LRU
0.67, the best static choice 0.77) and 0.82, 0.85, 0.85, 0.86 for s=1.2 (LRU 0.79); a longer window gains
little and follows a change of popularity more slowly.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Mapping

from modelhost.core.cache_entry import CacheEntry

POLICIES = ("lfu", "lru")
WINDOW_PER_ENTRY = 100
SMALLEST_WINDOW = 1_000


class UseCounts:
    __slots__ = ("_counts", "_since_halving", "halvings")

    def __init__(self) -> None:
        self._counts: dict[str, int] = {}
        self._since_halving = 0
        self.halvings = 0  # how many times every count was halved

    def used(self, key: str, entries: int) -> None:
        """One use of `key`, by a cache holding `entries` entries."""
        self._counts[key] = self._counts.get(key, 0) + 1
        self._since_halving += 1
        if self._since_halving >= max(SMALLEST_WINDOW, WINDOW_PER_ENTRY * entries):
            self._counts = {k: c >> 1 for k, c in self._counts.items() if c > 1}
            self._since_halving //= 2
            self.halvings += 1

    def count(self, key: str) -> int:
        return self._counts.get(key, 0)

    def __len__(self) -> int:
        return len(self._counts)


class EvictionPolicy:
    """The cache's charged keys ranked by (count, recency): `lru` counts nothing, so recency alone ranks them. The
    ranks sit in a heap, a key's old rank left there until it reaches the top (stale when it differs from the key's
    rank now), so that a use costs a push and choosing a victim costs a pop per entry it passes over, not a pass over
    every entry: a cache of a thousand models chooses as fast as one of fifty."""

    def __init__(self, name: str) -> None:
        if name not in POLICIES:
            raise ValueError(f"model cache policy must be one of {', '.join(POLICIES)}, got '{name}'")
        self._uses = UseCounts() if name == "lfu" else None
        self._ranks: dict[str, tuple[int, int]] = {}  # charged key -> (its count, when it was last charged or used)
        self._heap: list[tuple[int, int, str]] = []
        self._clock = itertools.count()
        self._halvings = 0  # the counts' halvings the heap's ranks were read after

    def charged(self, key: str) -> None:
        """`key` is charged: the most recently used."""
        self._rank(key)

    def uncharged(self, key: str) -> None:
        self._ranks.pop(key, None)

    def used(self, key: str, entries: int) -> None:
        """One use of charged `key` (a request, or a store model's load), by a cache holding `entries` entries."""
        if self._uses is not None:
            self._uses.used(key, entries)
        if key in self._ranks:
            self._rank(key)

    def _rank(self, key: str) -> None:
        rank = (self._uses.count(key) if self._uses is not None else 0, next(self._clock))
        self._ranks[key] = rank
        heapq.heappush(self._heap, (*rank, key))
        if len(self._heap) > 4 * len(self._ranks) + 64:  # mostly stale ranks: at most a few per entry kept
            self._rebuild()

    def _rebuild(self) -> None:
        if self._uses is not None and self._halvings != self._uses.halvings:  # counts halved: every rank changed
            self._halvings = self._uses.halvings
            self._ranks = {key: (self._uses.count(key), when) for key, (_, when) in self._ranks.items()}
        self._heap = [(count, when, key) for key, (count, when) in self._ranks.items()]
        heapq.heapify(self._heap)

    def victim(self, entries: Mapping[str, CacheEntry], key: str,
               in_use: Callable[[CacheEntry], bool]) -> CacheEntry | None:
        """The entry to evict for `key`'s load, of the charged `entries`, those `in_use` excepted: for `lru` the least
        recently used; for `lfu` the one used least lately, the least recently used of those. An entry kept for a
        request that has not run or reached it yet goes only when no other can (the least recently used of them): it
        would be loaded again at once (or its request answered that the model is unknown)."""
        if self._uses is not None and self._halvings != self._uses.halvings:
            self._rebuild()
        passed: list[tuple[int, int, str]] = []
        awaited: list[tuple[int, CacheEntry]] = []
        chosen: CacheEntry | None = None
        heap = self._heap
        while heap:
            item = heapq.heappop(heap)
            count, when, candidate = item
            entry = entries.get(candidate)
            if entry is None or self._ranks.get(candidate) != (count, when):
                continue  # stale: the key was used, or uncharged, since
            passed.append(item)
            if candidate == key or in_use(entry):
                continue
            if entry.first_run or entry.unused:
                awaited.append((when, entry))
                continue
            chosen = entry
            break
        for item in passed:  # still ranked: the caller uncharges the one it evicts
            heapq.heappush(heap, item)
        if chosen is not None or not awaited:
            return chosen
        return min(awaited, key=lambda pair: pair[0])[1]
