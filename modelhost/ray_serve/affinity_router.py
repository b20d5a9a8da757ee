"""Ray Serve's request router for modelhost's replicas: each model's requests go to a replica that holds it,
and a model no replica holds yet goes to the one replica its name hashes to.

Ray's default router with multiplexing prefers replicas that report holding a request's model id, and sends a
model no one reports to the replicas holding the fewest models. Reports reach the routers through the
controller, a fraction of a second after a load begins, so a model's first requests, arriving before that, were
spread over replicas that each loaded it (seen in tests/ray: a fifth of 50 models loaded twice with two
replicas). Here a model's place does not wait for a report: every router ranks the replicas the same way,
by rendezvous hashing of the model's name with each replica's id, so all of a cold model's requests meet on its
first-ranked replica, and a replica joining or leaving moves only the models that ranked it first.

Ranks, tried in order (Ray probes a rank's replicas and takes the least busy that accepts; a replica
accepts while it has fewer than max_ongoing_requests):
1. the replicas that hold the model (its report reached this router);
2. then every other replica, one rank each, in the model's hash order: a model whose holders are all full
   spills to its next-ranked replica, which loads it, so a hot model comes to be held by several replicas.
   Of the first two in that order, the one whose model cache has more bytes free goes first (each replica's
   free bytes reach the routers every ROUTING_STATS_PERIOD_S): hashing alone places models by count, and where
   the budgets about hold the models one replica came to hold 1.3 budgets' worth and thrashed while another
   held 0.4 (benchmarks/scaleout_routing.py, 4 replicas x 40 models: p99 342 ms; with the two choices, 45 ms).
Requests naming no model take two random replicas, the less busy first (power of two choices).

A request that continues a sequence (request_sequence.py) goes to the replica its sequence's first request went
to, and waits for it rather than spill: the sequence's state is there.
"""

from __future__ import annotations

import hashlib
import random
import time
from collections.abc import Sequence
from functools import lru_cache
from typing import Any, Protocol

from ray.serve.request_router import PendingRequest, ReplicaID, RequestRouter, RunningReplica

from modelhost.ray_serve.request_sequence import SEQUENCE_KWARG

FREE_BYTES = "free_bytes"
ROUTING_STATS_PERIOD_S = 1.0
PLACEMENT_MEMORY_S = 5.0  # longer than a load's report takes to reach the routers
MAX_PLACEMENTS = 10_000
SEQUENCE_MEMORY_S = 600.0  # longer than a sequence stays idle; a later sequence of the same id just follows it
MAX_SEQUENCES = 100_000


class _Replica(Protocol):
    @property
    def replica_id(self) -> Any: ...

    @property
    def multiplexed_model_ids(self) -> set[str]: ...

    @property
    def routing_stats(self) -> dict[str, Any]: ...


class ModelAffinityRouter(RequestRouter):
    """Without Ray's FIFOMixin on purpose: it hands a replica found for one request to the oldest pending request
    of any model when none of the same model waits (seen: 24 concurrent cold requests, several models loaded by
    both replicas); here each routing task places its own request.

    A cold model's place, once chosen, is kept for PLACEMENT_MEMORY_S: the free bytes it was chosen by change
    every second, and a later request for the model that came before the holder's report would otherwise go to
    the other of its two replicas and load it there too."""

    def initialize_state(self, **kwargs: Any) -> None:
        self._placed: dict[str, tuple[str, float]] = {}
        self._sequences: dict[tuple[str, str], tuple[str, float]] = {}  # (model, sequence) -> (replica, last used)

    async def choose_replicas(self, candidate_replicas: list[RunningReplica],
                              pending_request: PendingRequest | None = None) -> list[list[RunningReplica]]:
        if pending_request is not None:
            pending_request.routing_context.should_backoff = True  # every rank full: wait before trying again
        model = pending_request.metadata.multiplexed_model_id if pending_request is not None else ""
        if not model:
            return [random.sample(candidate_replicas, min(2, len(candidate_replicas)))]
        now = time.monotonic()
        sequence = _sequence_of(pending_request)
        if sequence:
            holder = self._sequence_holder((model, sequence), candidate_replicas, now)
            if holder is not None:
                return [[holder]]
        placed, since = self._placed.get(model, ("", 0.0))
        ranks = affinity_ranks(model, candidate_replicas, placed if now - since < PLACEMENT_MEMORY_S else "")
        if not any(model in replica.multiplexed_model_ids for replica in ranks[0]):
            self._remember(model, ranks[0][0].replica_id.unique_id, now, placed)
        return ranks

    def on_request_routed(self, pending_request: PendingRequest, replica_id: ReplicaID,
                          result: Any) -> None:
        sequence = _sequence_of(pending_request)
        if not sequence:
            return
        now = time.monotonic()
        if len(self._sequences) >= MAX_SEQUENCES:
            recent = sorted(self._sequences.items(), key=lambda item: item[1][1])[-MAX_SEQUENCES // 2:]
            self._sequences = {key: held for key, held in recent if now - held[1] < SEQUENCE_MEMORY_S}
        self._sequences[(pending_request.metadata.multiplexed_model_id, sequence)] = (replica_id.unique_id, now)

    def _sequence_holder(self, key: tuple[str, str], replicas: list[RunningReplica],
                         now: float) -> RunningReplica | None:
        """The live replica the sequence's earlier requests went to, None for a new sequence (or one whose
        replica is gone: its state went with it)."""
        held = self._sequences.get(key)
        if held is None or now - held[1] >= SEQUENCE_MEMORY_S:
            return None
        holder = next((replica for replica in replicas if replica.replica_id.unique_id == held[0]), None)
        if holder is not None:
            self._sequences[key] = (held[0], now)
        return holder

    def _remember(self, model: str, replica: str, now: float, placed: str) -> None:
        if replica != placed or model not in self._placed:
            if len(self._placed) >= MAX_PLACEMENTS:
                self._placed = {m: p for m, p in self._placed.items() if now - p[1] < PLACEMENT_MEMORY_S}
            self._placed[model] = (replica, now)


def affinity_ranks(model: str, replicas: Sequence[_Replica], placed: str = "") -> list[list[Any]]:
    """`placed`: the replica this router sent the cold model to a moment ago (first among those not holding it)."""
    ordered = sorted(replicas, key=lambda replica: _weight(model, replica.replica_id.unique_id), reverse=True)
    holders = [replica for replica in ordered if model in replica.multiplexed_model_ids]
    others = [replica for replica in ordered if model not in replica.multiplexed_model_ids]
    if len(others) > 1 and _free_bytes(others[1]) > _free_bytes(others[0]):
        others[0], others[1] = others[1], others[0]
    if placed:
        others.sort(key=lambda replica: replica.replica_id.unique_id != placed)  # stable: the rest keep their order
    return ([holders] if holders else []) + [[replica] for replica in others]


def _sequence_of(pending_request: PendingRequest | None) -> str:
    return str(pending_request.kwargs.get(SEQUENCE_KWARG, "")) if pending_request is not None else ""


def _free_bytes(replica: _Replica) -> int:
    stats = replica.routing_stats or {}
    return int(stats.get(FREE_BYTES, 0))


@lru_cache(maxsize=1 << 16)
def _weight(model: str, replica: str) -> int:
    return int.from_bytes(hashlib.blake2b(f"{model}\0{replica}".encode(), digest_size=8).digest(), "big")
