"""BYTES tensors on the wire (Triton's 4-byte length prefix per element): the working tree against a base revision.

    python benchmarks/bytes_tensors.py [--base REV] [--repeat 7] [--requests 300] [--server-base]

In process: reading a tensor's wire bytes into elements (`tensor_from_bytes`: HTTP binary, gRPC raw contents,
shared memory), writing them (`tensor_to_bytes`) and the response's size check (`check_output_bytes`), for the
recommender's string ids (500 candidates x 26 fields of 8 bytes), 500 sentences of 20-200 bytes, and a million
ids. The base's `codec.py` and `signature.py` are loaded from `git show REV:...` beside the working tree's (the
rest of modelhost is the working tree's); each figure is the minimum over --repeat timings, answers checked
equal. Then through a server of the working tree (and with --server-base one of the base, after it): an ONNX
string identity model sent the 13,000 ids over HTTP binary at concurrency 1 (p50 and the server's CPU a request).
"""

from __future__ import annotations

import argparse
import http.client
import importlib.util
import statistics
import subprocess
import sys
import tempfile
import time
import timeit
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import onnx
import orjson
from onnx import TensorProto, helper

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from modelhost.core import signature as new_signature  # noqa: E402
from modelhost.protocols.kserve_v2 import codec as new_codec  # noqa: E402
from tests.server import ServerProcess  # noqa: E402


def base_module(revision: str, path: str, name: str) -> ModuleType:
    source = subprocess.run(["git", "-C", str(ROOT), "show", f"{revision}:{path}"],
                            check=True, capture_output=True, text=True).stdout
    file = Path(tempfile.mkdtemp(prefix="bytes-tensors-")) / f"{name}.py"
    file.write_text(source)
    spec = importlib.util.spec_from_file_location(name, file)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # its dataclasses look themselves up there
    spec.loader.exec_module(module)
    return module


def cases() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)

    def objects(items: list[bytes]) -> np.ndarray:
        array = np.empty(len(items), dtype=object)
        array[:] = items
        return array

    sentences = [rng.integers(97, 123, int(size), dtype=np.uint8).tobytes() for size in rng.integers(20, 201, 500)]
    return {
        "500 x 26 ids, 8 bytes": objects([b"%08d" % i for i in rng.integers(0, 10**8, 13_000)]).reshape(500, 26),
        "500 sentences, 20-200 bytes": objects(sentences),
        "1,000,000 ids, 8 bytes": objects([b"%08d" % i for i in rng.integers(0, 10**8, 1_000_000)]),
    }


def best_ms(function: Any, repeat: int, calls: int) -> float:
    return min(timeit.repeat(function, number=calls, repeat=repeat)) / calls * 1e3


def in_process(base_revision: str, repeat: int) -> None:
    base_codec = base_module(base_revision, "modelhost/protocols/kserve_v2/codec.py", "codec_base")
    base_signature = base_module(base_revision, "modelhost/core/signature.py", "signature_base")
    print(f"| tensor | step | base ms | new ms | new / base |  (base {base_revision})")
    print("|---|---|---|---|---|")
    for label, array in cases().items():
        compare(label, array, base_codec, base_signature, repeat)


def compare(label: str, array: np.ndarray, base_codec: ModuleType, base_signature: ModuleType, repeat: int) -> None:
    calls = 1 if array.size >= 100_000 else 20
    wire = new_codec.tensor_to_bytes(array)
    assert wire == base_codec.tensor_to_bytes(array)
    shape, view = array.shape, memoryview(wire)
    steps = {
        "read (tensor_from_bytes)": (lambda: base_codec.tensor_from_bytes("x", "BYTES", shape, view),
                                     lambda: new_codec.tensor_from_bytes("x", "BYTES", shape, view)),
        "write (tensor_to_bytes)": (lambda: base_codec.tensor_to_bytes(array),
                                    lambda: new_codec.tensor_to_bytes(array)),
        "size check (check_output_bytes)": (lambda: base_signature.check_output_bytes({"y": array}, 1 << 30),
                                            lambda: new_signature.check_output_bytes({"y": array}, 1 << 30)),
    }
    read_base, read_new = steps["read (tensor_from_bytes)"]
    assert read_base().tolist() == read_new().tolist() == array.tolist()
    for step, (base, new) in steps.items():
        base_ms, new_ms = best_ms(base, repeat, calls), best_ms(new, repeat, calls)
        print(f"| {label} | {step} | {base_ms:.2f} | {new_ms:.2f} | {new_ms / base_ms:.2f}x |")


