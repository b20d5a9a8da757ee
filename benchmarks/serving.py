"""Serving benchmark: modelhost and a minimal aiohttp peer vs in-process onnxruntime, one run.

    python benchmarks/serving.py [--duration 8] [--json results.json]

Needs wrk (Debian package `wrk`) and aiohttp (for the peer). Cases, from the foundation issue:
(a) `rank`, 500 rows x 1000 FP32 features (2 MB) per request, binary and JSON, concurrency 1 and 4;
(b) `tiny`, 1 row per request, JSON and binary, concurrency 1, 8 and 32.
Load comes from wrk (C, one Lua script for the POST body and headers): a Python load generator
tops out near 3,000 requests/s on 2 cores. The limit is onnxruntime called in-process on the same
inputs with the server's session options: `limit p50` is one call's median latency, `limit req/s`
is what N threads calling it back to back reach. wrk, the server and the limit share the machine's
cores, so read ratios, not absolute figures.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort
import orjson
import requests

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from modelhost.example_repository import ensure_example_repository  # noqa: E402
from tests.server import ServerProcess, free_port  # noqa: E402

LUA = ROOT / "benchmarks" / "wrk_post.lua"
PEER = ROOT / "benchmarks" / "peers" / "aiohttp_v2.py"
UNITS = {"us": 1e-3, "ms": 1.0, "s": 1e3}


def infer_body(name: str, array: np.ndarray, output: str, binary: bool) -> tuple[bytes, int | None]:
    tensor: dict = {"name": name, "datatype": "FP32", "shape": list(array.shape)}
    if not binary:
        tensor["data"] = array.reshape(-1)
        document = {"inputs": [tensor], "outputs": [{"name": output, "parameters": {"binary_data": False}}]}
        return orjson.dumps(document, option=orjson.OPT_SERIALIZE_NUMPY), None
    tensor["parameters"] = {"binary_data_size": array.nbytes}
    header = orjson.dumps({"inputs": [tensor], "outputs": [{"name": output, "parameters": {"binary_data": True}}]})
    return header + array.tobytes(), len(header)


def cases() -> list[dict]:
    rng = np.random.default_rng(0)
    rank = rng.standard_normal((500, 1000)).astype(np.float32)
    tiny = rng.standard_normal((1, 4)).astype(np.float32)
    table = []
    for binary in (True, False):
        for c in (1, 4):
            table.append({"model": "rank", "input": "features", "output": "score", "array": rank,
                          "binary": binary, "c": c})
    for binary in (True, False):
        for c in (1, 8, 32):
            table.append({"model": "tiny", "input": "x", "output": "y", "array": tiny, "binary": binary, "c": c})
    return table


def limit(repository: Path, case: dict, seconds: float) -> tuple[float, float]:
    """In-process onnxruntime: (p50 ms of one call, requests/s with `c` threads)."""
    options = ort.SessionOptions()
    options.intra_op_num_threads = os.cpu_count() or 1
    session = ort.InferenceSession(str(repository / case["model"] / "1" / "model.onnx"), options,
                                   providers=["CPUExecutionProvider"])
    feeds = {case["input"]: case["array"]}
    times = []
    for _ in range(200 if case["model"] == "rank" else 2000):
        start = time.perf_counter()
        session.run(None, feeds)
        times.append(time.perf_counter() - start)
    p50 = statistics.median(times) * 1e3
    counts = [0] * case["c"]
    deadline = time.perf_counter() + seconds

    def worker(i: int) -> None:
        while time.perf_counter() < deadline:
            session.run(None, feeds)
            counts[i] += 1

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(case["c"])]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return p50, sum(counts) / seconds


def wrk(url: str, body_file: Path, header_length: int | None, connections: int, seconds: float) -> dict:
    env = dict(os.environ, BODY_FILE=str(body_file), HEADER_LENGTH="" if header_length is None else str(header_length))
    threads = 1 if connections == 1 else 2
    base = ["wrk", f"-t{threads}", f"-c{connections}", "-s", str(LUA), "--latency", url]
    subprocess.run(base[:1] + ["-d1s"] + base[1:], env=env, capture_output=True, check=True)
    out = subprocess.run(base[:1] + [f"-d{int(seconds)}s"] + base[1:], env=env, capture_output=True, text=True,
                         check=True).stdout
    errors = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    if errors:
        raise RuntimeError(f"{errors.group(1)} failed responses from {url}:\n{out}")
    return {
        "rps": float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1)),
        "p50": _latency(out, "50%"),
        "p99": _latency(out, "99%"),
    }


def _latency(out: str, label: str) -> float:
    value, unit = re.search(rf"{label}\s+([\d.]+)(us|ms|s)", out).groups()
    return float(value) * UNITS[unit]


def check(url: str, body: bytes, header_length: int | None, expected: np.ndarray) -> None:
    headers = {} if header_length is None else {"Inference-Header-Content-Length": str(header_length)}
    response = requests.post(url, data=body, headers=headers, timeout=30)
    response.raise_for_status()
    length = response.headers.get("Inference-Header-Content-Length")
    if length is None:
        got = np.asarray(response.json()["outputs"][0]["data"], dtype=np.float32)
    else:
        got = np.frombuffer(response.content[int(length):], dtype=np.float32)
    np.testing.assert_allclose(got.reshape(expected.shape), expected, rtol=1e-4, atol=1e-5)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--duration", type=int, default=8, help="seconds per wrk run (after 1 s warm-up)")
    parser.add_argument("--json", type=Path, help="also write the raw results here")
    parser.add_argument("--no-peer", action="store_true", help="skip the aiohttp peer")
    args = parser.parse_args()

    workdir = Path(tempfile.mkdtemp(prefix="modelhost-bench-"))
    repository = ensure_example_repository(workdir / "cache")
    servers = {"modelhost": ServerProcess(repository).wait_ready()}
    peer = None
    if not args.no_peer:
        port = free_port()
        peer = subprocess.Popen([sys.executable, str(PEER), str(repository), str(port)])
        servers["aiohttp peer"] = _Peer(port)
    rows = []
    try:
        for case in cases():
            body, header_length = infer_body(case["input"], case["array"], case["output"], case["binary"])
            body_file = workdir / f"{case['model']}-{case['binary']}.body"
            body_file.write_bytes(body)
            session = ort.InferenceSession(str(repository / case["model"] / "1" / "model.onnx"),
                                           providers=["CPUExecutionProvider"])
            expected = session.run(None, {case["input"]: case["array"]})[0]
            p50_limit, rps_limit = limit(repository, case, min(args.duration, 3.0))
            row = {"model": case["model"], "encoding": "binary" if case["binary"] else "JSON", "c": case["c"],
                   "limit_p50_ms": p50_limit, "limit_rps": rps_limit, "body_bytes": len(body)}
            for label, server in servers.items():
                url = f"{server.base}/v2/models/{case['model']}/infer"
                check(url, body, header_length, expected)
                row[label] = wrk(url, body_file, header_length, case["c"], args.duration)
            rows.append(row)
            print(_line(row, list(servers)), flush=True)
    finally:
        servers["modelhost"].stop()
        if peer is not None:
            peer.terminate()
            peer.wait()
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))
    print()
    print(_table(rows, list(servers)))


class _Peer:
    def __init__(self, port: int) -> None:
        self.base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if requests.get(self.base + "/v2/health/ready", timeout=1).ok:
                    return
            except requests.ConnectionError:
                time.sleep(0.1)
        raise TimeoutError("aiohttp peer did not start")


def _line(row: dict, labels: list[str]) -> str:
    parts = [f"{row['model']} {row['encoding']} c={row['c']}: limit p50 {row['limit_p50_ms']:.3f} ms"]
    for label in labels:
        r = row[label]
        parts.append(f"{label} {r['rps']:.0f} req/s p50 {r['p50']:.2f} ms p99 {r['p99']:.2f} ms")
    return "; ".join(parts)


def _table(rows: list[dict], labels: list[str]) -> str:
    head = "| model | body | c | limit p50 ms | limit req/s |"
    rule = "|---|---|---|---|---|"
    for label in labels:
        head += f" {label} req/s | p50 ms | p99 ms | p50 / limit |"
        rule += "---|---|---|---|"
    lines = [head, rule]
    for row in rows:
        size = f"{row['encoding']} {row['body_bytes'] / 1e6:.2f} MB" if row["body_bytes"] > 1e5 else \
            f"{row['encoding']} {row['body_bytes']} B"
        line = f"| {row['model']} | {size} | {row['c']} | {row['limit_p50_ms']:.3f} | {row['limit_rps']:.0f} |"
        for label in labels:
            r = row[label]
            line += f" {r['rps']:.0f} | {r['p50']:.2f} | {r['p99']:.2f} | {r['p50'] / row['limit_p50_ms']:.1f}x |"
        lines.append(line)
    return "\n".join(lines)


if __name__ == "__main__":
    main()
