"""Model-affinity routing over a cluster of modelhost replicas, by discrete-event simulation (issue 20, item 6).

    python benchmarks/scaleout_routing.py                      # 4 replicas x 10-model budgets, 200 models
    python benchmarks/scaleout_routing.py --sweep --json scaleout.json --csv scaleout.csv   # 4..1000 x 100..100k

N replicas, each a byte-budgeted LRU model cache (modelhost/core/model_cache.py's policy:
benchmarks/scaleout_sim.py says how it is simulated) with max_ongoing_requests slots; M models of lognormal sizes
(median --median-mb, --sigma; seeded; truncated at half a replica's budget); Poisson requests at --rate-per-replica
x N a second, each for a model drawn by Zipf popularity (exponent s; `uniform` for none), served in --service-ms
once its model is loaded; a load costs --load-base-s + size / --bandwidth-mbps. The per-replica budget is
--budget-models x the models' mean size (or --budget-mb). Policies:
  modelhost    the router modelhost's Ray application ships (modelhost/ray_serve/affinity_router.py; its rules:
               benchmarks/scaleout_modelhost_router.py): the model's holders, then every other replica in the
               model's rendezvous-hash order, so a cold model's requests meet on one replica without a report
  ray_default  Ray Serve's default model-multiplexing router (benchmarks/scaleout_ray_router.py states its rules
               and the Ray source they come from), each replica's cache byte-budgeted as modelhost's
  ray_spread   Ray's default rules, but a request no reporting replica can take goes to any replica (power of two
               choices over all) instead of to the replicas reporting the fewest model ids
  modelhost_free_bytes  what modelhost ships: its ranks, but a model no replica reports goes to the
               one of its first two hash ranks whose last routing stats (--stats-period-s) showed more free bytes
  random       each request to a uniformly random replica, queued there
  round_robin  each request to the next replica in turn, queued there
  one_cache    one cache of the whole cluster's bytes, slots and load slots: the bound routing is measured against
Each configuration runs max(--requests, --requests-per-replica x N) requests; the first --warmup of them fill the
caches and are not counted. Reported: hit ratio (requests whose replica started no load for them), loads a second
(cluster; the busiest replica), imbalance (max / mean over replicas of requests and of busy seconds: service plus
load work), copies of the 10 most popular models when the last request arrives, what one replica's death would
orphan then at the worst replica (the models only it holds, and their share of the requests), latency p50 / p99
(arrival to answer, ms), and the backlog: seconds from the last arrival to the last answer (more than a few: the
configuration is overloaded, its latencies grow with the run's length and mean only that).
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.scaleout_modelhost_router import AffinityRouter, FreeBytesRouter  # noqa: E402
from benchmarks.scaleout_ray_router import MultiplexRouter  # noqa: E402
from benchmarks.scaleout_sim import Cluster, Engine, Workload, make_workload, simple_policy  # noqa: E402

POLICIES = ("modelhost", "ray_default", "ray_spread", "random", "round_robin", "one_cache")
PROPOSALS = ("modelhost_free_bytes",)  # run only when named in --policies
SWEEP_REPLICAS = (4, 16, 64, 256, 1000)
SWEEP_MODELS = (100, 1000, 10_000, 100_000)
COLUMNS = ("policy", "replicas", "models", "zipf", "requests", "hit_ratio", "loads_per_s", "max_replica_loads_per_s",
           "request_imbalance", "busy_imbalance", "top10_copies", "top1_copies", "sole_models_max",
           "sole_traffic_max", "p50_ms", "p99_ms", "backlog_s",
           "wall_s")


def simulate(policy: str, cluster: Cluster, work: Workload, seed: int = 0) -> Engine:
    if policy == "modelhost":
        return AffinityRouter(cluster, work, seed).run()
    if policy == "modelhost_free_bytes":
        return FreeBytesRouter(cluster, work, seed).run()
    if policy == "ray_default":
        return MultiplexRouter(cluster, work, seed).run()
    if policy == "ray_spread":
        return MultiplexRouter(cluster, work, seed, spread=True).run()
    return simple_policy(policy, cluster, work, seed)


def summarize(engine: Engine) -> dict[str, float]:
    work, replicas = engine.work, engine.replicas
    first = work.measured_from
    start, end = work.arrival[first], work.arrival[-1]
    window = end - start
    loads = np.array([sum(1 for t in r.load_starts if t <= end) for r in replicas], dtype=np.float64)
    requests = np.array([r.requests for r in replicas], dtype=np.float64)
    busy = np.array([r.busy for r in replicas])
    latency = np.array(engine.latency[first:]) * 1000
    copies = [sum(1 for held in engine.held_at_end if m in held) for m in range(min(10, len(work.sizes)))]
    sole, sole_traffic = sole_copies(engine)
    return {
        "requests": len(latency),
        "hit_ratio": float(np.mean(engine.hit[first:])),
        "loads_per_s": float(loads.sum() / window),
        "max_replica_loads_per_s": float(loads.max() / window),
        "request_imbalance": float(requests.max() / max(requests.mean(), 1e-9)),
        "busy_imbalance": float(busy.max() / max(busy.mean(), 1e-9)),
        "top10_copies": float(np.mean(copies)),
        "top1_copies": float(copies[0]),
        "sole_models_max": float(sole),
        "sole_traffic_max": sole_traffic,
        "p50_ms": float(np.percentile(latency, 50)),
        "p99_ms": float(np.percentile(latency, 99)),
        "backlog_s": float(max(engine.latency[i] + work.arrival[i] for i in range(first, len(work.arrival))) - end),
    }


def sole_copies(engine: Engine) -> tuple[int, float]:
    """What one replica's death orphans, at the worst replica: the models only it holds when the last request
    arrives, and the share
    of the measured requests that asked for them (each would miss until its model is loaded elsewhere)."""
    holders = np.zeros(len(engine.work.sizes), dtype=np.int64)
    for held in engine.held_at_end:
        holders[list(held)] += 1
    asked = np.bincount(engine.work.model[engine.work.measured_from:], minlength=len(holders))
    worst = (0, 0.0)
    for held in engine.held_at_end:
        alone = [m for m in held if holders[m] == 1]
        worst = max(worst, (len(alone), float(asked[alone].sum() / asked.sum())))
    return worst


def run_config(args: argparse.Namespace, replicas: int, models: int, zipf: float | None) -> list[dict[str, object]]:
    requests = max(args.requests, args.requests_per_replica * replicas)
    mean_mb = args.median_mb * float(np.exp(args.sigma ** 2 / 2))
    budget = round((args.budget_mb or args.budget_models * mean_mb) * 1e6)
    work = make_workload(models, zipf, requests, args.rate_per_replica * replicas, median_mb=args.median_mb,
                         sigma=args.sigma, cap=budget // 2, service=args.service_ms / 1000, warmup=args.warmup,
                         seed=args.seed)
    cluster = Cluster(replicas, budget, args.concurrency, args.loads, args.load_base_s, args.bandwidth_mbps * 1e6,
                      args.report_lag_s, stats_period=args.stats_period_s)
    rows: list[dict[str, object]] = []
    for policy in args.policies:
        started = time.perf_counter()
        summary = summarize(simulate(policy, cluster, work, args.seed))
        label = "uniform" if zipf is None else zipf
        rows.append({"policy": policy, "replicas": replicas, "models": models, "zipf": label, **summary,
                     "wall_s": time.perf_counter() - started})
    return rows


def format_row(row: dict[str, object]) -> str:
    cells = [f"{row['policy']!s:<15}"]
    for column in COLUMNS[1:]:
        value = row[column]
        cells.append(f"{value:>9.3f}" if isinstance(value, float) else f"{value!s:>9}")
    return " ".join(cells)


def markdown(rows: list[dict[str, object]]) -> str:
    """One line per configuration, the policies side by side: the table docs/scale-out.md shows."""
    by: dict[tuple[object, object, object], dict[object, dict[str, object]]] = {}
    for row in rows:
        by.setdefault((row["replicas"], row["models"], row["zipf"]), {})[row["policy"]] = row
    lines = ["| replicas | models | Zipf | hit ratio: modelhost / Ray default / random / one cache | loads/s: "
             "modelhost / random / one cache | busiest replica loads/s: modelhost / random | imbalance, modelhost: "
             "requests / busy | p99 ms: modelhost / Ray default / round-robin |", "|" + " --- |" * 8]
    for (replicas, models, zipf), cells in by.items():
        lines.append(" | ".join((
            f"| {replicas}", f"{models:,}", str(zipf),
            side_by_side(cells, ("modelhost", "ray_default", "random", "one_cache"), "hit_ratio", ".3f"),
            side_by_side(cells, ("modelhost", "random", "one_cache"), "loads_per_s", ".0f"),
            side_by_side(cells, ("modelhost", "random"), "max_replica_loads_per_s", ".1f"),
            side_by_side(cells, ("modelhost",), "request_imbalance", ".2f") + " / "
            + side_by_side(cells, ("modelhost",), "busy_imbalance", ".2f"),
            side_by_side(cells, ("modelhost", "ray_default", "round_robin"), "p99_ms", ".0f") + " |")))
    return "\n".join(lines)


def side_by_side(cells: dict[object, dict[str, object]], policies: tuple[str, ...], column: str, form: str) -> str:
    return " / ".join(format(cells[p][column], form) if column in cells.get(p, {}) else "-" for p in policies)


def parse_zipf(text: str) -> float | None:
    return None if text == "uniform" else float(text)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--replicas", type=int, nargs="+", default=[4])
    p.add_argument("--models", type=int, nargs="+", default=[200])
    p.add_argument("--zipf", type=parse_zipf, nargs="+", default=[1.0, 1.2], help="exponents, or `uniform`")
    p.add_argument("--sweep", action="store_true", help=f"replicas {SWEEP_REPLICAS} x models {SWEEP_MODELS}")
    p.add_argument("--policies", nargs="+", choices=POLICIES + PROPOSALS, default=list(POLICIES))
    p.add_argument("--budget-models", type=float, default=10.0, help="per-replica budget, in mean model sizes")
    p.add_argument("--budget-mb", type=float, default=0.0, help="per-replica budget in MB (overrides the above)")
    p.add_argument("--median-mb", type=float, default=100.0)
    p.add_argument("--sigma", type=float, default=1.0, help="lognormal sigma of model sizes (0: all the median)")
    p.add_argument("--requests", type=int, default=20_000)
    p.add_argument("--requests-per-replica", type=int, default=200)
    p.add_argument("--rate-per-replica", type=float, default=10.0, help="requests a second per replica")
    p.add_argument("--service-ms", type=float, default=10.0, help="mean service time (exponential)")
    p.add_argument("--concurrency", type=int, default=5, help="max_ongoing_requests per replica")
    p.add_argument("--loads", type=int, default=4, help="concurrent loads per replica")
    p.add_argument("--load-base-s", type=float, default=0.2)
    p.add_argument("--bandwidth-mbps", type=float, default=1000.0)
    p.add_argument("--report-lag-s", type=float, default=0.2, help="replica's model ids to the routers")
    p.add_argument("--stats-period-s", type=float, default=1.0, help="replicas' routing stats to the routers "
                   "(modelhost_free_bytes)")
    p.add_argument("--warmup", type=float, default=0.5, help="fraction of requests not counted")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", type=Path, help="also write the rows here")
    p.add_argument("--csv", type=Path, help="also write the rows here")
    p.add_argument("--markdown", action="store_true", help="end with the policies side by side, as a Markdown table")
    return p


def main() -> int:
    args = parser().parse_args()
    if args.sweep:
        args.replicas, args.models = list(SWEEP_REPLICAS), list(SWEEP_MODELS)
    print(f"{COLUMNS[0]:<15} " + " ".join(f"{c[:9]:>9}" for c in COLUMNS[1:]), flush=True)
    rows = []
    for replicas in args.replicas:
        for models in args.models:
            for zipf in args.zipf:
                for row in run_config(args, replicas, models, zipf):
                    print(format_row(row), flush=True)
                    rows.append(row)
    if args.markdown:
        print(markdown(rows))
    if args.json:
        args.json.write_text(json.dumps({"settings": {k: str(v) for k, v in vars(args).items()}, "rows": rows},
                                        indent=1))
    if args.csv:
        with args.csv.open("w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=COLUMNS)
            writer.writeheader()
            writer.writerows(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
