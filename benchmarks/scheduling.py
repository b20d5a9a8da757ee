"""Scheduler benchmark: dynamic batching off vs on, request splitting off vs on, one run.

    python benchmarks/scheduling.py [--duration 8]

Needs wrk and aiohttp. Cases, from the scheduler issue:
(a) `tiny`, 1 row per JSON request, concurrency 1, 8, 32, 128: modelhost without and with
    `dynamic_batching {}`, in 1 and 2 worker processes, by default (tiny runs on the event loop) and
    with `inline_max_microseconds 0` (always on instance threads, so batches form),
    against the naive baseline (benchmarks/peers/aiohttp_v2.py inline: one process, onnxruntime
    on the event loop, no batching) and in-process onnxruntime;
(b) `rank`, 500 rows per binary request, concurrency 1 and 8: one instance with 2 threads (no
    split) against 2 instances with 1 thread each and `request_split_size` 250 or 125.
Every server's answers are checked against onnxruntime before they are timed.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import onnxruntime as ort

sys.path.insert(0, str(Path(__file__).resolve().parent))
from serving import ROOT, _Peer, check, infer_body, limit, wrk  # noqa: E402

from modelhost.example_repository import ensure_example_repository  # noqa: E402
from tests.server import ServerProcess, free_port  # noqa: E402

PEER = ROOT / "benchmarks" / "peers" / "aiohttp_v2.py"
THREADS_ONLY = 'parameters { key: "inline_max_microseconds" value: { string_value: "0" } }'


def variant(base: Path, workdir: Path, name: str, model: str, extra: str, instances: int | None = None) -> Path:
    """A copy of the example repository with `extra` appended to one model's config."""
    target = workdir / name
    shutil.copytree(base, target)
    config = target / model / "config.pbtxt"
    text = config.read_text()
    if instances is not None:
        text = text.replace("count: 1", f"count: {instances}")
    config.write_text(text + extra + "\n")
    return target


def split(rows: int) -> str:
    return f'parameters {{ key: "request_split_size" value: {{ string_value: "{rows}" }} }}'


def run_case(label: str, url: str, body_file: Path, header_length: int | None, body: bytes, expected: np.ndarray,
             connections: int, seconds: int) -> dict:
    check(url, body, header_length, expected)
    result = wrk(url, body_file, header_length, connections, seconds)
    print(f"{label} c={connections}: {result['rps']:.0f} req/s p50 {result['p50']:.2f} ms p99 {result['p99']:.2f} ms",
          flush=True)
    return result


def tiny_cases(base: Path, workdir: Path, rng: np.random.Generator, duration: int,
        rows: list[tuple[str, int, dict]]) -> None:
    tiny = rng.standard_normal((1, 4)).astype(np.float32)
    tiny_body, _ = infer_body("x", tiny, "y", binary=False)
    tiny_file = workdir / "tiny.json"
    tiny_file.write_bytes(tiny_body)
    tiny_expected = ort.InferenceSession(str(base / "tiny/1/model.onnx")).run(None, {"x": tiny})[0]
    servers = {
        "modelhost, no batching": ServerProcess(base),
        "modelhost, dynamic_batching": ServerProcess(
            variant(base, workdir, "batching", "tiny", "dynamic_batching { }")),
        "modelhost, dynamic_batching, threads only": ServerProcess(
            variant(base, workdir, "threads", "tiny", "dynamic_batching { } " + THREADS_ONLY)),
        "modelhost --workers 2, dynamic_batching": ServerProcess(
            workdir / "batching", "--workers", "2", "--metrics-port", "0"),
        "modelhost --workers 2, dynamic_batching, threads only": ServerProcess(
            workdir / "threads", "--workers", "2", "--metrics-port", "0"),
    }
    port = free_port()
    naive = subprocess.Popen([sys.executable, str(PEER), str(base), str(port), "inline"])
    try:
        for server in servers.values():
            server.wait_ready()
        targets = {label: f"{s.base}/v2/models/tiny/infer" for label, s in servers.items()}
        targets["naive aiohttp (inline)"] = f"{_Peer(port).base}/v2/models/tiny/infer"
        for c in (1, 8, 32, 128):
            p50, rps = limit(base, {"model": "tiny", "input": "x", "array": tiny, "c": min(c, 8)}, 2.0)
            print(f"tiny limit c={c}: p50 {p50 * 1e3:.1f} us, {rps:.0f} req/s (threads {min(c, 8)})")
            for label, url in targets.items():
                rows.append((f"tiny JSON, {label}", c, run_case(label, url, tiny_file, None, tiny_body, tiny_expected,
                                                                c, duration)))
    finally:
        for server in servers.values():
            server.stop()
        naive.terminate()
        naive.wait()


def rank_cases(base: Path, workdir: Path, rng: np.random.Generator, duration: int,
        rows: list[tuple[str, int, dict]]) -> None:
    rank = rng.standard_normal((500, 1000)).astype(np.float32)
    rank_body, rank_header = infer_body("features", rank, "score", binary=True)
    rank_file = workdir / "rank.body"
    rank_file.write_bytes(rank_body)
    rank_expected = ort.InferenceSession(str(base / "rank/1/model.onnx")).run(None, {"features": rank})[0]
    splits = {
        "1 instance x 2 threads, no split": base,
        "2 instances x 1 thread, split 250": variant(base, workdir, "split250", "rank", split(250), instances=2),
        "2 instances x 1 thread, split 125": variant(base, workdir, "split125", "rank", split(125), instances=2),
        "2 instances x 1 thread, no split": variant(base, workdir, "two", "rank", "", instances=2),
    }
    for label, repository in splits.items():
        server = ServerProcess(repository).wait_ready()
        try:
            for c in (1, 8):
                url = f"{server.base}/v2/models/rank/infer"
                rows.append((f"rank binary, {label}", c, run_case(label, url, rank_file, rank_header, rank_body,
                                                                  rank_expected, c, duration)))
        finally:
            server.stop()
    for c in (1, 8):
        p50, rps = limit(base, {"model": "rank", "input": "features", "array": rank, "c": c}, 3.0)
        print(f"rank limit c={c}: p50 {p50:.3f} ms, {rps:.0f} req/s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--duration", type=int, default=8)
    parser.add_argument("--cases", default="tiny,rank", help="which of tiny, rank to run (comma-separated)")
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="modelhost-sched-"))
    base = ensure_example_repository(workdir / "cache")
    rng = np.random.default_rng(0)
    rows: list[tuple[str, int, dict]] = []
    cases = args.cases.split(",")
    if "tiny" in cases:
        tiny_cases(base, workdir, rng, args.duration, rows)
    if "rank" in cases:
        rank_cases(base, workdir, rng, args.duration, rows)
    print("\n| case | c | req/s | p50 ms | p99 ms |\n|---|---|---|---|---|")
    for label, c, r in rows:
        print(f"| {label} | {c} | {r['rps']:.0f} | {r['p50']:.2f} | {r['p99']:.2f} |")


if __name__ == "__main__":
    main()
