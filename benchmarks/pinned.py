"""The performance issue's per-request goals, with the server and the load generator on separate cores.

    python benchmarks/pinned.py [--server-cpus 0-1] [--client-cpus 4-11] [--duration 8] [--json results.json]
        [--cases rank,tiny,workers,shm]

On a machine with cores to spare, the server (and the in-process limit) run on --server-cpus and perf_analyzer
(benchmarks/peers/perf_analyzer.py) on --client-cpus, so the client's own work is not charged to the server.
Without those flags everything shares the machine's cores. Measured, each cell after a 2 s warm-up:
- `rank` x 500 rows over HTTP binary and gRPC at concurrency 1: p50 against one onnxruntime call in-process on
  the server's cores (the goals: at most 2.0x for HTTP, gRPC at most 1.2x HTTP);
- `tiny` over HTTP and gRPC at concurrency 8 and 32 (the goal: gRPC at least 0.8x HTTP's requests/s);
- `rank` over HTTP at concurrency 1 and 4 with `--workers 2` and with one process (the goal: no slower at 1);
- `rank` over HTTP binary and over system shared memory at concurrency 1 (Triton parity issue: shm within 1.3x of
  the limit). perf_analyzer registers a region per step of its input data, so both cells send one row's step
  as a batch of 500 (shared_memory.py does the same).
On a 2-core machine, `--server-cpus 0 --client-cpus 1` keeps the load generator off the server's core (the
server then sizes its threads to one core, and the limit runs on that core too).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort
import requests

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks import serving  # noqa: E402
from benchmarks.cpu_list import cpu_list  # noqa: E402
from benchmarks.peers import perf_analyzer  # noqa: E402
from modelhost.example_repository import ensure_example_repository  # noqa: E402
from tests.server import ServerProcess  # noqa: E402


def limit_p50_ms(model_file: Path, array: np.ndarray, input_name: str, threads: int) -> float:
    """One onnxruntime call's median, with the server's session options, on the calling thread's cores."""
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    session = ort.InferenceSession(str(model_file), options, providers=["CPUExecutionProvider"])
    feeds = {input_name: array}
    for _ in range(30):
        session.run(None, feeds)
    times = []
    for _ in range(300):
        started = time.perf_counter()
        session.run(None, feeds)
        times.append(time.perf_counter() - started)
    return statistics.median(times) * 1e3


class Placement:
    """Where the server and the client run: the server inherits this process's cores when it starts."""

    def __init__(self, server: set[int] | None, client: set[int] | None) -> None:
        self.server, self.client = server, client

    def start(self, repository: Path, *args: str) -> ServerProcess:
        if self.server is not None:
            os.sched_setaffinity(0, self.server)
        server = ServerProcess(repository, *args)
        if self.client is not None:
            os.sched_setaffinity(0, self.client)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                if requests.get(server.base + "/v2/health/ready", timeout=1).status_code == 200:
                    return server
            except requests.RequestException:
                pass
            time.sleep(0.1)
        raise RuntimeError(f"server not ready:\n{server.stop()[-3000:]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--server-cpus", type=cpu_list, help="the server's and the limit's cores, e.g. 0-1")
    parser.add_argument("--client-cpus", type=cpu_list, help="perf_analyzer's cores, e.g. 4-11")
    parser.add_argument("--duration", type=float, default=8.0, help="seconds measured per cell")
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument("--cases", default="rank,tiny,workers,shm", help="which of rank, tiny, workers, shm to run")
    args = parser.parse_args()
    cases = set(args.cases.split(","))
    placement = Placement(args.server_cpus, args.client_cpus)
    work = Path(tempfile.mkdtemp(prefix="pinned-"))
    repository = ensure_example_repository(work)
    arrays = {case["model"]: case["array"] for case in serving.cases()}
    data = {
        "rank": perf_analyzer.write_input_data(work / "rank.json", "features", arrays["rank"]),
        "tiny": perf_analyzer.write_input_data(work / "tiny.json", "x", arrays["tiny"]),
        "rank, one step": perf_analyzer.InputData(
            perf_analyzer.write_input_data(work / "rank-step.json", "features", arrays["rank"][:1]).path,
            len(arrays["rank"])),
    }

    def limit_now() -> float:
        """The limit on the server's cores, measured now: this VM's speed drifts by a third within a minute."""
        mine = os.sched_getaffinity(0)
        if placement.server is not None:
            os.sched_setaffinity(0, placement.server)
        try:
            return limit_p50_ms(repository / "rank" / "1" / "model.onnx", arrays["rank"], "features",
                                len(os.sched_getaffinity(0)))
        finally:
            os.sched_setaffinity(0, mine)

    limit = limit_now()
    print(f"limit: rank, one onnxruntime call on the server's cores, median {limit:.3f} ms", flush=True)
    results: list[dict[str, object]] = []

    def cell(server: ServerProcess, label: str, protocol: str, model: str, concurrency: int,
             shared_memory: str = "none", inputs: str | None = None) -> None:
        url = server.grpc_url if protocol == "grpc" else server.url
        measured = perf_analyzer.measure(protocol, url, model, data[inputs or model], concurrency, args.duration,
                                         warmup_s=2, shared_memory=shared_memory)
        if shared_memory != "none":
            protocol += " shm"
        elif inputs is not None:
            protocol += f" ({inputs})"
        row = {"server": label, "protocol": protocol, "model": model, "c": concurrency, **measured}
        ratio = ""
        if model == "rank":
            row["limit after"] = after = limit_now()
            row["p50 / limit"] = measured["p50"] / limit
            row["p50 / limit after"] = measured["p50"] / after
            ratio = f", p50 / limit {measured['p50'] / limit:.2f}x (against the limit right after: {after:.3f} ms, " \
                    f"{measured['p50'] / after:.2f}x)"
        results.append(row)
        print(f"{label} {model} {protocol} c={concurrency}: {measured['rps']:.0f} req/s, p50 {measured['p50']:.2f} ms, "
              f"p99 {measured['p99']:.2f} ms" + ratio, flush=True)
        print("  mean ms: " + ", ".join(f"{part} {measured[part]:.3f}" for part in perf_analyzer.BREAKDOWN
                                        if part in measured), flush=True)

    server = placement.start(repository, "--allow-client-shm")
    try:
        if "rank" in cases:
            for protocol in ("http", "grpc"):
                cell(server, "one process", protocol, "rank", 1)
        if "shm" in cases:
            cell(server, "one process", "http", "rank", 1, inputs="rank, one step")
            cell(server, "one process", "http", "rank", 1, shared_memory="system", inputs="rank, one step")
        if "tiny" in cases:
            for concurrency in (8, 32):
                for protocol in ("http", "grpc"):
                    cell(server, "one process", protocol, "tiny", concurrency)
        if "rank" in cases or "workers" in cases:
            cell(server, "one process", "http", "rank", 4)
    finally:
        server.stop()
    if "workers" in cases:
        server = placement.start(repository, "--workers", "2")
        try:
            for concurrency in (1, 4):
                cell(server, "--workers 2", "http", "rank", concurrency)
        finally:
            server.stop()
    if args.json:
        args.json.write_text(json.dumps({"limit_rank_p50_ms": limit, "cells": results}, indent=1))


if __name__ == "__main__":
    main()
