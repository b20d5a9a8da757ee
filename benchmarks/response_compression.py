"""What a compressed inference response costs: V2 infer answers sent as they are, gzip and deflate.

    python benchmarks/response_compression.py [--rounds 5] [--requests 300]

In process: the compression of typical answer bodies (`tiny` as JSON, `rank` x 500 as binary and as JSON, a
2 MB binary output), median microseconds. Through the server (the example repository, one keep-alive
http.client connection, concurrency 1, bodies built once): `rank` x 500 over HTTP binary and `tiny` as JSON,
with `Accept-Encoding` identity, gzip and deflate in turn each round; p50 and the server's CPU per request,
medians over rounds, and their ratios to identity's.
"""

from __future__ import annotations

import argparse
import gzip
import http.client
import statistics
import sys
import tempfile
import time
import timeit
import zlib
from pathlib import Path

import numpy as np
import orjson

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from modelhost.protocols.http.response_encoding import compressed  # noqa: E402
from tests.server import ServerProcess  # noqa: E402

CODINGS = ("identity", "gzip", "deflate")
INFLATE = {"identity": lambda body: body, "gzip": gzip.decompress, "deflate": zlib.decompress}


def answer_bodies(rng: np.random.Generator) -> dict[str, list[bytes]]:
    scores = rng.standard_normal(500).astype(np.float32)
    head = orjson.dumps({"model_name": "rank", "model_version": "1", "outputs": [
        {"name": "score", "datatype": "FP32", "shape": [500, 1], "parameters": {"binary_data_size": 2000}}]})
    as_json = orjson.dumps({"model_name": "rank", "model_version": "1", "outputs": [
        {"name": "score", "datatype": "FP32", "shape": [500, 1], "data": scores.tolist()}]})
    tiny = orjson.dumps({"model_name": "tiny", "model_version": "1", "outputs": [
        {"name": "y", "datatype": "FP32", "shape": [1, 4], "data": [3.0, 5.0, 7.0, 9.0]}]})
    embeddings = rng.standard_normal((500, 1024)).astype(np.float32)
    return {
        "tiny JSON (~100 B)": [tiny],
        "rank x 500 binary (2 KB)": [head, scores.tobytes()],
        "rank x 500 JSON (~10 KB)": [as_json],
        "500 x 1024 FP32 binary (2 MB)": [head, embeddings.tobytes()],
    }


def in_process(rng: np.random.Generator) -> None:
    print("| body | gzip µs | deflate µs | gzip size / size |")
    print("|---|---|---|---|")
    for name, parts in answer_bodies(rng).items():
        size = sum(map(len, parts))
        cells = []
        for coding in ("gzip", "deflate"):
            number = max(1, int(2e6 // max(size, 1000)))
            runs = timeit.repeat(lambda c=coding, p=parts: compressed(p, c), number=number, repeat=5)
            cells.append(f"{min(runs) / number * 1e6:.0f}")
        ratio = len(compressed(parts, "gzip")) / size
        print(f"| {name} | {cells[0]} | {cells[1]} | {ratio:.2f} |")


def server_cpu(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / 100.0  # utime + stime, clock ticks of 10 ms


def one_turn(connection: http.client.HTTPConnection, path: str, body: bytes, headers: dict[str, str],
             coding: str, count: int, pid: int) -> tuple[float, float]:
    latencies = []
    cpu_before = server_cpu(pid)
    for _ in range(count):
        begin = time.perf_counter()
        connection.request("POST", path, body, {**headers, "Accept-Encoding": coding})
        response = connection.getresponse()
        content = response.read()
        latencies.append(time.perf_counter() - begin)
        if response.status != 200 or response.getheader("Content-Encoding", "identity") != coding:
            raise RuntimeError(f"{coding}: HTTP {response.status}, {response.getheader('Content-Encoding')}")
        INFLATE[coding](content)
    return statistics.median(latencies) * 1e3, (server_cpu(pid) - cpu_before) / count * 1e3


def through_server(rounds: int, count: int, rng: np.random.Generator) -> None:
    server = ServerProcess(None, cache_dir=Path(tempfile.mkdtemp(prefix="modelhost-compression-"))).wait_ready()
    features = rng.standard_normal((500, 1000)).astype(np.float32)
    head = orjson.dumps({"inputs": [{"name": "features", "datatype": "FP32", "shape": [500, 1000],
                                     "parameters": {"binary_data_size": features.nbytes}}],
                         "outputs": [{"name": "score", "parameters": {"binary_data": True}}]})
    cases = {
        "rank x 500, HTTP binary": ("/v2/models/rank/infer", head + features.tobytes(),
                                    {"Inference-Header-Content-Length": str(len(head))}),
        "tiny, JSON": ("/v2/models/tiny/infer", orjson.dumps({"inputs": [
            {"name": "x", "datatype": "FP32", "shape": [1, 4], "data": [1, 2, 3, 4]}]}), {}),
    }
    try:
        pid = server.process.pid
        connection = http.client.HTTPConnection(server.url)
        print("\n| request | coding | p50 ms | server CPU ms/req | p50 / identity | CPU / identity |")
        print("|---|---|---|---|---|---|")
        for case, (path, body, headers) in cases.items():
            one_turn(connection, path, body, headers, "identity", count // 3, pid)  # warm-up
            figures: dict[str, list[tuple[float, float]]] = {coding: [] for coding in CODINGS}
            for turn in range(rounds):
                for coding in CODINGS[turn % 3:] + CODINGS[:turn % 3]:
                    figures[coding].append(one_turn(connection, path, body, headers, coding, count, pid))
            base_p50 = statistics.median(p50 for p50, _ in figures["identity"])
            base_cpu = statistics.median(cpu for _, cpu in figures["identity"])
            for coding in CODINGS:
                p50 = statistics.median(value for value, _ in figures[coding])
                cpu = statistics.median(value for _, value in figures[coding])
                print(f"| {case} | {coding} | {p50:.3f} | {cpu:.3f} | {p50 / base_p50:.2f}x | {cpu / base_cpu:.2f}x |")
    finally:
        server.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--requests", type=int, default=300, help="requests per coding per round")
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    in_process(rng)
    through_server(args.rounds, args.requests, rng)


if __name__ == "__main__":
    main()
