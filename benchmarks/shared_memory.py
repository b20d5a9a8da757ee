"""Client shared memory: `rank` x 500 (a 2 MB FP32 input a request) over system shared memory, HTTP binary and
gRPC, against the in-process limit; and perf_analyzer's `--shared-memory system` beside its HTTP binary.

    python benchmarks/shared_memory.py [--seconds 2] [--rounds 3] [--json results.json]

One `modelhost serve --allow-client-shm --compute-priority normal` on the example repository's rank model (one
instance, no batcher). Normal priority: on 2 CPUs `auto` runs the model's threads at SCHED_IDLE, which on a
machine shared with other jobs waits behind all of them while the in-process limit, at normal priority, does not.
Python cells: `c` threads, each with its own tritonclient client, send the same 500 x 1000 array for `seconds`
(after a short warm-up) and count answers; every answer is checked against onnxruntime's. The three ways:
- shm: tritonclient.http with the input and output in regions: each request copies the array into the thread's
  input region first (a client with a new array each time must), names the regions, and reads the 500 scores
  out of its output region. The socket carries only the JSON header.
- HTTP binary: tritonclient.http, the binary tensor extension both ways (2 MB request body).
- gRPC: tritonclient.grpc (raw_input_contents).
The in-process limit is a cell like the others: `c` threads calling onnxruntime in this process on the same array,
no server, no client, one session set up as the server sets up the model's one instance (intra-op threads on
every core, no spinning). Each figure is a median over the rounds (interleaved, so the shared machine's noise
falls on all cells alike); the ratios are the cell's p50 (and p10: on a loaded machine the least disturbed
requests) latency over the in-process one, and in-process req/s over the cell's (1.0: no overhead).
Paired at c=1: one thread sends one request each way in turn (the in-process call included, the order rotating),
`--pairs` times; each way's figure is the median over the turns of its latency over the in-process call's of the
same turn. Noise slower than a turn (a neighbour's job on the shared cores) falls on both sides of each ratio.
perf_analyzer (C++, benchmarks/peers/perf_analyzer.py) runs HTTP with and without `--shared-memory system` at the
same concurrencies: a client whose own cost is small, so the difference is the server's and the socket's.
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import tritonclient.grpc as grpcclient  # noqa: E402
import tritonclient.http as httpclient  # noqa: E402
import tritonclient.utils.shared_memory as shm  # noqa: E402

from benchmarks.peers import perf_analyzer  # noqa: E402
from benchmarks.tuning import MODEL, ROWS, rank_repository  # noqa: E402
from tests.server import ServerProcess  # noqa: E402

CONCURRENCIES = (1, 4)
WAYS = ("in-process", "shm", "http binary", "grpc")
Send = Callable[[], np.ndarray]
Maker = Callable[[], Send]  # called in the thread that sends: tritonclient.http's (gevent) client stays in one


class ShmSender:
    """One thread's regions: the array is copied into its input region and the scores read from its output."""

    def __init__(self, url: str, features: np.ndarray) -> None:
        self.url = url
        self.client = httpclient.InferenceServerClient(url, network_timeout=60.0)
        self.features = features
        tag = uuid.uuid4().hex[:12]
        self.names = (f"in-{tag}", f"out-{tag}")
        self.out_bytes = ROWS * 4
        self.handles = [shm.create_shared_memory_region(self.names[0], "/" + self.names[0], features.nbytes),
                        shm.create_shared_memory_region(self.names[1], "/" + self.names[1], self.out_bytes)]
        self.client.register_system_shared_memory(self.names[0], "/" + self.names[0], features.nbytes)
        self.client.register_system_shared_memory(self.names[1], "/" + self.names[1], self.out_bytes)
        self.input = httpclient.InferInput("features", list(features.shape), "FP32")
        self.input.set_shared_memory(self.names[0], features.nbytes)
        self.output = httpclient.InferRequestedOutput("score")
        self.output.set_shared_memory(self.names[1], self.out_bytes)

    def make(self) -> Send:
        client = httpclient.InferenceServerClient(self.url, network_timeout=60.0)

        def send() -> np.ndarray:
            shm.set_shared_memory_region(self.handles[0], [self.features])
            client.infer(MODEL, [self.input], outputs=[self.output])
            return shm.get_contents_as_numpy(self.handles[1], np.float32, [ROWS, 1]).copy()

        return send

    def close(self) -> None:
        for name in self.names:
            self.client.unregister_system_shared_memory(name)
        for handle in self.handles:
            shm.destroy_shared_memory_region(handle)
        self.client.close()


