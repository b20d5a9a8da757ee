"""modelhost on Ray Serve against modelhost alone, and model-affinity routing against spreading, one run.

    python benchmarks/ray_serve.py [--parts overhead,routing] [--duration 15] [--zipf 1.0,1.2] [--json out.json]

Both parts run on a local Ray instance this script starts (logical CPUs: --ray-cpus), on the same machine and
with the same client (modelhost.client.AsyncClient, V2 binary tensors, closed loop, never retrying).

overhead: the example repository's `tiny` (4 floats) and `rank` (500 rows x 1,000 features) served by
`modelhost serve` directly and by `modelhost ray --replicas 1` (Ray's HTTP proxy -> the ingress deployment ->
the replica): p50, p99 and req/s at concurrency 1 and 8, and Ray's cost per request (p50 difference).

routing: --models archives (tests/archives.py's weighted_model, 1 MiB of weights each), --replicas replicas whose
model caches each hold --per-replica models (the per-model charge measured first, on one replica), Zipf
traffic (popularity rank r drawn with p ~ 1/r^s) from --concurrency clients for --duration s after --warmup s:
hit ratio (requests that found their model loaded on the replica they reached), loads, p50, p99, req/s, for
`--routing affinity` and `--routing spread` (the less busy of two random replicas), and for one replica whose
cache holds replicas x per-replica models (one big cache of the same total size: the hit ratio affinity aims at).
Every answer is checked (OUTPUT0 = INPUT0 + the model's number). Ratios, not absolute figures: the client, Ray's
processes and the replicas share the machine's cores.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import requests

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.multi_model import ms, zipf_sequences  # noqa: E402
from modelhost.client import AsyncClient, RetryPolicy  # noqa: E402
from modelhost.ray_serve.command import APP_NAME, deploy, parse_flags, serve_config  # noqa: E402
from tests.archives import write_archives  # noqa: E402
from tests.server import free_port  # noqa: E402

WIDTH = 256 * 1024
NO_RETRY = RetryPolicy(attempts=1)


def wait_ready(base: str, timeout: float = 300.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if requests.get(base + "/v2/health/ready", timeout=2).status_code == 200:
                return
        except requests.RequestException:
            pass
        time.sleep(0.3)
    raise RuntimeError(f"{base} did not become ready")


async def closed_loop(url: str, requests_of: Any, concurrency: int, seconds: float) -> tuple[list[float], float]:
    """`concurrency` clients, each sending `requests_of(client_index, n)` -> (model, inputs, check) back to
    back for `seconds`: (latencies, elapsed)."""
    latencies: list[float] = []
    deadline = time.perf_counter() + seconds

    async def one(index: int) -> None:
        async with AsyncClient(url, retry=NO_RETRY, timeout=60) as client:
            n = 0
            while time.perf_counter() < deadline:
                model, inputs, check = requests_of(index, n)
                started = time.perf_counter()
                outputs = await client.infer(model, inputs)
                latencies.append(time.perf_counter() - started)
                check(outputs)
                n += 1

    started = time.perf_counter()
    await asyncio.gather(*(one(i) for i in range(concurrency)))
    return latencies, time.perf_counter() - started


def summary(latencies: list[float], elapsed: float) -> dict[str, float]:
    return {"rps": len(latencies) / elapsed, "p50": ms(latencies, 50), "p99": ms(latencies, 99),
            "requests": len(latencies)}


# ------------------------------------------------------------------------------------------------ overhead

EXAMPLES = {
    "tiny": {"x": np.ones((1, 4), np.float32)},
    "rank": {"features": np.random.default_rng(0).random((500, 1000), dtype=np.float32)},
}


def example_load(model: str) -> Any:
    inputs = EXAMPLES[model]
    return lambda index, n: (model, inputs, lambda outputs: None)


async def overhead_of(url: str, args: argparse.Namespace) -> dict[str, Any]:
    results: dict[str, Any] = {}
    for model in EXAMPLES:
        for concurrency in (1, 8):
            await closed_loop(url, example_load(model), concurrency, args.warmup)
            results[f"{model} c={concurrency}"] = summary(*await closed_loop(url, example_load(model), concurrency,
                                                                             args.duration))
    return results


def overhead(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    port = free_port()
    direct = subprocess.Popen([sys.executable, "-m", "modelhost", "serve", "--http-port", str(port), "--grpc-port",
                               "0", "--sagemaker-port", "0", "--metrics-port", "0"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              env={**os.environ, "MODELHOST_CACHE_DIR": str(work / "direct")})
    try:
        wait_ready(f"http://127.0.0.1:{port}")
        alone = asyncio.run(overhead_of(f"127.0.0.1:{port}", args))
    finally:
        direct.terminate()
        direct.wait()
    base = deploy_flags(["--replicas", "1"], args)
    on_ray = asyncio.run(overhead_of(base[len("http://"):], args))
    return {"direct": alone, "ray": on_ray}


# ------------------------------------------------------------------------------------------------- routing

def deploy_flags(flags: list[str], args: argparse.Namespace) -> str:
    """Deploy the application (replacing the one before) on Ray's HTTP proxy, whose port is set once."""
    flags = [*flags, "--host", "127.0.0.1", "--http-port", str(args.ray_port), "--replica-cpus",
             str(args.replica_cpus)]
    settings, _ = parse_flags(flags)
    deploy(serve_config(flags, settings))
    base = f"http://127.0.0.1:{settings.http_port}"
    wait_ready(base)
    return base


def replicas() -> list[dict[str, Any]]:
    from ray import serve

    handle = serve.get_deployment_handle("ModelhostReplica", APP_NAME)
    answers = handle.broadcast("describe").results(timeout_s=60, return_exceptions=True)
    return [a for a in answers if not isinstance(a, Exception)]


