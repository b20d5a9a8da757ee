"""modelhost's own Ray Serve router, as benchmarks/scaleout_routing.py simulates it (policy `modelhost`): the
routing the product ships, modelhost/ray_serve/affinity_router.py `ModelAffinityRouter`, as Ray 2.60.0 runs it.

The rules, and where they are:
- Ranks for a request (`affinity_ranks`): first the replicas the router knows hold its model (from the same
  reports as Ray's default router: loaded and loading ids, reaching the routers `report_lag` seconds after a
  change), then every other replica, one per rank, in the model's rendezvous-hash order. The hash order needs no
  report: every router computes it from the model and the replica ids alone.
- Each rank is one `_select_from_candidate_replicas`: the replica with the fewest ongoing requests among those
  below max_ongoing_requests, the first in the rank's order on a tie (here queue lengths are known exactly).
  A full rank yields to the next one; holders all full spill to the next-ranked replica, which loads the model.
- Every rank full: the router tries the whole pass again at once, then after 25 ms doubling to 500 ms
  (`should_backoff`; `_choose_replicas_with_backoff`, RAY_SERVE_ROUTER_RETRY_*). Requests wait at the router.
- No FIFO hand-over: the router leaves out Ray's `FIFOMixin` (main 36122f7), so a replica a routing task finds
  goes to that task's own request (Ray's exact match by request id); each waiting request retries on its own.
The hash: splitmix64 of (seed, model, replica) instead of blake2b of their names (the same kind of order, an
independent uniform permutation of the replicas per model, at a cost the sweep's 1,000 replicas allow).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from benchmarks.scaleout_ray_router import INITIAL_BACKOFF, MAX_BACKOFF, ReportedView
from benchmarks.scaleout_sim import RETRY, STATS, Cluster, Workload

TOP = 8  # hash ranks kept per model; a request that finds these all full sorts the rest


def weights(seed: int, model: int, replicas: np.ndarray) -> np.ndarray:
    """Rendezvous weights of `replicas` for `model` (splitmix64): higher ranks first."""
    z = (np.uint64(seed) << np.uint64(44)) + (np.uint64(model) << np.uint64(20)) + replicas.astype(np.uint64)
    z = z + np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    mixed: np.ndarray = z ^ (z >> np.uint64(31))
    return mixed


class AffinityRouter(ReportedView):
    def __init__(self, cluster: Cluster, work: Workload, seed: int = 0) -> None:
        super().__init__(cluster, work)  # holders: model -> replicas reporting it, kept in the model's hash order
        self.seed = seed
        self.all = np.arange(cluster.replicas)
        self.top: dict[int, list[int]] = {}  # model -> its first TOP replicas in hash order
        self.backoffs: dict[int, int] = {}  # requests waiting at the router -> backoffs so far

    def added(self, m: int) -> None:
        held = self.holders[m]
        if len(held) > 1:
            held[:] = [held[k] for k in np.argsort(weights(self.seed, m, np.array(held)))[::-1].tolist()]

    def hash_order(self, m: int) -> list[int]:
        """The model's first TOP replicas in its hash order (cached; the rest is sorted only when needed)."""
        top = self.top.get(m)
        if top is None:
            w = weights(self.seed, m, self.all)
            first = np.argpartition(w, len(w) - TOP)[len(w) - TOP:] if len(w) > TOP else self.all
            top = self.top[m] = sorted(first.tolist(), key=lambda r: -int(w[r]))
        return top

    def ranks(self, m: int) -> Iterator[Sequence[int]]:
        """affinity_ranks: the holders the router knows of, then each other replica in the model's hash order."""
        held = self.holders.get(m, ())
        if held:
            yield held
        top = self.hash_order(m)
        for r in top:
            if r not in held:
                yield (r,)
        if len(top) < len(self.all):
            for r in np.argsort(weights(self.seed, m, self.all))[::-1][len(top):].tolist():
                if r not in held:
                    yield (r,)

    def select(self, candidates: Sequence[int]) -> int | None:
        """The least busy candidate below its limit, the first on a tie."""
        best, lowest = None, self.engine.cluster.concurrency
        replicas = self.engine.replicas
        for r in candidates:
            if replicas[r].ongoing < lowest:
                best, lowest = r, replicas[r].ongoing
        return best

    def attempt(self, i: int, now: float) -> None:
        """Route request i (on arrival, or a retry): passes over its ranks until a replica takes it or it backs off."""
        backoffs = self.backoffs.pop(i, -1)  # -1: the immediate second pass is still due
        model = self.engine.work.model[i]
        while True:
            for candidates in self.ranks(model):
                r = self.select(candidates)
                if r is not None:
                    self.engine.start(r, i, now)
                    return
            if backoffs >= 0:
                break
            backoffs = 0
        self.backoffs[i] = backoffs + 1
        self.engine.push(now + min(INITIAL_BACKOFF * 2 ** min(backoffs, 16), MAX_BACKOFF), RETRY, -1, i)


class FreeBytesRouter(AffinityRouter):
    """What modelhost ships (policy `modelhost_free_bytes`; `modelhost` is the hash-only ranking it had before): a
    model no replica reports goes to the one of its first two hash ranks with more free bytes (its budget less its
    models, loaded and loading), as the replicas' routing stats said at the last sample (Ray's
    `record_routing_stats`, every `stats_period` seconds). Every router sees the same samples, so a cold model's
    requests still meet on one replica; the rest of the ranks is as `AffinityRouter`'s."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        replicas, period = self.engine.replicas, self.engine.cluster.stats_period
        self.free = [r.budget for r in replicas]
        for k in range(1, int(self.engine.work.arrival[-1] / period) + 1):
            self.engine.push(k * period, STATS, -1, 0)

    def on_event(self, kind: int, r: int, item: int, now: float) -> None:
        if kind == STATS:
            self.free = [replica.budget - replica.used for replica in self.engine.replicas]
        else:
            super().on_event(kind, r, item, now)

    def ranks(self, m: int) -> Iterator[Sequence[int]]:
        if m not in self.holders:
            first, second = (self.hash_order(m) + [-1])[:2]
            if second >= 0 and self.free[second] > self.free[first]:
                yield (second,)
        yield from super().ranks(m)
