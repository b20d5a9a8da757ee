"""Lone requests on the event loop: a large request alone in the server, and what it costs others, two builds.

    python benchmarks/lone_requests.py --base HEAD~1 [--pairs 6] [--duration 3] [--rate 200]

A request alone in the server may run on the event loop up to the loop gate's lone budget (core/loop_gate.py)
instead of being handed to its instance thread and back. This measures what that gains the lone request and
what it costs a request that arrives while the loop runs one, with the two builds' servers running at once and
the cells measured in turns (benchmarks/builds.py's method and helpers), perf_analyzer as the client:
- `rank` x 500 rows over HTTP binary at concurrency 1, the same through system shared memory (perf_analyzer's
  --shared-memory system; the servers run with --allow-client-shm), and the in-process limit in the same turn:
  onnxruntime in this process on a session set up as the server's instance, called one request at a time (no
  server, no client), for `--duration` seconds;
- the same `rank` load with `tiny` sent beside it open loop at `--rate` requests a second (a second client's
  small requests, health checks, another model): `rank`'s req/s and `tiny`'s p50 and p99, which arrive while
  `rank` computes on the loop in the new build, and on its instance thread in the base;
- `tiny` alone at concurrency 1 and 32 (the cheap request's own loop path must not change).
With `--paired N`, also N turns of one request each way to each build and one
in-process call, in an order that rotates (tritonclient, as benchmarks/shared_memory.py's paired figure): the median
over turns of each way's latency over the in-process call's of the same turn, which cancels drift slower than a turn.
"""

from __future__ import annotations

import argparse
import shlex
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks import builds, serving  # noqa: E402
from benchmarks.peers import perf_analyzer  # noqa: E402
from benchmarks.shared_memory import ShmSender, http_sender, in_process_sender, paired, server_like_session  # noqa: E402
from modelhost.example_repository import ensure_example_repository  # noqa: E402
from tests.server import ServerProcess  # noqa: E402

Result = dict[str, float]


def in_process(session: object, features: np.ndarray, seconds: float) -> Result:
    latencies = []
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        started = time.perf_counter()
        session.run(None, {"features": features})  # type: ignore[attr-defined]
        latencies.append(time.perf_counter() - started)
    return {"rps": len(latencies) / sum(latencies), "p50": statistics.median(latencies) * 1e3,
            "p99": float(np.percentile(latencies, 99)) * 1e3}


