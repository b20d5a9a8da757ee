"""Ray Serve's model-multiplexing router, as benchmarks/scaleout_routing.py simulates it (our own code, modelled on
ray/serve/_private/request_router/request_router.py `MultiplexMixin` and pow_2_router.py, Ray 2.60.0 as installed).

The rules, and where Ray has them:
- The router knows which model ids each replica holds only from the replica's reports: the replica pushes its
  loaded *and loading* ids (multiplex.py `_get_loading_and_loaded_model_ids`, pushed every
  PUSH_MULTIPLEXED_MODEL_IDS_INTERVAL_S = 0.1 s when they changed), the controller broadcasts every replica's list
  to the routers over long poll (deployment_state.py `broadcast_running_replicas_if_changed`), and the router
  rebuilds model id -> replicas (`_update_multiplexed_model_ids_with_replicas`). Here: a replica's change reaches
  the routers `report_lag` seconds later, as the replica's whole set at that moment.
- Each routing attempt takes a candidate set (`apply_multiplex_routing`), then power of two choices over it
  (`PowerOfTwoChoicesRequestRouter.choose_replicas`: two distinct random candidates, one if there is one), and
  sends to the one of the two with fewer ongoing requests among those below max_ongoing_requests
  (`_select_from_candidate_replicas`; here the router knows every replica's queue length exactly).
- Candidates, while the request has been routing for less than the matching timeout (re-drawn each attempt,
  uniform in [T, 2T], T = RAY_SERVE_MULTIPLEXED_MODEL_ID_MATCHING_TIMEOUT_S = 1 s):
  * first attempt, some replica reports the model: those replicas (and the model leaves the fallback set);
  * first attempt, none does, and the model is not in the fallback set: the replicas reporting the fewest model
    ids (`_get_replica_ids_with_fewest_multiplexed_models`, a count, not bytes), and the model enters the set;
  * first attempt, none does, the model is in the fallback set (another request already fell back): none;
  * every later attempt (`tried_first_multiplexed_models`): the replicas with the fewest model ids.
  After the timeout: the fewest-ids replicas once more, then all replicas.
- An attempt that finds no replica below its limit is retried: at once the first time, then after 25 ms doubling
  up to 500 ms (`_choose_replicas_with_backoff`, RAY_SERVE_ROUTER_RETRY_*). Requests wait at the router, never in
  a replica's queue. Each request retries on its own schedule (Ray's FIFO hand-over between a routing task and
  the oldest request for the same model is not modelled).
"""

from __future__ import annotations

import random

import numpy as np

from benchmarks.scaleout_sim import REPORT, RETRY, Cluster, Engine, Workload, replicas_for

INITIAL_BACKOFF, MAX_BACKOFF = 0.025, 0.5


class ReportedView:
    """What a router knows of the replicas' models: each replica's set (loaded and loading) as of its last report,
    `report_lag` after a change, and model -> replicas reporting it. Subclasses route (`attempt`)."""

    def __init__(self, cluster: Cluster, work: Workload) -> None:
        self.engine = Engine(cluster, work, replicas_for(cluster, cluster.replicas))
        self.engine.on_change = self.changed
        self.lag = cluster.report_lag
        self.view: list[set[int]] = [set() for _ in range(cluster.replicas)]  # what the routers believe
        self.holders: dict[int, list[int]] = {}  # model -> replicas reporting it
        self.reporting: set[int] = set()

    def run(self) -> Engine:
        self.engine.run(self.attempt, self.on_event)
        return self.engine

    def attempt(self, i: int, now: float) -> None:
        raise NotImplementedError

    def changed(self, r: int, now: float) -> None:
        if r not in self.reporting:
            self.reporting.add(r)
            self.engine.push(now + self.lag, REPORT, r, 0)

    def on_event(self, kind: int, r: int, item: int, now: float) -> None:
        if kind == REPORT:
            self.report(r)
        elif kind == RETRY:
            self.attempt(item, now)

    def report(self, r: int) -> None:
        self.reporting.discard(r)
        new, old = self.engine.replicas[r].holds(), self.view[r]
        for m in old - new:
            held = self.holders[m]
            held.remove(r)
            if not held:
                del self.holders[m]
        for m in new - old:
            self.holders.setdefault(m, []).append(r)
            self.added(m)
        self.view[r] = new
        self.reported(r, new)

    def added(self, m: int) -> None:
        """A replica's report added it to model m's holders."""

    def reported(self, r: int, held: set[int]) -> None:
        """Replica r's report reached the routers."""


