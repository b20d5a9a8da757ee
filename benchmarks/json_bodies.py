"""Whole JSON (and SageMaker CSV) request bodies decoded in-process: the working tree against a base revision.

    python benchmarks/json_bodies.py [--base REV] [--rounds 5] [--repeat 7]

What a front-end spends turning a JSON body into input arrays (parse and convert, no HTTP, no model): the
recommender request (500 candidates: `sparse_ids` INT64 [500, 26] and `dense` FP32 [500, 13]) as KServe V2 JSON
(flat `data`, as tritonclient sends it, and nested), as TF Serving REST (columnar `inputs`, row `instances` of
objects), as SageMaker JSON bodies (bare rows, a V2 request) and as SageMaker CSV (`dense`'s 500 lines; one line of
256 values, the multi-model benchmark's request); and a small V2 request (16 FP32) for what a body too small for the
fast way pays. Every case is built once and checked to decode to the same arrays in both builds.

The base runs from a `git worktree` of REV, in a process of its own (PYTHONPATH, PYTHONSAFEPATH), the working tree
in another; the two take turns for --rounds rounds, so a drift of the shared machine falls on both. Each round,
each case: the minimum over --repeat timings of a batch of calls. The table: each build's median over rounds and
the median of the per-round ratios new / base.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import timeit
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import orjson

ROOT = Path(__file__).resolve().parent.parent


def bodies() -> dict[str, tuple[str, bytes]]:
    """Case -> (decoder, body)."""
    rng = np.random.default_rng(0)
    ids = rng.integers(0, 200_000, (500, 26))
    dense = rng.random((500, 13), dtype=np.float32)

    def v2(nested: bool) -> bytes:
        tensors = [("sparse_ids", "INT64", ids), ("dense", "FP32", dense)]
        return orjson.dumps({"inputs": [
            {"name": n, "datatype": t, "shape": list(a.shape), "data": a if nested else a.reshape(-1)}
            for n, t, a in tensors]}, option=orjson.OPT_SERIALIZE_NUMPY)

    columnar = {"inputs": {"sparse_ids": ids, "dense": dense}}
    rows = {"instances": [{"sparse_ids": i, "dense": d} for i, d in zip(ids, dense)]}
    small = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 16], "data": list(range(16))}]}
    wide = rng.random((1, 256), dtype=np.float32)
    numpy = orjson.OPT_SERIALIZE_NUMPY
    return {
        "V2 JSON, flat data": ("v2", v2(nested=False)),
        "V2 JSON, nested data": ("v2", v2(nested=True)),
        "TF Serving REST, columnar": ("tfs", orjson.dumps(columnar, option=numpy)),
        "TF Serving REST, row objects": ("tfs", orjson.dumps(rows, option=numpy)),
        "SageMaker JSON, bare rows (dense only)": ("sagemaker", orjson.dumps(dense, option=numpy)),
        "SageMaker JSON, a V2 request": ("sagemaker-v2", v2(nested=False)),
        "SageMaker CSV, 500 lines (dense only)": ("sagemaker-csv", csv_lines(dense)),
        "SageMaker CSV, one line of 256 values": ("sagemaker-csv-wide", csv_lines(wide)),
        "V2 JSON, 16 values (small body)": ("v2", orjson.dumps(small)),
    }


def csv_lines(rows: np.ndarray) -> bytes:
    return "".join(",".join(repr(float(value)) for value in row) + "\n" for row in rows).encode()


def decoder(kind: str) -> Callable[[bytes], dict[str, np.ndarray]]:
    from modelhost.protocols.kserve_v2.codec import decode_infer_request
    from modelhost.protocols.sagemaker.payloads import decode_invocation
    from modelhost.protocols.tfserving.json_codec import decode_predict
    from modelhost.types import TensorSpec

    specs = [TensorSpec("sparse_ids", "INT64", (-1, 26)), TensorSpec("dense", "FP32", (-1, 13))]
    if kind == "v2":
        return lambda body: decode_infer_request(body, None, "m").inputs
    if kind == "tfs":
        return lambda body: decode_predict(body, specs)[0]
    if kind == "sagemaker-v2":
        return lambda body: decode_invocation(body, "application/json", specs).request.inputs
    if kind == "sagemaker-csv-wide":
        wide = [TensorSpec("x", "FP32", (-1, 256))]
        return lambda body: decode_invocation(body, "text/csv", wide).request.inputs
    dense = [TensorSpec("dense", "FP32", (-1, 13))]
    if kind == "sagemaker-csv":
        return lambda body: decode_invocation(body, "text/csv", dense).request.inputs
    return lambda body: decode_invocation(body, "application/json", dense).request.inputs


def measure(repeat: int) -> dict[str, Any]:
    """This process's modelhost on every case: µs per call and a digest of the arrays."""
    results = {}
    for name, (kind, body) in bodies().items():
        decode = decoder(kind)
        arrays = decode(body)
        digest = hashlib.sha256(b"".join(name.encode() + a.dtype.str.encode() + str(a.shape).encode() + a.tobytes()
                                         for name, a in sorted(arrays.items()))).hexdigest()
        calls = 20 if len(body) > 10_000 else 2_000
        best = min(timeit.repeat(lambda decode=decode, body=body: decode(body), number=calls, repeat=repeat))
        results[name] = {"us": best / calls * 1e6, "digest": digest}
    return results


def run_build(source: Path, repeat: int) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": str(source), "PYTHONSAFEPATH": "1"}
    script = Path(__file__).resolve()
    answer = subprocess.run([sys.executable, str(script), "--measure", "--repeat", str(repeat)], env=env,
                            cwd=tempfile.gettempdir(), check=True, capture_output=True, text=True)
    return json.loads(answer.stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base", default="HEAD~1", help="the git revision to compare the working tree with")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--measure", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure:
        print(json.dumps(measure(args.repeat)))
        return
    with tempfile.TemporaryDirectory(prefix="json-bodies-base-") as directory:
        base_tree = Path(directory) / "base"
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", "-q", str(base_tree), args.base],
                       check=True)
        try:
            rounds = []
            for round_ in range(args.rounds):
                order = [("base", base_tree), ("new", ROOT)]
                if round_ % 2:
                    order.reverse()
                rounds.append({build: run_build(source, args.repeat) for build, source in order})
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(base_tree)], check=True)
    print(f"| case | base ({args.base}) µs | new µs | new / base |\n|---|---|---|---|")
    for name in bodies():
        for result in rounds:
            assert result["base"][name]["digest"] == result["new"][name]["digest"], f"{name}: the arrays differ"
        base = statistics.median(r["base"][name]["us"] for r in rounds)
        new = statistics.median(r["new"][name]["us"] for r in rounds)
        ratio = statistics.median(r["new"][name]["us"] / r["base"][name]["us"] for r in rounds)
        print(f"| {name} | {base:.0f} | {new:.0f} | {ratio:.2f}x |")


if __name__ == "__main__":
    main()
