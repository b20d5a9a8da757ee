"""Where a request goes, before Ray: the model it names, read from each protocol's route, and the replicas'
ranks for it (tests/ray/test_ray_serve.py checks both against a running cluster)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from modelhost.protocols.kserve_v2 import grpc_service_pb2 as pb
from modelhost.ray_serve.affinity_router import affinity_ranks
from modelhost.ray_serve.grpc_forwarding import model_of
from modelhost.ray_serve.request_model import NamedModel, named_model

TARGET = {b"x-amzn-sagemaker-target-model": b"model-3.tar.gz"}


def test_each_protocol_names_its_model_where_it_puts_it() -> None:
    assert named_model("POST", "/v2/models/m/infer", {}) == NamedModel("m", "m")
    assert named_model("POST", "/v2/models/m/versions/2/infer", {}) == NamedModel("m", "m")
    assert named_model("GET", "/v2/models/m", {}) == NamedModel("m", "m")
    assert named_model("GET", "/v2/models/m/stats", {}) == NamedModel("m", None)
    assert named_model("POST", "/v2/repository/models/m/load", {}) == NamedModel("m", None)
    assert named_model("POST", "/v1/models/m:predict", {}) == NamedModel("m", "m")
    assert named_model("GET", "/v1/models/m/versions/3/metadata", {}) == NamedModel("m", "m")
    assert named_model("POST", "/invocations", TARGET) == NamedModel("model-3", None)
    assert named_model("POST", "/endpoints/e/invocations", TARGET) == NamedModel("model-3", None)
    assert named_model("POST", "/models/m/invoke", {}) == NamedModel("m", None)


def test_requests_about_the_server_name_no_model() -> None:
    for path in ("/v2", "/v2/health/ready", "/v2/models/stats", "/v2/repository/index", "/metrics", "/ping",
                 "/invocations"):
        assert named_model("GET", path, {}) is None, path
    assert named_model("GET", "/v2/models/stats/ready", {}) == NamedModel("stats", "stats")  # a model so named


def test_grpc_requests_name_their_model_and_garbage_names_none() -> None:
    request = pb.ModelInferRequest(model_name="m", raw_input_contents=[b"\0" * 64])
    assert model_of("ModelInfer", request.SerializeToString()) == ("m", True)
    assert model_of("ModelStatistics", pb.ModelStatisticsRequest(name="m").SerializeToString()) == ("m", False)
    assert model_of("ServerLive", b"") == ("", False)
    assert model_of("ModelInfer", b"\xff\xff\xff") == ("", False)


@dataclass(eq=False)
class Replica:
    unique_id: str
    multiplexed_model_ids: set[str] = field(default_factory=set)
    routing_stats: dict[str, int] = field(default_factory=dict)

    @property
    def replica_id(self) -> Replica:
        return self


def test_holders_rank_first_then_every_replica_in_the_models_hash_order() -> None:
    replicas = [Replica(f"r{i}") for i in range(4)]
    cold = affinity_ranks("m", replicas)
    assert sorted(len(rank) for rank in cold) == [1, 1, 1, 1]
    assert affinity_ranks("m", list(reversed(replicas))) == cold, "every router ranks the same way"
    owner = cold[0][0]
    replicas[2].multiplexed_model_ids.add("m")
    replicas[3].multiplexed_model_ids.add("m")
    warm = affinity_ranks("m", replicas)
    assert {r.unique_id for r in warm[0]} == {"r2", "r3"}
    assert [rank[0] for rank in warm[1:]] == [rank[0] for rank in cold if rank[0] not in warm[0]]
    assert owner in replicas


def test_cold_models_spread_over_replicas_and_a_new_replica_moves_only_its_share() -> None:
    replicas = [Replica(f"r{i}") for i in range(4)]
    models = [f"model-{i}" for i in range(400)]
    owners = {m: affinity_ranks(m, replicas)[0][0].unique_id for m in models}
    assert min(Counter(owners.values()).values()) > 60
    grown = [*replicas, Replica("r4")]
    moved = [m for m in models if affinity_ranks(m, grown)[0][0].unique_id != owners[m]]
    assert all(affinity_ranks(m, grown)[0][0].unique_id == "r4" for m in moved)
    assert 40 < len(moved) < 130


def test_a_cold_model_goes_to_the_emptier_of_its_first_two_replicas() -> None:
    replicas = [Replica(f"r{i}", routing_stats={"free_bytes": 100}) for i in range(4)]
    first, second = (rank[0] for rank in affinity_ranks("m", replicas)[:2])
    second.routing_stats["free_bytes"] = 101
    assert [rank[0] for rank in affinity_ranks("m", replicas)[:2]] == [second, first]
    third = affinity_ranks("m", replicas)[2][0]
    third.routing_stats["free_bytes"] = 10**9  # only the first two are compared: the hash order stays
    assert affinity_ranks("m", replicas)[0][0] is second
    second.multiplexed_model_ids.add("m")  # held: its holders come first whatever the bytes
    assert affinity_ranks("m", replicas)[0] == [second]


def test_a_cold_model_placed_a_moment_ago_keeps_its_place_when_the_bytes_change() -> None:
    replicas = [Replica(f"r{i}", routing_stats={"free_bytes": 100}) for i in range(4)]
    first, second = (rank[0] for rank in affinity_ranks("m", replicas)[:2])
    second.routing_stats["free_bytes"] = 101  # the bytes moved since the model was sent to `first`
    assert affinity_ranks("m", replicas, placed=first.unique_id)[0] == [first]
    assert affinity_ranks("m", replicas)[0] == [second]
