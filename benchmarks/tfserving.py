"""The recommender request through TF Serving's APIs: a DeepFM-style SavedModel scoring 500 candidates per request.

    python benchmarks/tfserving.py [--duration 5] [--json results.json]

The model (written here, seeded): 26 categorical fields looked up in one 200,000 x 16 embedding table (12.8 MB)
plus a linear term, 13 dense features, a factorization-machine interaction and a 429-256-128-1 MLP; inputs
`sparse_ids` INT64 [batch, 26] and `dense` FP32 [batch, 13], output `score` FP32 [batch]. It is served by
`modelhost serve` from TF Serving's layout (`deepfm/1/saved_model.pb`, no config), and the same 500 candidates go
as a TF Serving gRPC `PredictRequest` (the official stubs; `make_tensor_proto`, so `tensor_content`), as TF Serving
REST JSON (columnar `inputs` and row `instances`), as KServe V2 over HTTP (binary extension and JSON) and as V2
gRPC (`raw_input_contents`). Request bodies are built once; each answer is checked against the SavedModel called
in-process, which is also the limit (its median call). Python threads as clients, one connection each, c=1 and
c=8: they share the machine's cores with the server, so read the ratios. Every cell runs --rounds times, the
protocols in a rotated order each round; the table shows each figure's median, and each ratio as the median over
rounds of the two protocols' p50s measured in the same round.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import date
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import orjson

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import tensorflow as tf  # noqa: E402
from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc  # noqa: E402
from tritonclient.grpc import service_pb2, service_pb2_grpc  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.grpc_http import GRPC_OPTIONS, cpu_seconds, threaded  # noqa: E402
from tests.server import ServerProcess  # noqa: E402

CANDIDATES = 500
FIELDS, DENSE, EMBEDDING, VOCABULARY = 26, 13, 16, 200_000
PROTOCOLS = ["TFS gRPC Predict", "TFS REST JSON columnar", "TFS REST JSON rows", "V2 HTTP binary", "V2 HTTP JSON",
             "V2 gRPC raw"]
Call = Callable[[], np.ndarray]


class DeepFM(tf.Module):
    def __init__(self, seed: int = 0) -> None:
        super().__init__()
        rng = np.random.default_rng(seed)

        def weight(*shape: int, scale: float = 0.05) -> tf.Variable:
            return tf.Variable(rng.normal(0, scale, shape).astype(np.float32))

        self.embedding = weight(VOCABULARY, EMBEDDING)
        self.linear = weight(VOCABULARY, 1)
        self.dense_weight = weight(DENSE, 1)
        width = FIELDS * EMBEDDING + DENSE
        self.layers = [(weight(width, 256), weight(256)), (weight(256, 128), weight(128)), (weight(128, 1), weight(1))]

    @tf.function(input_signature=[tf.TensorSpec([None, FIELDS], tf.int64, name="sparse_ids"),
                                  tf.TensorSpec([None, DENSE], tf.float32, name="dense")])
    def serve(self, sparse_ids: Any, dense: Any) -> dict[str, Any]:
        vectors = tf.gather(self.embedding, sparse_ids)  # [batch, fields, k]
        linear = tf.reduce_sum(tf.gather(self.linear, sparse_ids), axis=[1, 2]) + tf.squeeze(
            tf.matmul(dense, self.dense_weight), 1)
        summed = tf.reduce_sum(vectors, axis=1)
        fm = 0.5 * tf.reduce_sum(summed * summed - tf.reduce_sum(vectors * vectors, axis=1), axis=1)
        hidden = tf.concat([tf.reshape(vectors, [-1, FIELDS * EMBEDDING]), dense], axis=1)
        for index, (kernel, bias) in enumerate(self.layers):
            hidden = tf.matmul(hidden, kernel) + bias
            if index < len(self.layers) - 1:
                hidden = tf.nn.relu(hidden)
        return {"score": tf.sigmoid(linear + fm + tf.squeeze(hidden, 1))}


def write_model(repository: Path) -> Path:
    module = DeepFM()
    path = repository / "deepfm" / "1"
    tf.saved_model.save(module, str(path), signatures={"serving_default": module.serve})
    return path


def candidates(seed: int = 1) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return (rng.integers(0, VOCABULARY, (CANDIDATES, FIELDS), dtype=np.int64),
            rng.standard_normal((CANDIDATES, DENSE)).astype(np.float32))


def limit(path: Path, ids: np.ndarray, dense: np.ndarray) -> tuple[float, np.ndarray]:
    """The SavedModel's signature called in-process: one call's median ms (tensors made from the arrays each
    call, as a server must), and the expected scores."""
    function = tf.saved_model.load(str(path)).signatures["serving_default"]
    times = []
    for _ in range(300):
        begin = time.perf_counter()
        function(sparse_ids=tf.constant(ids), dense=tf.constant(dense))["score"].numpy()
        times.append(time.perf_counter() - begin)
    return statistics.median(times) * 1e3, function(sparse_ids=tf.constant(ids), dense=tf.constant(dense))[
        "score"].numpy()


def v2_http_body(ids: np.ndarray, dense: np.ndarray, binary: bool) -> tuple[bytes, dict[str, str]]:
    tensors = [("sparse_ids", "INT64", ids), ("dense", "FP32", dense)]
    if not binary:
        document = {"inputs": [{"name": n, "datatype": t, "shape": list(a.shape), "data": a.reshape(-1)}
                               for n, t, a in tensors],
                    "outputs": [{"name": "score", "parameters": {"binary_data": False}}]}
        return orjson.dumps(document, option=orjson.OPT_SERIALIZE_NUMPY), {"Content-Type": "application/json"}
    header = orjson.dumps({
        "inputs": [{"name": n, "datatype": t, "shape": list(a.shape), "parameters": {"binary_data_size": a.nbytes}}
                   for n, t, a in tensors],
        "outputs": [{"name": "score", "parameters": {"binary_data": True}}]})
    return header + ids.tobytes() + dense.tobytes(), {"Inference-Header-Content-Length": str(len(header))}


def make_client(server: ServerProcess, protocol: str, ids: np.ndarray, dense: np.ndarray) -> Call:
    """One client (one connection) for one thread; the call returns the scores."""
    if protocol == "TFS gRPC Predict":
        stub = prediction_service_pb2_grpc.PredictionServiceStub(grpc.insecure_channel(server.grpc_url, GRPC_OPTIONS))
        request = predict_pb2.PredictRequest()
        request.model_spec.name = "deepfm"
        request.inputs["sparse_ids"].CopyFrom(tf.make_tensor_proto(ids))
        request.inputs["dense"].CopyFrom(tf.make_tensor_proto(dense))
        return lambda: np.asarray(stub.Predict(request).outputs["score"].float_val, dtype=np.float32)
    if protocol == "V2 gRPC raw":
        v2 = service_pb2_grpc.GRPCInferenceServiceStub(grpc.insecure_channel(server.grpc_url, GRPC_OPTIONS))
        infer = service_pb2.ModelInferRequest(model_name="deepfm")
        infer.inputs.add(name="sparse_ids", datatype="INT64", shape=list(ids.shape))
        infer.inputs.add(name="dense", datatype="FP32", shape=list(dense.shape))
        infer.raw_input_contents.extend([ids.tobytes(), dense.tobytes()])
        return lambda: np.frombuffer(v2.ModelInfer(infer).raw_output_contents[0], dtype=np.float32)
    if protocol.startswith("TFS REST"):
        path = "/v1/models/deepfm:predict"
        if protocol.endswith("columnar"):
            document: dict[str, Any] = {"inputs": {"sparse_ids": ids, "dense": dense}}
        else:
            document = {"instances": [{"sparse_ids": i, "dense": d} for i, d in zip(ids, dense)]}
        body = orjson.dumps(document, option=orjson.OPT_SERIALIZE_NUMPY)
        headers = {"Content-Type": "application/json"}
    else:
        path = "/v2/models/deepfm/infer"
        body, headers = v2_http_body(ids, dense, protocol == "V2 HTTP binary")
    connection = http.client.HTTPConnection(server.url)

    def call() -> np.ndarray:
        connection.request("POST", path, body, headers)
        response = connection.getresponse()
        content = response.read()
        if response.status != 200:
            raise RuntimeError(f"{protocol}: HTTP {response.status}: {content[:200]!r}")
        if protocol.startswith("TFS REST"):
            answer = orjson.loads(content)
            return np.asarray(answer.get("outputs", answer.get("predictions")), dtype=np.float32)
        length = response.getheader("Inference-Header-Content-Length")
        if length is None:
            return np.asarray(orjson.loads(content)["outputs"][0]["data"], dtype=np.float32)
        return np.frombuffer(content, dtype=np.float32, offset=int(length))

    return call


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--duration", type=float, default=5.0, help="seconds measured per cell (after --warmup)")
    parser.add_argument("--warmup", type=float, default=1.0)
    parser.add_argument("--rounds", type=int, default=3, help="rounds of every cell; the table shows medians")
    parser.add_argument("--protocols", default=",".join(PROTOCOLS),
                        help=f"comma-separated, of: {', '.join(PROTOCOLS)} (the ratios need the two V2 HTTP ones)")
    parser.add_argument("--json", type=Path, help="also write the raw results here")
    args = parser.parse_args()
    protocols = [p for p in PROTOCOLS if p in args.protocols.split(",")]
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    print(f"commit {commit.stdout.strip()}, {date.today()}, load average at start {os.getloadavg()}", flush=True)
    print(f"tensorflow {tf.__version__}, grpcio {grpc.__version__}", flush=True)
    repository = Path(tempfile.mkdtemp(prefix="modelhost-tfs-bench-"))
    path = write_model(repository)
    ids, dense = candidates()
    limit_ms, expected = limit(path, ids, dense)
    print(f"limit (in-process TF): p50 {limit_ms:.2f} ms", flush=True)
    server = ServerProcess(repository).wait_ready(timeout=120)
    rows = []
    try:
        for protocol in protocols:
            np.testing.assert_allclose(make_client(server, protocol, ids, dense)(), expected, rtol=1e-5, atol=1e-6)
        for round_ in range(args.rounds):
            # Each round starts one protocol later, so that no protocol always runs first after a change of c.
            order = protocols[round_ % len(protocols):] + protocols[:round_ % len(protocols)]
            for c in (1, 8):
                for protocol in order:
                    cpu_before = cpu_seconds(server.process.pid)
                    result = threaded([make_client(server, protocol, ids, dense) for _ in range(c)], args.warmup,
                                      args.duration)
                    server_cpu = (cpu_seconds(server.process.pid) - cpu_before) / result["total"] * 1e3
                    rows.append({"protocol": protocol, "c": c, "limit_p50_ms": limit_ms, **result,
                                 "server_cpu_ms": server_cpu, "round": round_})
                    print(f"round {round_ + 1} c={c} {protocol}: {result['rps']:.0f} req/s p50 {result['p50']:.2f} "
                          f"ms p99 {result['p99']:.2f} ms, server CPU {server_cpu:.2f} ms/req", flush=True)
    finally:
        server.stop()
    print(f"load average at end {os.getloadavg()}")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))
    print()
    print(table(rows))


def medians(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per (c, protocol): the median of each figure over the rounds."""
    cells: dict[tuple[int, str], list[dict[str, Any]]] = {}
    for row in rows:
        cells.setdefault((row["c"], row["protocol"]), []).append(row)
    return [{"c": c, "protocol": protocol, "limit_p50_ms": runs[0]["limit_p50_ms"],
             **{key: statistics.median(r[key] for r in runs) for key in ("rps", "p50", "p99", "server_cpu_ms")}}
            for (c, protocol), runs in sorted(cells.items(), key=lambda item: (item[0][0], PROTOCOLS.index(
                item[0][1])))]