def counted() -> tuple[int, int]:
    found = missed = 0
    for replica in replicas():
        found, missed = found + replica["found"], missed + replica["missed"]
    return found, missed


def zipf_load(streams: list[list[int]]) -> Any:
    x = np.zeros((1, WIDTH), np.float32)

    def requests_of(index: int, n: int) -> Any:
        model = streams[index][n % len(streams[index])]

        def check(outputs: dict[str, np.ndarray]) -> None:
            if outputs["OUTPUT0"][0, 0] != model:
                raise AssertionError(f"model-{model} answered {outputs['OUTPUT0'][0, 0]}")

        return f"model-{model}", {"INPUT0": x}, check

    return requests_of


def charge_per_model(archives: Path, args: argparse.Namespace) -> int:
    """What one replica's cache charges for a model, from six loaded on one replica with room for all."""
    base = deploy_flags(["--model-repository", str(archives), "--replicas", "1", "--model-cache-bytes",
                         str(1 << 30)], args)
    asyncio.run(closed_loop(base[len("http://"):], zipf_load([[0, 1, 2, 3, 4, 5]]), 1, 3.0))
    described = replicas()[0]
    return int(described["cache_bytes"] / len(described["models"]))


def routing_run(archives: Path, args: argparse.Namespace, replica_count: int, budget: int, routing: str,
                traffic: tuple[list[list[int]], list[list[int]]]) -> dict[str, Any]:
    base = deploy_flags(["--model-repository", str(archives), "--replicas", str(replica_count),
                         "--model-cache-bytes", str(budget), "--routing", routing, "--max-ongoing-requests", "8"], args)
    url = base[len("http://"):]
    warmup, measured = traffic
    asyncio.run(closed_loop(url, zipf_load(warmup), args.concurrency, args.warmup))
    found, missed = counted()
    latencies, elapsed = asyncio.run(closed_loop(url, zipf_load(measured), args.concurrency, args.duration))
    found_after, missed_after = counted()
    hits, misses = found_after - found, missed_after - missed
    return {**summary(latencies, elapsed), "hit_ratio": hits / max(hits + misses, 1),
            "loads_per_s": misses / elapsed, "held": sorted(len(r["models"]) for r in replicas())}


def routing(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    archives = work / "archives"
    write_archives(archives, args.models, WIDTH)
    charge = charge_per_model(archives, args)
    budget = int(charge * args.per_replica * 1.05)
    results: dict[str, Any] = {"charge_per_model": charge, "budget_per_replica": budget}
    length = 100_000
    for s in args.zipf:
        traffic = (zipf_sequences(args.models, s, args.concurrency, length, 1),
                   zipf_sequences(args.models, s, args.concurrency, length, 2))
        results[f"zipf {s}"] = {
            "affinity": routing_run(archives, args, args.replicas, budget, "affinity", traffic),
            "spread": routing_run(archives, args, args.replicas, budget, "spread", traffic),
            "one big cache": routing_run(archives, args, 1, budget * args.replicas, "affinity", traffic),
        }
    return results


# -------------------------------------------------------------------------------------------------- report

def report(results: dict[str, Any]) -> str:
    lines = []
    if "overhead" in results:
        direct, ray = results["overhead"]["direct"], results["overhead"]["ray"]
        lines.append("| case | direct p50 / p99 ms, req/s | on Ray p50 / p99 ms, req/s | Ray/direct p50, req/s | "
                     "Ray's cost p50 ms |")
        lines.append("|---|---|---|---|---|")
        for case in direct:
            d, r = direct[case], ray[case]
            lines.append(f"| {case} | {d['p50']:.2f} / {d['p99']:.2f}, {d['rps']:.0f} | {r['p50']:.2f} / "
                         f"{r['p99']:.2f}, {r['rps']:.0f} | {r['p50'] / d['p50']:.2f}x, {r['rps'] / d['rps']:.2f}x "
                         f"| {r['p50'] - d['p50']:.2f} |")
    if "routing" in results:
        lines.append("")
        lines.append("| traffic | routing | hit ratio | loads/s | p50 ms | p99 ms | req/s | models held per replica |")
        lines.append("|---|---|---|---|---|---|---|---|")
        for traffic, runs in results["routing"].items():
            if not traffic.startswith("zipf"):
                continue
            for name, r in runs.items():
                lines.append(f"| {traffic} | {name} | {r['hit_ratio']:.3f} | {r['loads_per_s']:.1f} | {r['p50']:.1f} "
                             f"| {r['p99']:.1f} | {r['rps']:.0f} | {r['held']} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--parts", default="overhead,routing")
    parser.add_argument("--duration", type=float, default=15.0)
    parser.add_argument("--warmup", type=float, default=5.0)
    parser.add_argument("--models", type=int, default=200)
    parser.add_argument("--replicas", type=int, default=4)
    parser.add_argument("--per-replica", type=int, default=10)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--zipf", type=lambda text: [float(v) for v in text.split(",")], default=[1.0, 1.2])
    parser.add_argument("--ray-cpus", type=int, default=8)
    parser.add_argument("--replica-cpus", type=float, default=1.0)
    parser.add_argument("--json")
    args = parser.parse_args()
    args.ray_port = free_port()
    import ray

    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    work = Path(tempfile.mkdtemp(prefix="ray-bench-"))
    ray.init(num_cpus=args.ray_cpus, include_dashboard=False, log_to_driver=False)
    results: dict[str, Any] = {}
    try:
        parts = args.parts.split(",")
        if "overhead" in parts:
            results["overhead"] = overhead(args, work)
        if "routing" in parts:
            results["routing"] = routing(args, work)
    finally:
        ray.shutdown()
        shutil.rmtree(work, ignore_errors=True)
    print(report(results))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
