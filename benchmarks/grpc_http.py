"""gRPC vs HTTP benchmark: `rank` (500 x 1000 FP32) and `tiny`, one run, same Python load generator for all.

    python benchmarks/grpc_http.py [--duration 5] [--json results.json]

Protocols: gRPC through tritonclient.grpc (`infer()` with raw contents, and its generated stub sent a
pre-built ModelInferRequest), HTTP binary extension and HTTP JSON over http.client keep-alive
connections with pre-built bodies. N threads, one client per thread, concurrency 1 and 8; plus a
grpc.aio client keeping N requests in flight from one event loop. Every answer format is checked
against in-process onnxruntime before timing. The load generator is Python and shares the machine's
cores with the server, so for `tiny` it measures the client as much as the server: read ratios.
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from datetime import date
from pathlib import Path

import grpc
import numpy as np
import onnxruntime as ort
import orjson
import tritonclient.grpc as grpcclient
from tritonclient.grpc import service_pb2, service_pb2_grpc

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.server import ServerProcess  # noqa: E402

MODELS = {"rank": ("features", "score", (500, 1000)), "tiny": ("x", "y", (1, 4))}
PROTOCOLS = ["gRPC tritonclient", "gRPC stub, pre-built", "HTTP binary", "HTTP JSON"]
GRPC_OPTIONS = [("grpc.max_send_message_length", -1), ("grpc.max_receive_message_length", -1)]
Call = Callable[[], np.ndarray]


def http_body(name: str, array: np.ndarray, output: str, binary: bool) -> tuple[bytes, dict[str, str]]:
    """A V2 infer request body and its headers: binary extension or plain JSON."""
    tensor: dict = {"name": name, "datatype": "FP32", "shape": list(array.shape)}
    if not binary:
        tensor["data"] = array.reshape(-1)
        document = {"inputs": [tensor], "outputs": [{"name": output, "parameters": {"binary_data": False}}]}
        return orjson.dumps(document, option=orjson.OPT_SERIALIZE_NUMPY), {"Content-Type": "application/json"}
    tensor["parameters"] = {"binary_data_size": array.nbytes}
    header = orjson.dumps({"inputs": [tensor], "outputs": [{"name": output, "parameters": {"binary_data": True}}]})
    return header + array.tobytes(), {"Inference-Header-Content-Length": str(len(header))}


def make_client(server: ServerProcess, protocol: str, model: str, array: np.ndarray) -> Call:
    """One client (one connection) for one thread; the call returns the output as an array."""
    name, output, _ = MODELS[model]
    if protocol == "gRPC tritonclient":
        client = grpcclient.InferenceServerClient(server.grpc_url)
        tensor = grpcclient.InferInput(name, list(array.shape), "FP32")
        tensor.set_data_from_numpy(array)
        outputs = [grpcclient.InferRequestedOutput(output)]
        return lambda: client.infer(model, [tensor], outputs=outputs).as_numpy(output)
    if protocol == "gRPC stub, pre-built":
        stub = service_pb2_grpc.GRPCInferenceServiceStub(grpc.insecure_channel(server.grpc_url, GRPC_OPTIONS))
        request = grpc_request(model, array)
        return lambda: np.frombuffer(stub.ModelInfer(request).raw_output_contents[0], dtype=np.float32)
    body, headers = http_body(name, array, output, protocol == "HTTP binary")
    connection = http.client.HTTPConnection(server.url)
    path = f"/v2/models/{model}/infer"

    def call() -> np.ndarray:
        connection.request("POST", path, body, headers)
        response = connection.getresponse()
        content = response.read()
        if response.status != 200:
            raise RuntimeError(f"HTTP {response.status}: {content[:200]!r}")
        length = response.getheader("Inference-Header-Content-Length")
        if length is None:
            return np.asarray(orjson.loads(content)["outputs"][0]["data"], dtype=np.float32)
        return np.frombuffer(content, dtype=np.float32, offset=int(length))

    return call


def grpc_request(model: str, array: np.ndarray) -> service_pb2.ModelInferRequest:
    name, output, _ = MODELS[model]
    request = service_pb2.ModelInferRequest(model_name=model)
    request.inputs.add(name=name, datatype="FP32", shape=list(array.shape))
    request.outputs.add(name=output)
    request.raw_input_contents.append(array.tobytes())
    return request


def threaded(calls: list[Call], warmup: float, seconds: float) -> dict:
    """Each thread calls its client back to back; latencies after the warm-up count."""
    start = time.perf_counter()
    measure_from, deadline = start + warmup, start + warmup + seconds
    latencies: list[list[float]] = [[] for _ in calls]
    totals = [0] * len(calls)

    def worker(i: int) -> None:
        while True:
            begin = time.perf_counter()
            if begin >= deadline:
                return
            calls[i]()
            totals[i] += 1
            if begin >= measure_from:
                latencies[i].append(time.perf_counter() - begin)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(len(calls))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return summary([x for xs in latencies for x in xs], seconds, sum(totals))


async def aio_cell(server: ServerProcess, model: str, array: np.ndarray, c: int, warmup: float, seconds: float) -> dict:
    """grpc.aio: c coroutines on one channel, one event loop, pre-built request."""
    request = grpc_request(model, array)
    async with grpc.aio.insecure_channel(server.grpc_url, options=GRPC_OPTIONS) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        start = time.perf_counter()
        measure_from, deadline = start + warmup, start + warmup + seconds
        latencies: list[float] = []
        total = 0

        async def worker() -> None:
            nonlocal total
            while (begin := time.perf_counter()) < deadline:
                await stub.ModelInfer(request)
                total += 1
                if begin >= measure_from:
                    latencies.append(time.perf_counter() - begin)

        await asyncio.gather(*(worker() for _ in range(c)))
    return summary(latencies, seconds, total)


def summary(latencies: list[float], seconds: float, total: int) -> dict:
    """req/s and p50/p99 ms of the measured calls; `total` counts the warm-up too (for CPU per request)."""
    ordered = sorted(latencies)
    return {"rps": len(ordered) / seconds, "p50": ordered[len(ordered) // 2] * 1e3,
            "p99": ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))] * 1e3, "n": len(ordered), "total": total}


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of one process, from /proc (10 ms ticks)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def limit_p50(repository: Path, model: str, array: np.ndarray) -> tuple[float, np.ndarray]:
    """In-process onnxruntime with the server's thread count: one call's median ms, and the expected output."""
    options = ort.SessionOptions()
    options.intra_op_num_threads = os.cpu_count() or 1
    session = ort.InferenceSession(str(repository / model / "1" / "model.onnx"), options,
                                   providers=["CPUExecutionProvider"])
    feeds = {MODELS[model][0]: array}
    times = []
    for _ in range(300 if model == "rank" else 3000):
        begin = time.perf_counter()
        session.run(None, feeds)
        times.append(time.perf_counter() - begin)
    return statistics.median(times) * 1e3, session.run(None, feeds)[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--duration", type=float, default=5.0, help="seconds measured per cell (after --warmup)")
    parser.add_argument("--warmup", type=float, default=1.0)
    parser.add_argument("--json", type=Path, help="also write the raw results here")
    args = parser.parse_args()
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    print(f"commit {commit.stdout.strip()}, {date.today()}, load average at start {os.getloadavg()}", flush=True)
    print(f"onnxruntime {ort.__version__}, grpcio {grpc.__version__}", flush=True)
    server = ServerProcess(None, cache_dir=Path(tempfile.mkdtemp(prefix="modelhost-grpc-bench-"))).wait_ready()
    rng = np.random.default_rng(0)
    rows = []
    try:
        for model, (_, _, shape) in MODELS.items():
            array = rng.standard_normal(shape).astype(np.float32)
            p50, expected = limit_p50(server.example_repository, model, array)
            for protocol in PROTOCOLS:
                got = make_client(server, protocol, model, array)()
                np.testing.assert_allclose(got.reshape(expected.shape), expected, rtol=1e-4, atol=1e-5)
            for c in (1, 8):
                for protocol in [*PROTOCOLS, "gRPC aio, one loop"]:
                    cpu_before = cpu_seconds(server.process.pid)
                    if protocol == "gRPC aio, one loop":
                        result = asyncio.run(aio_cell(server, model, array, c, args.warmup, args.duration))
                    else:
                        calls = [make_client(server, protocol, model, array) for _ in range(c)]
                        result = threaded(calls, args.warmup, args.duration)
                    server_cpu = (cpu_seconds(server.process.pid) - cpu_before) / result["total"] * 1e3
                    row = {"model": model, "protocol": protocol, "c": c, "limit_p50_ms": p50, **result,
                           "server_cpu_ms": server_cpu}
                    rows.append(row)
                    print(f"{model} c={c} {protocol}: {result['rps']:.0f} req/s p50 {result['p50']:.2f} ms "
                          f"p99 {result['p99']:.2f} ms, server CPU {server_cpu:.3f} ms/req", flush=True)
    finally:
        server.stop()
    print(f"load average at end {os.getloadavg()}")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))
    print()
    print(table(rows))


def table(rows: list[dict]) -> str:
    lines = ["| model | c | protocol | req/s | p50 ms | p99 ms | p50 / limit | req/s / HTTP binary "
             "| server CPU ms/req |",
             "|---|---|---|---|---|---|---|---|---|"]
    for row in rows:
        base = next(r for r in rows if (r["model"], r["c"], r["protocol"]) == (row["model"], row["c"], "HTTP binary"))
        lines.append(f"| {row['model']} | {row['c']} | {row['protocol']} | {row['rps']:.0f} | {row['p50']:.2f} | "
                     f"{row['p99']:.2f} | {row['p50'] / row['limit_p50_ms']:.1f}x | {row['rps'] / base['rps']:.2f}x | "
                     f"{row['server_cpu_ms']:.3f} |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