def string_identity(repository: Path) -> None:
    version = repository / "strings" / "1"
    version.mkdir(parents=True)
    graph = helper.make_graph([helper.make_node("Identity", ["ids"], ["same"])], "strings",
                              [helper.make_tensor_value_info("ids", TensorProto.STRING, ["batch", 26])],
                              [helper.make_tensor_value_info("same", TensorProto.STRING, ["batch", 26])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(version / "model.onnx"))
    (repository / "strings" / "config.pbtxt").write_text(
        'platform: "onnxruntime_onnx"\nmax_batch_size: 1000\n'
        'input [{ name: "ids" data_type: TYPE_STRING dims: [ 26 ] }]\n'
        'output [{ name: "same" data_type: TYPE_STRING dims: [ 26 ] }]\n')


def server_cpu(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / 100.0


def through_server(requests: int, build: str, env: dict[str, str]) -> None:
    repository = Path(tempfile.mkdtemp(prefix="bytes-tensors-repo-"))
    string_identity(repository)
    ids = next(iter(cases().values()))
    data = new_codec.tensor_to_bytes(ids)
    header = orjson.dumps({"inputs": [{"name": "ids", "datatype": "BYTES", "shape": [500, 26],
                                       "parameters": {"binary_data_size": len(data)}}],
                           "outputs": [{"name": "same", "parameters": {"binary_data": True}}]})
    headers = {"Inference-Header-Content-Length": str(len(header)), "Accept-Encoding": "identity"}
    server = ServerProcess(repository, cache_dir=Path(tempfile.mkdtemp(prefix="bytes-tensors-cache-")),
                           env=env).wait_ready()
    try:
        connection = http.client.HTTPConnection(server.url)
        latencies = []
        for index in range(requests + 30):
            if index == 30:
                cpu_before = server_cpu(server.process.pid)
            begin = time.perf_counter()
            connection.request("POST", "/v2/models/strings/infer", header + data, headers)
            response = connection.getresponse()
            body = response.read()
            if response.status != 200:
                raise RuntimeError(f"HTTP {response.status}: {body[:200]!r}")
            if index >= 30:
                latencies.append(time.perf_counter() - begin)
        cpu_ms = (server_cpu(server.process.pid) - cpu_before) / requests * 1e3
        length = int(response.getheader("Inference-Header-Content-Length"))
        assert body[length:] == data
        print(f"through a server of {build}, 500 x 26 ids over HTTP binary, c=1, {requests} requests: "
              f"p50 {statistics.median(latencies) * 1e3:.2f} ms, server CPU {cpu_ms:.2f} ms a request")
    finally:
        server.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base", default="HEAD", help="the revision to compare with (default HEAD)")
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--server-base", action="store_true", help="also measure a server of the base revision")
    args = parser.parse_args()
    in_process(args.base, args.repeat)
    print()
    through_server(args.requests, "the working tree", {})
    if args.server_base:  # the base's server from a worktree of it, first on the path (as benchmarks/builds.py)
        worktree = Path(tempfile.mkdtemp(prefix="bytes-tensors-base-")) / "tree"
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(worktree), args.base],
                       check=True, capture_output=True)
        try:
            through_server(args.requests, args.base, {"PYTHONPATH": str(worktree), "PYTHONSAFEPATH": "1"})
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(worktree)], check=True)


if __name__ == "__main__":
    main()