def http_sender(url: str, features: np.ndarray) -> Send:  # a Maker, given its arguments
    client = httpclient.InferenceServerClient(url, network_timeout=60.0)
    inputs = [httpclient.InferInput("features", list(features.shape), "FP32")]
    outputs = [httpclient.InferRequestedOutput("score", binary_data=True)]

    def send() -> np.ndarray:
        inputs[0].set_data_from_numpy(features, binary_data=True)
        return client.infer(MODEL, inputs, outputs=outputs).as_numpy("score")

    return send


def grpc_sender(url: str, features: np.ndarray) -> Send:
    client = grpcclient.InferenceServerClient(url)
    inputs = [grpcclient.InferInput("features", list(features.shape), "FP32")]

    def send() -> np.ndarray:
        inputs[0].set_data_from_numpy(features)
        return client.infer(MODEL, inputs).as_numpy("score")

    return send


def in_process_sender(session: Any, features: np.ndarray) -> Send:  # a Maker, given its arguments
    def send() -> np.ndarray:
        return session.run(None, {"features": features})[0]

    return send


def server_like_session(model: Path) -> Any:
    """An onnxruntime session as modelhost's onnx backend makes the example's rank instance."""
    import os

    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = os.cpu_count() or 1
    options.inter_op_num_threads = 1
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return ort.InferenceSession(str(model), options, providers=["CPUExecutionProvider"])


def run_cell(makers: list[Maker], expected: np.ndarray, seconds: float) -> dict[str, float]:
    """req/s and p50 ms of one thread per maker, each sending in a loop for `seconds` after 0.5 s of warm-up
    (its first answer checked)."""
    latencies: list[list[float]] = [[] for _ in makers]
    start_at = time.monotonic() + 0.5
    end_at = start_at + seconds

    def loop(index: int) -> None:
        send = makers[index]()
        np.testing.assert_allclose(send(), expected, rtol=1e-4, atol=1e-5)
        while (now := time.monotonic()) < end_at:
            send()
            if now >= start_at:
                latencies[index].append(time.monotonic() - now)

    threads = [threading.Thread(target=loop, args=(i,)) for i in range(len(makers))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    every = sorted(x for lane in latencies for x in lane)
    return {"rps": len(every) / seconds, "p50_ms": 1000 * statistics.median(every),
            "p10_ms": 1000 * every[len(every) // 10]}


def measure_round(server: ServerProcess, session: Any, features: np.ndarray, expected: np.ndarray,
                  seconds: float) -> dict[str, float]:
    """One round of every Python cell: (way, c) -> req/s and p50."""
    figures: dict[str, float] = {}
    for c in CONCURRENCIES:
        shm_senders = [ShmSender(server.url, features) for _ in range(c)]
        makers: dict[str, list[Maker]] = {
            "in-process": [lambda: in_process_sender(session, features)] * c,
            "shm": [sender.make for sender in shm_senders],
            "http binary": [lambda: http_sender(server.url, features)] * c,
            "grpc": [lambda: grpc_sender(server.grpc_url, features)] * c,
        }
        try:
            for way in WAYS:
                cell = run_cell(makers[way], expected, seconds)
                figures[f"{way} c={c}"] = cell["rps"]
                figures[f"{way} c={c} p50"] = cell["p50_ms"]
                figures[f"{way} c={c} p10"] = cell["p10_ms"]
        finally:
            for sender in shm_senders:
                sender.close()
    return figures


def paired(makers: dict[str, Maker], expected: np.ndarray, pairs: int) -> dict[str, float]:
    """Median over turns of each way's latency over the in-process call's in the same turn (see the docstring)."""
    sends = {way: make() for way, make in makers.items()}
    for send in sends.values():
        np.testing.assert_allclose(send(), expected, rtol=1e-4, atol=1e-5)
    ways = list(sends)
    ratios: dict[str, list[float]] = {way: [] for way in ways if way != "in-process"}
    for turn in range(pairs):
        took: dict[str, float] = {}
        for way in ways[turn % len(ways):] + ways[:turn % len(ways)]:
            start = time.perf_counter()
            sends[way]()
            took[way] = time.perf_counter() - start
        for way in ratios:
            ratios[way].append(took[way] / took["in-process"])
    return {way: statistics.median(values) for way, values in ratios.items()}


def paired_round(server: ServerProcess, session: Any, features: np.ndarray, expected: np.ndarray,
                 pairs: int) -> dict[str, float]:
    sender = ShmSender(server.url, features)
    result: dict[str, float] = {}

    def run() -> None:
        result.update(paired({"in-process": lambda: in_process_sender(session, features), "shm": sender.make,
                              "http binary": lambda: http_sender(server.url, features),
                              "grpc": lambda: grpc_sender(server.grpc_url, features)}, expected, pairs))

    thread = threading.Thread(target=run)  # tritonclient.http's client lives and dies in one thread
    try:
        thread.start()
        thread.join()
    finally:
        sender.close()
    return result


def analyzer_cells(server: ServerProcess, features: np.ndarray, workdir: Path, seconds: float) -> dict[str, Any]:
    # One step, each request's 500 rows made of it: perf_analyzer's shared memory registers a region per step
    # (500 of 2 MB with a step per row), so both modes send this same batch of one row 500 times.
    one_step = perf_analyzer.write_input_data(workdir / "rank.perf_analyzer.json", "features", features[:1])
    data = perf_analyzer.InputData(one_step.path, ROWS)
    cells: dict[str, Any] = {}
    for c in CONCURRENCIES:
        for memory in ("none", "system"):
            cells[f"perf_analyzer http {'shm' if memory == 'system' else 'binary'} c={c}"] = perf_analyzer.measure(
                "http", server.url, MODEL, data, c, seconds, warmup_s=1.0, shared_memory=memory)
    return cells


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=2.0, help="each cell of each round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--pairs", type=int, default=300, help="turns of the paired c=1 measurement")
    parser.add_argument("--no-perf-analyzer", action="store_true")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--server-args", default="", help="more `modelhost serve` flags, e.g. --lone-request-max-us 0")
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="modelhost-shm-"))
    features = np.random.default_rng(0).standard_normal((ROWS, 1000), dtype=np.float32)
    repo = rank_repository(workdir)
    session = server_like_session(repo / MODEL / "1" / "model.onnx")
    expected = session.run(None, {"features": features})[0]
    server = ServerProcess(repo, "--allow-client-shm", "--compute-priority", "normal", *shlex.split(args.server_args))
    server.wait_ready()
    rounds: list[dict[str, float]] = []
    try:
        pairs = paired_round(server, session, features, expected, args.pairs)
        for _ in range(args.rounds):
            rounds.append(measure_round(server, session, features, expected, args.seconds))
        analyzer = {} if args.no_perf_analyzer else analyzer_cells(server, features, workdir, 3 * args.seconds)
    finally:
        server.stop()
    results = summarize(rounds, analyzer)
    results["paired"] = pairs
    print_tables(results)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


