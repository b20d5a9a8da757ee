"""The discrete-event engine behind benchmarks/scaleout_routing.py: replicas with byte-budgeted LRU model caches,
a request stream, and the routing policies compared there.

Time is simulated seconds. A request holds one of its replica's `concurrency` slots (Ray Serve's
max_ongoing_requests) from the moment it reaches the replica until it is answered: while its model loads (if it
missed) and while it is served (`service` seconds; slots serve in parallel, so a replica answers up to
concurrency / service requests a second). A replica's cache follows modelhost/core/model_cache.py:
- an entry is charged its size from the moment its load starts (the load's expected peak), so loaded and
  loading models together stay within the budget; the sizes are what the budget counts;
- room is made by evicting idle entries (no request in flight for them), least recently released first; a load
  that cannot fit beside the entries in use waits, FIFO, for requests to end (it never evicts without fitting);
- at most `loads` loads run at once per replica (CONCURRENT_LOADS); a load takes load_base + size / bandwidth;
- a request for a model that is loading on its replica waits for that load: loads are deduplicated per replica.
A request is a hit when its replica starts no load for it (its model was loaded, or already loading there).
"""

from __future__ import annotations

import heapq
import random
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

DONE, LOADED, RETRY, REPORT, STATS = 0, 1, 2, 3, 4


@dataclass(frozen=True)
class Cluster:
    replicas: int
    budget: int  # bytes per replica
    concurrency: int = 5  # Ray Serve's max_ongoing_requests default
    loads: int = 4  # modelhost's CONCURRENT_LOADS
    load_base: float = 0.2  # seconds per load, whatever the size
    bandwidth: float = 1e9  # bytes a second a load reads and deserializes
    report_lag: float = 0.2  # s from a replica's change to the routers' view of it (affinity only)
    matching_timeout: float = 1.0  # RAY_SERVE_MULTIPLEXED_MODEL_ID_MATCHING_TIMEOUT_S
    stats_period: float = 1.0  # s between routing-stats samples (request_routing_stats_period_s; Ray's default 10)


@dataclass
class Workload:
    """Request i asks for model[i] at arrival[i] and takes service[i] seconds once its model is loaded."""

    sizes: list[int]  # bytes per model id; id 0 is the most popular
    arrival: list[float]
    model: list[int]
    service: list[float]
    measured_from: int  # requests before this index warm the caches and are not counted


def make_workload(models: int, zipf: float | None, requests: int, rate: float, *, median_mb: float = 100.0,
                  sigma: float = 1.0, cap: int = 2 ** 62, service: float = 0.01, warmup: float = 0.5,
                  seed: int = 0) -> Workload:
    """Sizes lognormal around median_mb, in whole bytes, truncated at `cap` (larger draws are drawn again: a model
    no replica can hold is served by no policy),
    popularity Zipf(zipf) over model ids (uniform when None), Poisson arrivals at `rate`, exponential service."""
    rng = np.random.default_rng(seed)
    sizes = np.round(rng.lognormal(np.log(median_mb * 1e6), sigma, models))
    while (over := sizes > cap).any():
        sizes[over] = np.round(rng.lognormal(np.log(median_mb * 1e6), sigma, int(over.sum())))
    if zipf is None:
        model = rng.integers(0, models, requests)
    else:
        cumulative = np.cumsum(np.arange(1, models + 1, dtype=np.float64) ** -zipf)
        model = np.minimum(np.searchsorted(cumulative, rng.random(requests) * cumulative[-1]), models - 1)
    arrival = np.cumsum(rng.exponential(1.0 / rate, requests))
    service_times = rng.exponential(service, requests)
    return Workload(sizes.astype(np.int64).tolist(), arrival.tolist(), model.tolist(), service_times.tolist(),
                    int(requests * warmup))


@dataclass(eq=False)
class Replica:
    budget: int
    concurrency: int
    loads: int
    lru: OrderedDict[int, int] = field(default_factory=OrderedDict)  # loaded models, least recently released first
    loading: dict[int, list[int]] = field(default_factory=dict)  # model -> requests waiting for its load
    pins: dict[int, int] = field(default_factory=dict)  # model -> requests in flight for it
    waiting_loads: deque[int] = field(default_factory=deque)  # models whose load waits for room or a load slot
    queue: deque[int] = field(default_factory=deque)  # requests waiting for a slot (replica-side queueing)
    used: int = 0  # bytes charged: loaded and loading (whole bytes: sums stay exact)
    peak: int = 0
    ongoing: int = 0
    running_loads: int = 0
    requests: int = 0  # measured requests it served
    busy: float = 0.0  # measured seconds of service and load work
    load_starts: list[float] = field(default_factory=list)

    def holds(self) -> set[int]:
        """What Ray's multiplexer reports: the models loaded and loading."""
        return set(self.lru) | set(self.loading)

    def room_for(self, size: int) -> list[int] | None:
        """The idle entries to evict, least recently released first, so that `size` more fits; None if it cannot."""
        free = self.budget - self.used
        victims: list[int] = []
        for model, held in self.lru.items():
            if free >= size:
                break
            if model not in self.pins:
                victims.append(model)
                free += held
        return victims if free >= size else None


