"""Which cache policy for embedding rows: the measurement behind modelhost/embeddings/row_cache.py's default.

    python benchmarks/embedding_cache_policy.py [--rows 10000000] [--cache 0.1] [--requests 2000]

A table of --rows rows and a cache of --cache of them, fed ranking requests as the benchmark of the embedding
store sends them: 500 candidates x 39 fields, of which 13 (user and context) are the same for every candidate
and 26 differ per candidate, each id drawn from one popularity distribution over the rows (Zipf s = 1.0, 1.2,
or uniform), the ranks scattered over the table (hashed ids: hot rows are not neighbours). Each request's
distinct rows are looked up in the cache and its misses offered to it, as EmbeddingTable does. The first half of
the requests warm the cache; over the second half: the hit ratio of the requests' distinct rows, the misses per
request (each a disk read), and the policy's own cost per request (lookup and admission, not the disk).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from modelhost.embeddings.row_cache import POLICIES, SlotPool  # noqa: E402

CANDIDATES, SHARED_FIELDS, ITEM_FIELDS = 500, 13, 26


class Popularity:
    """Draws row numbers: rank r (0 = most popular) with weight (r + 1) ** -s, ranks placed at random rows."""

    def __init__(self, rows: int, exponent: float | None, seed: int = 0) -> None:
        self._rng = np.random.default_rng(seed)
        self._place = self._rng.permutation(rows)
        self._cumulative = None if exponent is None else \
            np.cumsum(np.arange(1, rows + 1, dtype=np.float64) ** -exponent)
        self._rows = rows

    @property
    def ranked(self) -> np.ndarray:
        """The rows, most popular first."""
        return self._place

    def draw(self, count: int) -> np.ndarray:
        if self._cumulative is None:
            return self._place[self._rng.integers(0, self._rows, count)]
        ranks = np.searchsorted(self._cumulative, self._rng.random(count) * self._cumulative[-1])
        return self._place[np.minimum(ranks, self._rows - 1)]


def request_rows(popularity: Popularity) -> np.ndarray:
    return np.unique(np.concatenate((popularity.draw(SHARED_FIELDS), popularity.draw(CANDIDATES * ITEM_FIELDS))))


def simulate(rows: int, capacity: int, policy: str, exponent: float | None,
             requests: int) -> tuple[float, float, float]:
    popularity = Popularity(rows, exponent)
    pool = SlotPool(4, capacity, policy)
    pool.register(0, rows)
    hits = looked = 0
    spent = 0.0
    for index in range(requests):
        wanted = request_rows(popularity)
        started = time.perf_counter()
        scratch = np.empty((len(wanted), 4), dtype=np.uint8)
        missed = pool.get(0, wanted, scratch)
        pool.admit(0, wanted[missed], np.zeros((int(missed.sum()), 4), dtype=np.uint8))
        if index >= requests // 2:
            spent += time.perf_counter() - started
            hits += len(wanted) - int(missed.sum())
            looked += len(wanted)
    measured = requests - requests // 2
    return hits / looked, (looked - hits) / measured, spent / measured * 1000


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--cache", type=float, default=0.1)
    parser.add_argument("--requests", type=int, default=2000)
    args = parser.parse_args()
    capacity = int(args.rows * args.cache)
    print(f"{args.rows:,} rows, cache {capacity:,} rows ({args.cache:.0%}), {args.requests} requests of "
          f"{CANDIDATES} x {SHARED_FIELDS + ITEM_FIELDS} ids")
    print(f"{'traffic':10} " + "  ".join(f"{policy:>8}: hit ratio  misses/req  ms/req" for policy in POLICIES))
    for label, exponent in (("zipf 1.0", 1.0), ("zipf 1.2", 1.2), ("uniform", None)):
        cells = []
        for policy in POLICIES:
            ratio, misses, cost = simulate(args.rows, capacity, policy, exponent, args.requests)
            cells.append(f"{ratio:19.3f}  {misses:10.0f}  {cost:6.2f}")
        print(f"{label:10} " + "  ".join(cells), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
