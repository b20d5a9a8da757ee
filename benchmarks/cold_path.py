"""Server CPU per cold request on a multi-model endpoint, split by thread: two builds and the naive peer in turns.

    python benchmarks/cold_path.py [--base REV] [--rounds 6] [--models 200] [--cache 5] [--concurrency 1] [--first]

Every request misses: the servers hold about --cache models and the requests go round --models archives in
order (tests/archives.py's, as benchmarks/multi_model.py makes them), so each loads one and evicts one. All
servers run at once and take rounds of --models requests in turns (the order reversed every other round),
so that a drift of the shared machine's speed falls on each. Per round and server: CPU ms per request of
the event loop's thread (the main thread), of the other threads alive at the end, and the rest of the process
total ("ended": threads that ended meanwhile, and the kernel's per-thread figures lagging its process figure,
which this column shows even where no thread ended: 0.3-0.9 ms a request with 74 and with 1,025 threads, none
started or ended, counted by thread id), from /proc (10 ms ticks: about ±0.05 ms per request over a round of
200). The table gives medians over rounds; the total is the figure to compare.

- new: the working tree; base (--base REV): `git worktree add` of REV, first on PYTHONPATH; both with
  PYTHONSAFEPATH=1 (benchmarks/builds.py says why).
- modelhost's budget: --cache times what its cache charged per model over a few loads, plus a half.
- peer: benchmarks/peers/naive_mme.py holding --cache sessions.
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

from multi_model import Client, Modelhost, NaivePeer  # noqa: E402

from benchmarks.builds import base_tree, remove_tree  # noqa: E402
from tests.archives import write_archives  # noqa: E402

TICK = os.sysconf("SC_CLK_TCK")


Times = tuple[float, float, float, float]


def thread_cpu(pid: int) -> Times:
    """(main thread, its system time, other live threads, whole process) CPU seconds."""
    def read(path: str) -> tuple[float, float]:
        with open(path) as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / TICK, int(fields[12]) / TICK

    main = system = others = 0.0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            cpu, sys_cpu = read(f"/proc/{pid}/task/{tid}/stat")
        except (OSError, IndexError):
            continue
        if int(tid) == pid:
            main, system = cpu, sys_cpu
        else:
            others += cpu
    return main, system, others, read(f"/proc/{pid}/stat")[0]


def split(before: Times, after: Times, count: int) -> dict[str, float]:
    loop, system, live, total = (a - b for a, b in zip(after, before))
    # Threads that ended lose their time from "live", and count as "ended" (with the per-thread figures' lag).
    return {"loop": loop / count * 1e3, "loop_sys": system / count * 1e3, "threads": live / count * 1e3,
            "ended": (total - loop - live) / count * 1e3, "total": total / count * 1e3}


async def round_of(client: Client, pid: int, order: list[int], concurrency: int) -> dict[str, float]:
    before = thread_cpu(pid)
    queue = list(order)

    async def worker() -> None:
        while queue:
            await client.ok(queue.pop(0))

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return split(before, thread_cpu(pid), len(order))


def modelhost(root: Path, workdir: Path, tree: Path, budget: int, label: str, priority: str = "auto",
              flags: tuple[str, ...] = ()) -> Modelhost:
    os.environ["PYTHONPATH"] = str(tree)
    os.environ["PYTHONSAFEPATH"] = "1"
    server = Modelhost(root, workdir, budget, priority, flags)
    server.label = label
    return server


async def charge(server: Modelhost, width: int) -> float:
    client = server.client(width)
    await client.sequential([0, 1, 2, 3])
    first = server.counters()["bytes"]
    await client.sequential(list(range(4, 12)))
    await client.close()
    return (server.counters()["bytes"] - first) / 8


async def main_async(args: argparse.Namespace, root: Path, workdir: Path) -> None:
    trees = {"new": ROOT} | ({"base": base_tree(args.base, workdir)} if args.base else {})
    probe = modelhost(root, workdir, ROOT, 4 << 30, "probe")
    per_model = await charge(probe, args.width)
    probe.stop()
    budget = int(per_model * (args.cache + 0.5))
    print(f"charged per model {per_model:.0f} bytes; budget {budget}", flush=True)
    servers = [modelhost(root, workdir, tree, budget, label) for label, tree in trees.items()]
    servers.append(NaivePeer(root, args.cache))
    clients = [server.client(args.width) for server in servers]
    results: dict[str, list[dict[str, float]]] = {server.label: [] for server in servers}
    try:
        first = list(range(args.models)) if not args.first else list(range(args.cache))
        for client in clients:  # a first round each: one-time costs (imports, arenas)
            await client.sequential(first)
        for index in range(args.rounds):
            pairs = list(zip(servers, clients))
            for server, client in pairs if index % 2 == 0 else pairs[::-1]:
                # --first: every model once, each one's first load (the archives split between the rounds)
                order = list(range(args.models)) if not args.first else [
                    i for i in range(args.cache, args.models) if i % args.rounds == index]
                results[server.label].append(await round_of(client, server.pid, order, args.concurrency))
            print(f"round {index + 1}: " + "; ".join(
                f"{label} {r[-1]['total']:.2f}" for label, r in results.items()), flush=True)
    finally:
        for client in clients:
            await client.close()
        for server in servers:
            server.stop()
    print(f"\n{args.rounds} rounds of {args.models} cold requests, concurrency {args.concurrency}, "
          f"cache of {args.cache}; CPU ms per cold request, medians\n")
    print("| server | event loop thread | of which system | other threads | ended threads | total |\n"
          "|---|---|---|---|---|---|")
    for label, rounds in results.items():
        cells = [statistics.median(r[key] for r in rounds) for key in ("loop", "loop_sys", "threads", "ended", "total")]
        print(f"| {label} | " + " | ".join(f"{c:.2f}" for c in cells) + " |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base", help="a git revision to compare the working tree with")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--models", type=int, default=200)
    parser.add_argument("--cache", type=int, default=5, help="models the servers hold")
    parser.add_argument("--concurrency", type=int, default=1)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--first", action="store_true", help="first loads (unpacking): --models / --rounds a round")
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="modelhost-cold-"))
    root = workdir / "archives"
    write_archives(root, args.models, args.width)
    try:
        asyncio.run(main_async(args, root, workdir))
    finally:
        if args.base:
            remove_tree(workdir / "base")
        subprocess.run(["rm", "-rf", str(workdir)], check=False)


if __name__ == "__main__":
    main()
