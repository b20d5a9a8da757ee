"""The sequence batcher's cost per request against a stateless model of the same size.

    python benchmarks/sequences.py [--duration 5] [--json results.json]

One server, two ONNX models of the same size (int32 [batch, 1] in, three [batch, 1] outputs, nine elementwise
nodes, max_batch_size 8, one instance): `stateful`, the tests' accumulator (tests/onnx_models.py) under
`sequence_batching` (direct, START/END/READY/CORRID control inputs and an implicit state), and `stateless`,
the same node count on constants with a dynamic batcher and no sequence. The client sends the same one input
to both, over HTTP JSON on http.client keep-alive connections with pre-built bodies; `c` threads, each its own
connection, each running sequences of 10 requests (START, 8, END) under its own id on `stateful`. Every
answer is checked. The server's CPU per request (from /proc) is the figure to read: the Python client shares
the machine's cores.
"""

from __future__ import annotations

import argparse
import http.client
import json
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from datetime import date
from pathlib import Path

import onnx
import orjson
from onnx import TensorProto, helper

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.onnx_models import ACCUMULATOR_CONTROLS, _finish, accumulator_model, write_model  # noqa: E402
from tests.server import ServerProcess  # noqa: E402

SEQUENCE_LENGTH = 10
COMMON = """
platform: "onnxruntime_onnx"
max_batch_size: 8
input [ { name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [
  { name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] },
  { name: "FLAGS" data_type: TYPE_INT32 dims: [ 1 ] },
  { name: "CORRID_OUT" data_type: TYPE_UINT64 dims: [ 1 ] }
]
instance_group [ { count: 1 } ]
"""
STATEFUL = COMMON + "sequence_batching {\n  direct { }\n" + ACCUMULATOR_CONTROLS + "}\n"
STATELESS = COMMON + "dynamic_batching { }\n"


def stateless_model() -> onnx.ModelProto:
    """The accumulator's nine nodes on one input and constants: OUTPUT = INPUT, FLAGS = 4, CORRID_OUT = 0."""
    def constant(name: str, value: int, kind: int = TensorProto.INT32) -> onnx.NodeProto:
        return helper.make_node("Constant", [], [name], value=helper.make_tensor(name, kind, [], [value]))

    nodes = [constant("one", 1), constant("two", 2), constant("four", 4), constant("zero", 0),
             constant("id", 0, TensorProto.UINT64),
             helper.make_node("Sub", ["one", "one"], ["start"]),
             helper.make_node("Mul", ["INPUT", "zero"], ["kept"]),
             helper.make_node("Add", ["kept", "INPUT"], ["OUTPUT"]),
             helper.make_node("Mul", ["start", "two"], ["end2"]),
             helper.make_node("Mul", ["one", "four"], ["ready4"]),
             helper.make_node("Add", ["start", "end2"], ["start_end"]),
             helper.make_node("Add", ["start_end", "ready4"], ["flags"]),
             helper.make_node("Add", ["flags", "kept"], ["FLAGS"]),
             helper.make_node("Mul", ["kept", "zero"], ["ids"]),
             helper.make_node("Cast", ["ids"], ["ids64"], to=TensorProto.UINT64),
             helper.make_node("Add", ["ids64", "id"], ["CORRID_OUT"])]
    graph = helper.make_graph(
        nodes, "stateless", [helper.make_tensor_value_info("INPUT", TensorProto.INT32, ["batch", 1])],
        [helper.make_tensor_value_info(n, t, ["batch", 1]) for n, t in
         (("OUTPUT", TensorProto.INT32), ("FLAGS", TensorProto.INT32), ("CORRID_OUT", TensorProto.UINT64))])
    return _finish(graph)


def body(sequence_id: int, position: int) -> bytes:
    """The request at `position` (0-based) of a sequence; 0 is the start, SEQUENCE_LENGTH - 1 the end."""
    document: dict = {"inputs": [{"name": "INPUT", "datatype": "INT32", "shape": [1, 1], "data": [1]}]}
    if sequence_id:
        document["parameters"] = {"sequence_id": sequence_id, "sequence_start": position == 0,
                                  "sequence_end": position == SEQUENCE_LENGTH - 1}
    return orjson.dumps(document)


def run_cell(server: ServerProcess, model: str, threads: int, warmup: float, seconds: float) -> dict:
    latencies: list[list[float]] = [[] for _ in range(threads)]
    stop_at = [0.0]
    timing = threading.Event()

    def worker(index: int) -> None:
        connection = http.client.HTTPConnection(server.url)
        sequence_id = index + 1 if model == "stateful" else 0
        bodies = [body(sequence_id, position) for position in range(SEQUENCE_LENGTH)]
        path = f"/v2/models/{model}/infer"
        position = 0
        while True:
            started = time.perf_counter()
            if started >= stop_at[0] and position == 0:
                break
            connection.request("POST", path, bodies[position], {"Content-Type": "application/json"})
            response = connection.getresponse()
            answer = orjson.loads(response.read())
            assert response.status == 200, answer
            output = next(o for o in answer["outputs"] if o["name"] == "OUTPUT")["data"][0]
            assert output == (position + 1 if sequence_id else 1), answer
            if timing.is_set():
                latencies[index].append(time.perf_counter() - started)
            position = (position + 1) % SEQUENCE_LENGTH
        connection.close()

    stop_at[0] = time.perf_counter() + warmup + seconds
    workers = [threading.Thread(target=worker, args=(i,)) for i in range(threads)]
    for thread in workers:
        thread.start()
    time.sleep(warmup)
    cpu_before, began = cpu_seconds(server.process.pid), time.perf_counter()
    timing.set()
    for thread in workers:
        thread.join()
    elapsed = time.perf_counter() - began
    cpu = cpu_seconds(server.process.pid) - cpu_before
    every = sorted(x for per in latencies for x in per)
    return {"model": model, "c": threads, "requests": len(every), "req_s": len(every) / elapsed,
            "p50_ms": statistics.median(every) * 1000, "p99_ms": every[int(len(every) * 0.99)] * 1000,
            "cpu_ms_per_req": cpu * 1000 / len(every)}


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of one process, from /proc (10 ms ticks)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / 100


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--duration", type=float, default=5.0)
    parser.add_argument("--warmup", type=float, default=1.0)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    with tempfile.TemporaryDirectory() as directory:
        repo = Path(directory)
        write_model(repo, "stateful", accumulator_model(), STATEFUL)
        write_model(repo, "stateless", stateless_model(), STATELESS)
        server = ServerProcess(repo).wait_ready()
        try:
            rows = [run_cell(server, model, c, args.warmup, args.duration)
                    for c in (1, 8) for model in ("stateless", "stateful")]
        finally:
            server.stop()
    print(f"{date.today()} commit {commit.stdout.strip()}, {args.duration:g} s per cell")
    print("| c | model | req/s | p50 ms | p99 ms | server CPU ms/req | CPU/req vs stateless | p50 vs stateless |")
    print("|---|---|---|---|---|---|---|---|")
    for row in rows:
        base = next(r for r in rows if r["c"] == row["c"] and r["model"] == "stateless")
        print(f"| {row['c']} | {row['model']} | {row['req_s']:.0f} | {row['p50_ms']:.3f} | {row['p99_ms']:.3f} | "
              f"{row['cpu_ms_per_req']:.3f} | {row['cpu_ms_per_req'] / base['cpu_ms_per_req']:.2f}x | "
              f"{row['p50_ms'] / base['p50_ms']:.2f}x |")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
