"""benchmarks/scaleout_routing.py's simulator: properties its figures rest on, on small inputs."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

from benchmarks import scaleout_routing
from benchmarks.scaleout_modelhost_router import AffinityRouter
from benchmarks.scaleout_ray_router import MultiplexRouter
from benchmarks.scaleout_routing import POLICIES, simulate, summarize
from benchmarks.scaleout_sim import Cluster, Workload, make_workload

MB = 1_000_000
MEDIAN = 100 * MB


def workload(models: int, zipf: float | None, requests: int, rate: float, *, warmup: float = 0.0,
             sigma: float = 1.0, cap: int = 2 ** 62, service: float = 0.01, seed: int = 1) -> Workload:
    return make_workload(models, zipf, requests, rate, median_mb=MEDIAN / MB, sigma=sigma, cap=cap,
                         service=service, warmup=warmup, seed=seed)


def test_one_replica_every_policy_is_the_same_cache() -> None:
    # Slots enough that no request ever waits for one: then only the cache decides, and there is one cache.
    cluster = Cluster(1, budget=8 * MEDIAN, concurrency=10_000, loads=10_000)
    work = workload(60, 1.0, 3000, rate=50.0, cap=8 * MEDIAN)
    runs = {policy: simulate(policy, cluster, work) for policy in POLICIES}
    first = runs["modelhost"]
    assert 0.2 < np.mean(first.hit) < 0.95  # the budget is tight enough for the comparison to mean something
    for policy, engine in runs.items():
        assert engine.hit == first.hit, policy
        assert engine.latency == pytest.approx(first.latency), policy


@pytest.mark.parametrize("policy", ["modelhost", "ray_default", "random", "round_robin"])
def test_budgets_holding_every_model_load_each_once_per_replica(policy: str) -> None:
    cluster = Cluster(6, budget=10 ** 15, concurrency=3)
    work = workload(80, 0.8, 4000, rate=400.0)
    engine = simulate(policy, cluster, work)
    loads = len(set(zip(engine.placed, work.model)))
    assert -1 not in engine.placed
    assert summarize(engine)["hit_ratio"] == pytest.approx(1 - loads / len(work.model))
    assert sum(not hit for hit in engine.hit) == loads


def test_affinity_beats_random_under_zipf_with_tight_budgets() -> None:
    cluster = Cluster(8, budget=5 * MEDIAN, concurrency=5)
    work = workload(300, 1.0, 12_000, rate=80.0, sigma=0.0, warmup=0.5)
    ratios = {policy: summarize(simulate(policy, cluster, work))["hit_ratio"] for policy in POLICIES}
    assert ratios["modelhost"] > ratios["random"] + 0.15
    assert ratios["ray_default"] > ratios["random"] + 0.15
    assert ratios["ray_spread"] > ratios["round_robin"] + 0.15
    assert ratios["one_cache"] > ratios["random"] + 0.15


def test_byte_budget_is_never_exceeded() -> None:
    budget = 6 * MEDIAN
    cluster = Cluster(4, budget=budget, concurrency=4, loads=3)
    work = workload(150, 0.9, 3000, rate=30.0, sigma=1.5, cap=budget)
    for policy in POLICIES:
        engine = simulate(policy, cluster, work)
        for replica in engine.replicas:
            assert replica.budget == budget * (4 if policy == "one_cache" else 1)  # one cache of every replica's bytes
            assert replica.peak <= replica.budget + 1e-6, policy
            assert replica.peak > 0.8 * replica.budget, policy  # the budget was under pressure
            assert sum(replica.lru.values()) == replica.used, policy
        assert max(engine.latency) > 0 and min(engine.latency) > 0, policy  # every request was answered


@pytest.mark.parametrize("policy", ["modelhost", "ray_default"])
def test_a_hot_model_busier_than_one_replica_gets_copies(policy: str) -> None:
    # Model 0 asks for more slot-seconds than one replica has: its holders fill and the router spills it.
    cluster = Cluster(6, budget=10 * MEDIAN, concurrency=2)
    work = workload(20, 3.0, 4000, rate=300.0, service=0.02, sigma=0.0, warmup=0.5)
    summary = summarize(simulate(policy, cluster, work))
    assert summary["top1_copies"] >= 3
    assert summary["backlog_s"] < 1.0


def test_command_writes_its_table(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                  capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "rows.json"
    monkeypatch.setattr(sys, "argv", ["scaleout_routing.py", "--replicas", "2", "--models", "30", "--zipf", "uniform",
                                      "--requests", "400", "--json", str(out), "--csv", str(tmp_path / "rows.csv"),
                                      "--markdown"])
    assert scaleout_routing.main() == 0
    rows = json.loads(out.read_text())["rows"]
    assert [row["policy"] for row in rows] == list(POLICIES)
    assert all(row["zipf"] == "uniform" and row["requests"] == 200 for row in rows)
    assert len((tmp_path / "rows.csv").read_text().splitlines()) == len(POLICIES) + 1
    printed = capsys.readouterr().out
    assert "round_robin" in printed and "\n| 2 | 30 | uniform | " in printed


def test_ray_default_candidates_follow_rays_multiplex_rules() -> None:
    """request_router.py apply_multiplex_routing, as benchmarks/scaleout_ray_router.py states it."""
    cluster = Cluster(4, budget=10 * MEDIAN)
    router = MultiplexRouter(cluster, workload(10, 1.0, 10, rate=10.0))
    router.view = [{1, 2}, {1}, {3, 4, 5}, {6, 7, 8}]
    for r in range(4):
        router.engine.replicas[r].lru.update({m: MEDIAN for m in router.view[r]})
    router.view = [set() for _ in range(4)]
    for r in range(4):
        router.report(r)
    assert router.holders[1] == [0, 1] and router.fewest() == (1,)  # replica 1 reports the fewest ids

    def fresh() -> list[float]:  # a request that started routing at 0: [started, tried_first, tried_fewest, backoffs]
        return [0.0, 0.0, 0.0, -1.0]

    assert router.candidates(1, fresh(), 0.0) == [0, 1]  # first attempt: the replicas reporting the model
    state = fresh()
    assert router.candidates(9, state, 0.0) == (1,) and 9 in router.fallback  # nobody has it: fewest ids
    assert router.candidates(9, fresh(), 0.0) == ()  # another request for it already fell back
    assert router.candidates(1, state, 0.5) == (1,)  # any later attempt within the timeout: fewest ids
    assert router.candidates(1, state, 2.0) == (1,)  # past the timeout (1 to 2 s): fewest ids once more,
    assert router.candidates(1, state, 2.1) == (0, 1, 2, 3)  # then everyone
    router.spread = True
    assert router.candidates(0, fresh(), 0.0) == (0, 1, 2, 3)  # ray_spread: nobody has it, anyone


def test_a_request_waits_at_the_router_while_its_candidates_are_full() -> None:
    cluster = Cluster(2, budget=10 * MEDIAN, concurrency=1)
    router = MultiplexRouter(cluster, workload(1, None, 3, rate=1e6, service=1.0, sigma=0.0))
    engine = router.run()
    assert sorted(engine.placed) == [0, 0, 1] or sorted(engine.placed) == [0, 1, 1]
    assert all(len(r.queue) == 0 for r in engine.replicas)  # never queued at a replica
    assert max(engine.latency) > 1.0 + 0.3  # the third waited for a slot, retrying with backoff


def requests(models: list[int], arrival: list[float], service: float = 0.01) -> Workload:
    """Requests for `models` (ids into 10 models of 100 MB) at the given times, each served in `service` s."""
    return Workload([MEDIAN] * 10, arrival, models, [service] * len(models), 0)


def test_a_cold_models_first_requests_meet_on_one_replica() -> None:
    # 20 requests for each of 4 models within 20 ms: long before any replica's report reaches the router.
    work = requests([k % 4 for k in range(80)], [k * 0.00025 for k in range(80)])
    cluster = Cluster(8, budget=10 * MEDIAN, concurrency=100)
    router = AffinityRouter(cluster, work)
    engine = router.run()
    for m in range(4):
        assert {engine.placed[i] for i in range(80) if work.model[i] == m} == {router.hash_order(m)[0]}
    assert sum(not hit for hit in engine.hit) == 4  # one load per model
    ray = simulate("ray_default", cluster, work)
    assert sum(not hit for hit in ray.hit) > 8  # Ray's default router: replicas load the same models


def test_a_model_spills_to_its_next_ranked_replica_only_when_its_holder_is_full() -> None:
    cluster = Cluster(8, budget=10 * MEDIAN, concurrency=3)
    router = AffinityRouter(cluster, requests([5] * 4, [0.0, 0.01, 0.02, 0.03], service=1.0))
    engine = router.run()
    first, second = router.hash_order(5)[:2]
    assert engine.placed == [first, first, first, second]
    assert router.holders[5] == [first, second]  # the reports reached the router, in the model's hash order
    assert all(len(r.queue) == 0 for r in engine.replicas)  # nothing queued at a replica


def test_a_request_waits_at_the_router_until_its_own_retry_finds_a_slot() -> None:
    # One slot, held by request 0 until 1.3 s (a 0.3 s load, 1 s of service); request 1 (0.01 s) and request 2
    # (0.9 s) wait at the router. Request 1 retries at 1.285 s (too soon), then every 0.5 s from 1.785 s; request
    # 2 at 0.925, 0.975, 1.075, 1.275 and 1.675 s: it takes the slot (no FIFO hand-over to the older request 1).
    router = AffinityRouter(Cluster(1, budget=10 * MEDIAN, concurrency=1), requests([0, 1, 2], [0.0, 0.01, 0.9],
                                                                                    service=1.0))
    engine = router.run()
    answered = [engine.latency[i] + engine.work.arrival[i] for i in range(3)]
    assert answered[0] == pytest.approx(1.3)
    assert answered[2] == pytest.approx(1.675 + 1.3)
    assert answered[1] == pytest.approx(3.285 + 1.3)
    assert not router.backoffs and all(len(r.queue) == 0 for r in engine.replicas)


def test_free_bytes_proposal_places_cold_models_where_there_is_room() -> None:
    # 40 models, 4 budgets of 10 mean sizes: the hash gives one replica 1.3 budgets of bytes, which it thrashes;
    # choosing between a cold model's first two hash ranks by free bytes fits them all, as one cache does.
    args = scaleout_routing.parser().parse_args(["--requests", "4000", "--policies", "modelhost",
                                                 "modelhost_free_bytes", "one_cache"])
    rows = {row["policy"]: row for row in scaleout_routing.run_config(args, 4, 40, 1.0)}
    assert rows["modelhost"]["hit_ratio"] < 0.99 and rows["modelhost"]["p99_ms"] > 200  # type: ignore[operator]
    assert rows["modelhost_free_bytes"]["hit_ratio"] == rows["one_cache"]["hit_ratio"] == 1.0
    engine = simulate("modelhost_free_bytes", Cluster(4, budget=6 * MEDIAN, concurrency=4, loads=3),
                      workload(150, 0.9, 3000, rate=30.0, sigma=1.5, cap=6 * MEDIAN))
    assert all(replica.peak <= replica.budget for replica in engine.replicas)
