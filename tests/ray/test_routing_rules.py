"""Where a request goes, before Ray: the model it names, read from each protocol's route, and the replicas'
ranks for it (tests/ray/test_ray_serve.py checks both against a running cluster)."""

from __future__ import annotations

import asyncio
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import orjson
from ray.serve._private.common import RequestMetadata
from ray.serve.request_router import PendingRequest

from modelhost.protocols.kserve_v2 import grpc_service_pb2 as pb
from modelhost.protocols.tfserving import apis_pb2, predict_pb2
from modelhost.ray_serve.affinity_router import ModelAffinityRouter, affinity_ranks
from modelhost.ray_serve.grpc_forwarding import RpcModel, model_of
from modelhost.ray_serve.request_model import NamedModel, named_model
from modelhost.ray_serve.request_sequence import http_sequence

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
    assert model_of("ModelInfer", request.SerializeToString()) == RpcModel("m", True)
    assert model_of("ModelStatistics", pb.ModelStatisticsRequest(name="m").SerializeToString()) == RpcModel("m")
    assert model_of("ServerLive", b"") == RpcModel()
    assert model_of("ModelInfer", b"\xff\xff\xff") == RpcModel()
    predict = predict_pb2.PredictRequest()
    predict.model_spec.name = "m"
    assert model_of("Predict", predict.SerializeToString()) == RpcModel("m", True)
    multi = apis_pb2.MultiInferenceRequest()
    assert model_of("MultiInference", multi.SerializeToString()) == RpcModel(), "names none: nothing to load"
    multi.tasks.add().model_spec.name = "m"
    assert model_of("MultiInference", multi.SerializeToString()) == RpcModel("m", True)
    assert model_of("HandleReloadConfigRequest", b"") == RpcModel()


def test_grpc_inferences_name_the_sequence_they_continue() -> None:
    request = pb.ModelInferRequest(model_name="m")
    request.parameters["sequence_id"].int64_param = 42
    assert model_of("ModelInfer", request.SerializeToString()) == RpcModel("m", True, "42")
    request.parameters["sequence_id"].string_param = "42"
    assert model_of("ModelInfer", request.SerializeToString()).sequence == "'42", "a string id is not the number"
    request.parameters["sequence_id"].uint64_param = 0
    assert model_of("ModelInfer", request.SerializeToString()).sequence == ""


def v2_body(parameters: dict[str, Any], binary: bool = False) -> tuple[dict[bytes, bytes], bytes]:
    head = orjson.dumps({"inputs": [{"name": "sequence_id", "shape": [1], "datatype": "INT32", "data": [1]}],
                         "parameters": parameters})
    if not binary:
        return {}, head
    return {b"inference-header-content-length": str(len(head)).encode()}, head + b'"sequence_id": 9' * 10


def test_http_inferences_name_the_sequence_they_continue_in_json_and_binary() -> None:
    for binary in (False, True):
        headers, body = v2_body({"sequence_id": 7, "sequence_start": True}, binary)
        assert http_sequence("/v2/models/m/infer", headers, body) == "7"
        assert http_sequence("/v2/models/m/versions/2/infer", headers, body) == "7"
        assert http_sequence("/v2/models/m/ready", headers, body) == ""
        headers, body = v2_body({"sequence_id": "7"}, binary)
        assert http_sequence("/v2/models/m/infer", headers, body) == "'7"
        for none in ({}, {"sequence_id": 0}, {"sequence_id": ""}, {"sequence_id": True}, {"sequence_id": [1]}):
            headers, body = v2_body(none, binary)  # the name also in an input's and in the binary tail
            assert http_sequence("/v2/models/m/infer", headers, body) == "", none
    for headers, body in (({}, b'{"parameters": {"sequence_id": 7'), ({}, b'["sequence_id"]'),
                          ({b"inference-header-content-length": b"x"}, b'{"parameters": {"sequence_id": 7}}')):
        assert http_sequence("/v2/models/m/infer", headers, body) == ""


async def routed(router: ModelAffinityRouter, replicas: list[Any], model: str, sequence: str) -> Any:
    """Where the router sends the request: the first replica of its first rank, told back as Ray does."""
    request = PendingRequest(args=[], kwargs={"sequence": sequence} if sequence else {},
                             metadata=RequestMetadata("r", "i", multiplexed_model_id=model))
    chosen = (await router.choose_replicas(replicas, request))[0][0]
    router.on_request_routed(request, chosen.replica_id, None)
    return chosen


def test_a_sequence_stays_on_its_first_replica_while_its_model_spreads() -> None:
    router = ModelAffinityRouter.__new__(ModelAffinityRouter)  # its state only; Ray's router machinery unused
    router.initialize_state()
    replicas = [Replica(f"r{i}") for i in range(4)]

    async def scenario() -> None:
        first = await routed(router, replicas, "m", "7")
        for replica in replicas:
            if replica is not first:
                replica.multiplexed_model_ids.add("m")  # the model spilled: every other replica holds it
        assert await routed(router, replicas, "m", "") is not first, "its holders take the model's traffic"
        assert await routed(router, replicas, "m", "8") is not first, "and its new sequences"
        assert [await routed(router, replicas, "m", "7") for _ in range(3)] == [first] * 3
        survivors = [replica for replica in replicas if replica is not first]
        assert await routed(router, survivors, "m", "7") in survivors, "a sequence whose replica died is placed again"

    asyncio.run(scenario())


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