def summarize(rounds: list[dict[str, float]], analyzer: dict[str, Any]) -> dict[str, Any]:
    medians = {key: statistics.median(r[key] for r in rounds) for key in rounds[0]}
    return {"medians": medians, "rounds": rounds, "perf_analyzer": analyzer}


def print_tables(results: dict[str, Any]) -> None:
    medians = results["medians"]
    print("Paired at c=1, median of (this way's latency / the in-process call's), same turn: " + ", ".join(
        f"{way} {ratio:.2f}" for way, ratio in results["paired"].items()))
    print()
    print("| way | c | req/s | p50 ms | p10 ms | p50 / in-process p50 | p10 / in-process p10 "
          "| in-process req/s / this |")
    print("|---|---|---|---|---|---|---|---|")
    for c in CONCURRENCIES:
        limit = {k: medians[f"in-process c={c}{k}"] for k in ("", " p50", " p10")}
        for way in WAYS:
            rps, p50, p10 = (medians[f"{way} c={c}{k}"] for k in ("", " p50", " p10"))
            print(f"| {way} | {c} | {rps:.1f} | {p50:.2f} | {p10:.2f} | {p50 / limit[' p50']:.2f} "
                  f"| {p10 / limit[' p10']:.2f} | {limit[''] / rps:.2f} |")
    if results["perf_analyzer"]:
        print()
        print("| perf_analyzer | req/s | p50 ms | p99 ms | p50 / in-process p50 | in-process req/s / this |")
        print("|---|---|---|---|---|---|")
        for name, cell in results["perf_analyzer"].items():
            c = int(name.rsplit("=", 1)[1])
            limit_rps, limit_p50 = medians[f"in-process c={c}"], medians[f"in-process c={c} p50"]
            print(f"| {name} | {cell['rps']:.1f} | {cell['p50']:.2f} | {cell['p99']:.1f} "
                  f"| {cell['p50'] / limit_p50:.2f} | {limit_rps / cell['rps']:.2f} |")


if __name__ == "__main__":
    main()
