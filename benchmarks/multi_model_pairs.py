"""Zipf traffic on a multi-model endpoint: two builds of modelhost and the naive peer up at once, measured in turns.

    python benchmarks/multi_model_pairs.py --base REV [--pairs 6] [--duration 5] [--zipf 1.0] [--concurrency 8]
        [--priority auto] [--base-priority auto] [--flags="..."] [--base-flags="..."]

benchmarks/multi_model.py measures each server in its own minutes; on a shared machine whose speed drifts by
2x and more within a minute (other people's benchmarks, some at real-time priority), its ratios between
servers carry that drift. Here the three servers run at once, idle but for the one measured, and each takes
--duration seconds of the same Zipf traffic in turns (the order reversed every other pair), after the
cache-filling and warm-up phases of multi_model.py: every archive loaded once in order (so each is measured
alone), then 3 s of Zipf traffic. Per server and turn: requests/s, p99, server CPU per request, the hit ratio,
models held at its end, and for modelhost what a miss waited for its model and what a load and an eviction took (its
`model_*_seconds` means); the table gives medians over turns and the median of per-pair ratios against the
peer. --flags and --base-flags add server flags to a build (`--base HEAD --base-flags="--model-cache-policy
lru"` compares a setting within one build). Budget: multi_model.py's (50 x
what the working tree's cache charges per model, plus 5 %); the peer holds 50 sessions.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from cold_path import charge, modelhost  # noqa: E402
from multi_model import CACHE_MODELS, Client, Modelhost, NaivePeer, ms, zipf_sequences  # noqa: E402

from benchmarks.builds import base_tree, remove_tree  # noqa: E402
from tests.archives import write_archives  # noqa: E402

Server = Modelhost | NaivePeer


# modelhost's, as mean ms per turn
TIMED = {"wait": "loading_wait", "fetch": "downloading", "load": "loading", "evict": "unloading"}


async def turn(server: Server, client: Client, streams: list[list[int]], seconds: float) -> dict[str, float]:
    cpu, before = server.cpu(), server.counters()
    latencies, elapsed = await client.traffic(streams, seconds)
    after = server.counters()
    result = {"rps": len(latencies) / elapsed, "p99": ms(latencies, 99),
              "cpu": (server.cpu() - cpu) / len(latencies) * 1e3}
    hits, misses = (after[k] - before[k] for k in ("hits", "misses"))
    result["hit"] = hits / max(1.0, hits + misses)
    result["held"] = after["loaded"]
    for name, timing in TIMED.items():
        if f"{timing}_count" in after:
            count = after[f"{timing}_count"] - before[f"{timing}_count"]
            result[name] = (after[f"{timing}_sum"] - before[f"{timing}_sum"]) / max(1.0, count) * 1e3
    return result


async def main_async(args: argparse.Namespace, root: Path, workdir: Path) -> None:
    probe = modelhost(root, workdir, ROOT, 4 << 30, "probe")
    per_model = await charge(probe, args.width)
    probe.stop()
    budget = int(CACHE_MODELS * per_model * 1.05)
    builds = (("new", ROOT, args.priority, args.flags),
              ("base", base_tree(args.base, workdir), args.base_priority, args.base_flags))
    servers: list[Server] = [modelhost(root, workdir, tree, budget, label, priority, tuple(flags.split()))
                             for label, tree, priority, flags in builds]
    servers.append(NaivePeer(root, CACHE_MODELS))
    clients = [server.client(args.width) for server in servers]
    streams = zipf_sequences(args.models, args.zipf, args.concurrency, 200_000, 1)
    results: dict[str, list[dict[str, float]]] = {server.label: [] for server in servers}
    at = 0
    try:
        for client in clients:
            await client.sequential(list(range(args.models)))
            await client.traffic(streams, 3)
        for index in range(args.pairs):
            pairs = list(zip(servers, clients))
            at += 20_000  # each turn's traffic continues the sequence: fresh requests, the same for every server
            for server, client in pairs if index % 2 == 0 else pairs[::-1]:
                results[server.label].append(await turn(server, client, [s[at:] for s in streams], args.duration))
            print(f"pair {index + 1}: " + "; ".join(f"{label} {r[-1]['rps']:.0f} req/s, {r[-1]['cpu']:.2f} ms CPU"
                                                     for label, r in results.items()), flush=True)
    finally:
        for client in clients:
            await client.close()
        for server in servers:
            server.stop()
    print(f"\nZipf s={args.zipf}, concurrency {args.concurrency}, {args.pairs} turns of {args.duration} s each; "
          "medians, and the median of per-turn ratios to the peer\n")
    print("| server | req/s | p99 ms | CPU ms per request | req/s / peer | p99 / peer | CPU / peer | hit ratio "
          "| models held | miss wait, fetch, load, eviction ms |\n|---|---|---|---|---|---|---|---|---|---|")
    peer = results["naive peer"]
    for label, turns in results.items():
        medians = [statistics.median(t[key] for t in turns) for key in ("rps", "p99", "cpu", "hit", "held")]
        ratios = [statistics.median(t[key] / p[key] for t, p in zip(turns, peer)) for key in ("rps", "p99", "cpu")]
        timed = ", ".join(f"{statistics.median(t[k] for t in turns):.1f}" for k in TIMED if k in turns[0]) or "-"
        print(f"| {label} | {medians[0]:.0f} | {medians[1]:.1f} | {medians[2]:.2f} | "
              + " | ".join(f"{r:.2f}x" for r in ratios) + f" | {medians[3]:.3f} | {medians[4]:.0f} | {timed} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base", required=True, help="a git revision to compare the working tree with")
    parser.add_argument("--pairs", type=int, default=6)
    parser.add_argument("--duration", type=float, default=5.0)
    parser.add_argument("--zipf", type=float, default=1.0)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--models", type=int, default=200)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--priority", default="auto", help="the working tree's --compute-priority")
    parser.add_argument("--base-priority", default="auto", help="the base build's --compute-priority")
    parser.add_argument("--flags", default="", help="more server flags for the working tree's build")
    parser.add_argument("--base-flags", default="", help="more server flags for the base build")
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="modelhost-mm-pairs-"))
    root = workdir / "archives"
    write_archives(root, args.models, args.width)
    try:
        asyncio.run(main_async(args, root, workdir))
    finally:
        remove_tree(workdir / "base")
        subprocess.run(["rm", "-rf", str(workdir)], check=False)
        os.environ.pop("PYTHONSAFEPATH", None)


if __name__ == "__main__":
    main()