class MultiplexRouter(ReportedView):
    """spread=True: the same rules with every "fewest model ids" set replaced by all replicas (what a custom Ray
    RequestRouter could do; with byte budgets the fewest-ids set is often one replica, which then takes every
    model no replica reports)."""

    def __init__(self, cluster: Cluster, work: Workload, seed: int = 0, spread: bool = False) -> None:
        super().__init__(cluster, work)
        self.timeout = cluster.matching_timeout
        count = cluster.replicas
        self.counts = np.zeros(count, dtype=np.int64)
        self.least: tuple[int, ...] | None = None  # the fewest-ids replicas, until a count changes
        self.everyone = tuple(range(count))
        self.fallback: set[int] = set()  # Ray's _multiplexed_model_id_fallback_match
        self.state: dict[int, list[float]] = {}  # retrying request -> [started, tried_first, tried_fewest, backoffs]
        self.random = random.Random(seed).random
        self.spread = spread

    def reported(self, r: int, held: set[int]) -> None:
        if self.counts[r] != len(held):
            self.counts[r] = len(held)
            self.least = None

    def fewest(self) -> tuple[int, ...]:
        if self.spread:
            return self.everyone
        if self.least is None:
            self.least = tuple(np.flatnonzero(self.counts == self.counts.min()).tolist())
        return self.least

    def attempt(self, i: int, now: float) -> None:
        """Route request i: its first attempt on arrival, or a retry."""
        state = self.state.pop(i, None)
        if state is None:
            state = [now, 0.0, 0.0, -1.0]  # backoffs -1: the immediate first retry is still due
        while True:
            r = self.choose(self.candidates(self.engine.work.model[i], state, now))
            if r is not None:
                self.engine.start(r, i, now)
                return
            if state[3] < 0:
                state[3] = 0.0
                continue
            delay = min(INITIAL_BACKOFF * 2 ** min(state[3], 16), MAX_BACKOFF)
            state[3] += 1
            self.state[i] = state
            self.engine.push(now + delay, RETRY, -1, i)
            return

    def candidates(self, m: int, state: list[float], now: float) -> tuple[int, ...] | list[int]:
        if now - state[0] < self.timeout * (1.0 + self.random()):
            held = self.holders.get(m)
            first = not state[1]
            state[1] = 1.0
            if (held is None and m not in self.fallback) or not first:
                self.fallback.add(m)
                return self.fewest()
            if held is not None:
                self.fallback.discard(m)
                return held
            return ()
        if not state[2]:
            state[2] = 1.0
            return self.fewest()
        return self.everyone

    def choose(self, candidates: tuple[int, ...] | list[int]) -> int | None:
        """Power of two choices: the less busy of two random candidates, if it is below its limit."""
        count = len(candidates)
        if count == 0:
            return None
        if count == 1:
            picks: tuple[int, ...] = (candidates[0],)
        else:
            a = int(self.random() * count)
            b = int(self.random() * (count - 1))
            picks = (candidates[a], candidates[b + (b >= a)])
        replicas = self.engine.replicas
        best, lowest = None, replicas[picks[0]].concurrency
        for r in picks:
            if replicas[r].ongoing < lowest:
                best, lowest = r, replicas[r].ongoing
        return best