def beside(server: ServerProcess, data: dict[str, perf_analyzer.InputData], seconds: float, rate: float) -> Result:
    """rank at concurrency 1 and tiny at `rate` a second, at once; rank's req/s, tiny's latencies."""
    small: dict[str, Result] = {}

    def send_small() -> None:
        small["tiny"] = perf_analyzer.measure("http", server.url, "tiny", data["tiny"], 1, seconds, rate=rate)

    thread = threading.Thread(target=send_small)
    thread.start()
    large = perf_analyzer.measure("http", server.url, "rank", data["rank"], 1, seconds)
    thread.join()
    return {"rps": large["rps"], "p50": small["tiny"]["p50"], "p99": small["tiny"]["p99"],
            "tiny_rps": small["tiny"]["rps"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base", required=True, help="the git revision to compare the working tree with")
    parser.add_argument("--pairs", type=int, default=6)
    parser.add_argument("--duration", type=float, default=3.0)
    parser.add_argument("--rate", type=float, default=200.0, help="tiny's requests a second beside rank")
    parser.add_argument("--args", default="", help="extra `modelhost serve` arguments for both builds")
    parser.add_argument("--paired", type=int, default=0, help="turns of the paired measurement (0: none)")
    options = parser.parse_args()
    cells = ["rank c=1", "rank c=1 shm", "rank c=1 + tiny open loop", "tiny c=1", "tiny c=32"]
    with tempfile.TemporaryDirectory(prefix="lone-") as scratch:
        workdir = Path(scratch)
        repository = ensure_example_repository(workdir / "cache")
        data = {model: builds.input_data(model, workdir) for model in ("rank", "tiny")}
        rank_case = next(case for case in serving.cases() if case["model"] == "rank")
        # perf_analyzer's shared memory registers a region per step: one step, each request 500 copies of it.
        one_row = perf_analyzer.write_input_data(workdir / "rank-shm.json", rank_case["input"], rank_case["array"][:1])
        shm_data = perf_analyzer.InputData(one_row.path, data["rank"].batch_size)
        session = server_like_session(repository / "rank" / "1" / "model.onnx")
        tree = builds.base_tree(options.base, workdir)
        names = [f"base ({options.base})", "working tree"]
        servers: dict[str, ServerProcess] = {}
        results: dict[tuple[str, str], list[Result]] = {}
        try:
            for name, env in zip(names, ({"PYTHONPATH": str(tree)}, {}), strict=True):
                env = {**env, "PYTHONSAFEPATH": "1"}
                builds.check_source(env, tree if env.get("PYTHONPATH") else ROOT)
                servers[name] = ServerProcess(repository, "--allow-client-shm", *shlex.split(options.args),
                                              env=env).wait_ready()
            for pair in range(options.pairs):
                for name in (names if pair % 2 == 0 else names[::-1]):
                    server, seconds = servers[name], options.duration
                    turn = {
                        "rank c=1": perf_analyzer.measure("http", server.url, "rank", data["rank"], 1, seconds, 1.0),
                        "rank c=1 shm": perf_analyzer.measure("http", server.url, "rank", shm_data, 1, seconds, 1.0,
                                                              shared_memory="system"),
                        "rank c=1 + tiny open loop": beside(server, data, seconds, options.rate),
                        "tiny c=1": perf_analyzer.measure("http", server.url, "tiny", data["tiny"], 1, seconds, 1.0),
                        "tiny c=32": perf_analyzer.measure("http", server.url, "tiny", data["tiny"], 32, seconds, 1.0),
                    }
                    turn["in-process"] = in_process(session, rank_case["array"], seconds)
                    for cell, result in turn.items():
                        results.setdefault((name, cell), []).append(result)
                    figures = (f"{cell} {r['rps']:.0f} req/s p50 {r['p50']:.2f} p99 {r['p99']:.2f}"
                               for cell, r in turn.items())
                    print(f"pair {pair}, {name}: " + "; ".join(figures), flush=True)
            if options.paired:
                ratios = paired_turns(servers, names, session, rank_case["array"], options.paired)
                print("paired, latency / in-process latency (median of turns): "
                      + ", ".join(f"{way} {ratio:.3f}" for way, ratio in ratios.items()), flush=True)
        finally:
            for server in servers.values():
                server.stop()
            builds.remove_tree(tree)
    print(report(cells, names, results))


def paired_turns(servers: dict[str, ServerProcess], names: list[str], session: object, features: np.ndarray,
                 turns: int) -> dict[str, float]:
    senders = {name: ShmSender(servers[name].url, features) for name in names}
    makers = {"in-process": lambda: in_process_sender(session, features)}
    for name in names:
        makers[f"{name} http"] = lambda url=servers[name].url: http_sender(url, features)  # type: ignore[misc]
        makers[f"{name} shm"] = senders[name].make
    expected = session.run(None, {"features": features})[0]  # type: ignore[attr-defined]
    result: dict[str, float] = {}
    # tritonclient.http's client lives and dies in one thread
    thread = threading.Thread(target=lambda: result.update(paired(makers, expected, turns)))
    try:
        thread.start()
        thread.join()
    finally:
        for sender in senders.values():
            sender.close()
    return result


def paired_ratio(a: list[Result], b: list[Result], key: str) -> float:
    """The median over pairs of b's figure / a's."""
    return statistics.median(y[key] / x[key] for x, y in zip(a, b, strict=True))


def report(cells: list[str], names: list[str], results: dict[tuple[str, str], list[Result]]) -> str:
    lines = ["| cell | " + " | ".join(f"{n}: req/s, p50, p99 ms" for n in names)
             + " | new / base: req/s, p50, p99 (median of pairs) | rank: in-process req/s / this, p50 / in-process |",
             "|---|---|---|---|---|"]
    for cell in cells:
        a, b = (results[(name, cell)] for name in names)
        limit = ""
        if cell.startswith("rank c=1") and "tiny" not in cell:
            limit = ", ".join(f"{paired_ratio(runs, results[(n, 'in-process')], 'rps'):.2f}x / "
                              f"{paired_ratio(results[(n, 'in-process')], runs, 'p50'):.2f}x"
                              for n, runs in zip(names, (a, b), strict=True))
        cols = [", ".join(f"{statistics.median(run[k] for run in runs):.{0 if k == 'rps' else 2}f}"
                          for k in ("rps", "p50", "p99")) for runs in (a, b)]
        ratios = ", ".join(f"{paired_ratio(a, b, k):.2f}x" for k in ("rps", "p50", "p99"))
        lines.append(f"| {cell} | {cols[0]} | {cols[1]} | {ratios} | {limit} |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