def round_ratio(raw: list[dict[str, Any]], row: dict[str, Any], base: str) -> float:
    """The median over rounds of this cell's p50 / the `base` protocol's p50 in the same round (drift between
    rounds falls on both); nan without that protocol."""
    ratios = []
    for mine in (r for r in raw if (r["c"], r["protocol"]) == (row["c"], row["protocol"])):
        other = [r for r in raw if (r["c"], r["protocol"], r["round"]) == (row["c"], base, mine["round"])]
        if other:
            ratios.append(mine["p50"] / other[0]["p50"])
    return statistics.median(ratios) if ratios else float("nan")


def table(raw: list[dict[str, Any]]) -> str:
    lines = ["| c | protocol | req/s | p50 ms | p99 ms | p50 / limit | p50 / V2 HTTP binary | p50 / V2 JSON "
             "| server CPU ms/req |", "|---|---|---|---|---|---|---|---|---|"]
    for row in medians(raw):
        lines.append(f"| {row['c']} | {row['protocol']} | {row['rps']:.0f} | {row['p50']:.2f} | {row['p99']:.2f} | "
                     f"{row['p50'] / row['limit_p50_ms']:.2f}x | {round_ratio(raw, row, 'V2 HTTP binary'):.2f}x | "
                     f"{round_ratio(raw, row, 'V2 HTTP JSON'):.2f}x | {row['server_cpu_ms']:.2f} |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