class Engine:
    """One run: `route(i, now)` (the policy) places request i on a replica through `admit` or `start`."""

    def __init__(self, cluster: Cluster, work: Workload, replicas: list[Replica]) -> None:
        self.cluster, self.work, self.replicas = cluster, work, replicas
        self.events: list[tuple[float, int, int, int, int]] = []  # (time, seq, kind, replica, request or model)
        self.seq = 0
        self.latency = [0.0] * len(work.model)
        self.hit = [True] * len(work.model)
        self.placed = [-1] * len(work.model)
        self.on_change: Callable[[int, float], None] | None = None  # a replica's set of models changed
        self.held_at_end: list[set[int]] = []  # each replica's loaded models when the last request arrived

    def push(self, at: float, kind: int, replica: int, item: int) -> None:
        self.seq += 1
        heapq.heappush(self.events, (at, self.seq, kind, replica, item))

    def run(self, route: Callable[[int, float], None], on_event: Callable[[int, int, int, float], None]) -> None:
        arrival, events = self.work.arrival, self.events
        handlers = {DONE: self.done, LOADED: self.loaded}
        count, i = len(arrival), 0
        while i < count or events:
            if i < count and (not events or arrival[i] <= events[0][0]):
                route(i, arrival[i])
                i += 1
                if i == count:
                    self.held_at_end = [set(r.lru) for r in self.replicas]
                continue
            at, _, kind, replica, item = heapq.heappop(events)
            handler = handlers.get(kind)
            if handler is None:
                on_event(kind, replica, item, at)
            else:
                handler(replica, item, at)
        stuck = [r for r in self.replicas if r.ongoing or r.queue or r.waiting_loads]
        if stuck:
            raise RuntimeError(f"{len(stuck)} replicas still hold requests with no event left to serve them")

    def admit(self, r: int, i: int, now: float) -> None:
        """Replica-side queueing: start request i on replica r now, or when one of its slots frees."""
        replica = self.replicas[r]
        if replica.ongoing < replica.concurrency:
            self.start(r, i, now)
        else:
            replica.queue.append(i)

    def start(self, r: int, i: int, now: float) -> None:
        replica, m = self.replicas[r], self.work.model[i]
        replica.ongoing += 1
        self.placed[i] = r
        replica.pins[m] = replica.pins.get(m, 0) + 1
        if i >= self.work.measured_from:
            replica.requests += 1
        if m in replica.lru:
            replica.lru.move_to_end(m)
            self.push(now + self.work.service[i], DONE, r, i)
        elif m in replica.loading:
            replica.loading[m].append(i)
        else:
            self.hit[i] = False
            replica.loading[m] = [i]
            replica.waiting_loads.append(m)
            self.start_loads(r, now)
            if self.on_change is not None:
                self.on_change(r, now)

    def start_loads(self, r: int, now: float) -> None:
        replica, sizes = self.replicas[r], self.work.sizes
        while replica.waiting_loads and replica.running_loads < replica.loads:
            m = replica.waiting_loads[0]
            victims = replica.room_for(sizes[m])
            if victims is None:
                return
            replica.waiting_loads.popleft()
            for victim in victims:
                replica.used -= replica.lru.pop(victim)
            replica.used += sizes[m]
            replica.peak = max(replica.peak, replica.used)
            replica.running_loads += 1
            took = self.cluster.load_base + sizes[m] / self.cluster.bandwidth
            if now >= self.measured_since:
                replica.busy += took
                replica.load_starts.append(now)
            self.push(now + took, LOADED, r, m)
            if victims and self.on_change is not None:
                self.on_change(r, now)

    @property
    def measured_since(self) -> float:
        return self.work.arrival[self.work.measured_from]

    def loaded(self, r: int, m: int, now: float) -> None:
        replica = self.replicas[r]
        replica.running_loads -= 1
        replica.lru[m] = self.work.sizes[m]
        for i in replica.loading.pop(m):
            self.push(now + self.work.service[i], DONE, r, i)
        self.start_loads(r, now)

    def done(self, r: int, i: int, now: float) -> None:
        replica, m = self.replicas[r], self.work.model[i]
        replica.ongoing -= 1
        pins = replica.pins[m] - 1
        if pins:
            replica.pins[m] = pins
        else:
            del replica.pins[m]
        replica.lru.move_to_end(m)  # last_used is set when a request releases its model
        self.latency[i] = now - self.work.arrival[i]
        if i >= self.work.measured_from:
            replica.busy += self.work.service[i]
        if replica.queue:
            self.start(r, replica.queue.popleft(), now)
        if replica.waiting_loads:
            self.start_loads(r, now)


def replicas_for(cluster: Cluster, count: int, scale: int = 1) -> list[Replica]:
    return [Replica(cluster.budget * scale, cluster.concurrency * scale, cluster.loads * scale) for _ in range(count)]


def simple_policy(name: str, cluster: Cluster, work: Workload, seed: int = 0) -> Engine:
    """random, round_robin (per-replica caches, replica-side queues) or one_cache (one replica with the whole
    cluster's bytes, slots and load slots: the bound affinity is compared with)."""
    if name == "one_cache":
        engine = Engine(cluster, work, replicas_for(cluster, 1, cluster.replicas))
        engine.run(lambda i, now: engine.admit(0, i, now), _no_events)
        return engine
    engine = Engine(cluster, work, replicas_for(cluster, cluster.replicas))
    count = cluster.replicas
    if name == "random":
        pick = random.Random(seed).randrange
        engine.run(lambda i, now: engine.admit(pick(count), i, now), _no_events)
    elif name == "round_robin":
        engine.run(lambda i, now: engine.admit(i % count, i, now), _no_events)
    else:
        raise ValueError(f"unknown policy {name!r}")
    return engine


def _no_events(kind: int, replica: int, item: int, at: float) -> None:
    raise AssertionError(f"unexpected event {kind}")
