"""First-request latency of a freshly loaded model, with and without `model_warmup`, one run.

    python benchmarks/warmup.py [--model rank] [--starts 10] [--steady 200] [--idle 5] [--warmup-count 2]
                                [--batch 1] [--json out.json]

From issue 6: Triton's model_warmup runs before a model reports ready, so that the first request costs what
later ones do. Two repositories hold the same model, one with a `model_warmup` block (zero data, the
request's batch size, --warmup-count runs) and one without. Each of --starts rounds starts a fresh
`modelhost serve` on each repository in turn (which goes first alternates). On each server, once
/v2/health/ready answers 200: one keep-alive HTTP connection (opened by a GET of the model's ready route);
the first infer request, timed end to end, with its compute time on the server (the statistics extension's
compute_infer, read before and after); --steady more requests back to back; then --idle requests, each
after a 100 ms pause. The pause gives the baseline warmup cannot beat: the first request also comes to a
server that sat idle, and after a pause onnxruntime's intra-op threads (no spinning) wake up and caches are
cold, so a run costs several times a back-to-back one. Reported: p50 over starts of the first request and
of its compute, p50 of the steady and after-idle requests, the ratios first/steady and first/after-idle,
the first request without warmup over with it, start-to-ready time, and what the server logged its warmup
runs took (they move the first request's cost into the load).
Requests use the binary tensor extension with fixed random data (ids inside deepfm's vocabulary).

Models: `tiny`, `rank`, `deepfm` (ONNX, the example repository) and `torch_mlp` (a TorchScript MLP shaped
as `rank`, 1000 -> 256 -> 64 -> 1, written here; needs the pytorch backend, modelhost/backends/torch.py).
TorchScript's profiling executor records shapes on the first run and optimizes on the second, hence the
default of 2 warmup runs. Client and server share the machine's cores: read ratios, not absolute figures.
"""

from __future__ import annotations

import argparse
import http.client
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from datetime import date
from pathlib import Path

import numpy as np
import orjson

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from modelhost.config.datatypes import v2_datatype  # noqa: E402
from modelhost.config.pbtxt import read_config  # noqa: E402
from modelhost.example_repository import DEEPFM_VOCAB, write_example_repository  # noqa: E402
from tests.server import ServerProcess  # noqa: E402

ONNX_MODELS = ("tiny", "rank", "deepfm")
VARIANTS = ("without warmup", "with warmup")
IDLE_PAUSE_S = 0.1
TORCH_CONFIG = """name: "torch_mlp"
platform: "pytorch_libtorch"
max_batch_size: 1024
input [ { name: "INPUT__0" data_type: TYPE_FP32 dims: [ 1000 ] } ]
output [ { name: "OUTPUT__0" data_type: TYPE_FP32 dims: [ 1 ] } ]
instance_group [ { count: 1 kind: KIND_CPU } ]
"""


@dataclass(frozen=True)
class Tensor:
    name: str
    datatype: str  # V2 name
    dims: tuple[int, ...]


@dataclass
class Measurement:
    ready_s: float  # server start to /v2/health/ready
    first_s: float  # first infer, client end to end
    first_compute_s: float  # its compute_infer on the server
    steady_s: list[float]
    steady_compute_s: float  # mean compute_infer over the steady requests
    idle_s: list[float]  # requests after an idle pause, each preceded (as the first) by a GET of the stats
    idle_compute_s: list[float]
    warmup_s: float  # what the server logged its warmup runs took (0 without)


def write_model(model: str, dest: Path) -> list[Tensor]:
    """Write `model` as dest/<model>/{config.pbtxt,1/...}; return its inputs."""
    if model == "torch_mlp":
        return write_torch_mlp(dest)
    everything = dest.parent / "example"
    if not everything.exists():
        write_example_repository(everything)
    shutil.copytree(everything / model, dest / model)
    config = read_config(dest / model)
    assert config is not None
    return [Tensor(t.name, v2_datatype(t.data_type), tuple(t.dims)) for t in config.input]


def write_torch_mlp(dest: Path) -> list[Tensor]:
    if importlib.util.find_spec("modelhost.backends.torch") is None:
        raise SystemExit("torch_mlp needs the pytorch backend (modelhost/backends/torch.py), which is not there yet")
    import torch

    torch.manual_seed(0)
    layers = torch.nn.Sequential(torch.nn.Linear(1000, 256), torch.nn.ReLU(), torch.nn.Linear(256, 64),
                                 torch.nn.ReLU(), torch.nn.Linear(64, 1), torch.nn.Sigmoid())
    (dest / "torch_mlp" / "1").mkdir(parents=True)
    torch.jit.script(layers.eval()).save(str(dest / "torch_mlp" / "1" / "model.pt"))
    (dest / "torch_mlp" / "config.pbtxt").write_text(TORCH_CONFIG)
    return [Tensor("INPUT__0", "FP32", (1000,))]


def config_name(datatype: str) -> str:
    return "TYPE_STRING" if datatype == "BYTES" else f"TYPE_{datatype}"


def warmup_block(inputs: list[Tensor], batch: int, count: int) -> str:
    entries = ",\n".join(
        f'    {{ key: "{t.name}" value: {{ data_type: {config_name(t.datatype)} '
        f'dims: [ {", ".join(map(str, t.dims))} ] zero_data: true }} }}' for t in inputs)
    return f'model_warmup [ {{ name: "zeros" batch_size: {batch} count: {count} inputs [\n{entries}\n  ] }} ]\n'


def request_body(inputs: list[Tensor], batch: int) -> tuple[bytes, dict[str, str]]:
    """A V2 infer request with the binary tensor extension; deepfm's ids stay inside its vocabulary."""
    rng = np.random.default_rng(0)
    tensors, data = [], []
    for t in inputs:
        shape = (batch, *t.dims)
        array = (rng.integers(0, DEEPFM_VOCAB, shape) if t.datatype == "INT64" else rng.random(shape))
        raw = array.astype(np.int64 if t.datatype == "INT64" else np.float32).tobytes()
        tensors.append({"name": t.name, "datatype": t.datatype, "shape": list(shape),
                        "parameters": {"binary_data_size": len(raw)}})
        data.append(raw)
    header = orjson.dumps({"inputs": tensors})
    return header + b"".join(data), {"Inference-Header-Content-Length": str(len(header))}


def compute(connection: http.client.HTTPConnection, model: str) -> tuple[int, int]:
    """(count, ns) of the model's compute_infer so far."""
    stats = get(connection, f"/v2/models/{model}/stats")
    duration = stats["model_stats"][0]["inference_stats"]["compute_infer"]
    return int(duration["count"]), int(duration["ns"])


def get(connection: http.client.HTTPConnection, path: str) -> dict:
    connection.request("GET", path)
    response = connection.getresponse()
    content = response.read()
    if response.status != 200:
        raise RuntimeError(f"GET {path} answered {response.status}: {content[:200]!r}")
    return orjson.loads(content) if content else {}


def infer(connection: http.client.HTTPConnection, model: str, body: bytes, headers: dict[str, str]) -> float:
    started = time.perf_counter()
    connection.request("POST", f"/v2/models/{model}/infer", body, headers)
    response = connection.getresponse()
    content = response.read()
    elapsed = time.perf_counter() - started
    if response.status != 200:
        raise RuntimeError(f"infer answered {response.status}: {content[:300]!r}")
    return elapsed


def measure(repository: Path, model: str, body: bytes, headers: dict[str, str], steady: int,
            idle_requests: int) -> Measurement:
    started = time.perf_counter()
    server = ServerProcess(repository).wait_ready(timeout=120)
    ready = time.perf_counter() - started
    try:
        connection = http.client.HTTPConnection(server.url)
        get(connection, f"/v2/models/{model}/ready")
        count0, ns0 = compute(connection, model)  # warmup may or may not be counted: take differences
        first = infer(connection, model, body, headers)
        count1, ns1 = compute(connection, model)
        assert count1 == count0 + 1, f"compute count went from {count0} to {count1} for one request"
        later = [infer(connection, model, body, headers) for _ in range(steady)]
        count2, ns2 = compute(connection, model)
        idle, idle_compute = [], []
        for _ in range(idle_requests):
            time.sleep(IDLE_PAUSE_S)
            before = compute(connection, model)[1]
            idle.append(infer(connection, model, body, headers))
            idle_compute.append((compute(connection, model)[1] - before) / 1e9)
        connection.close()
    finally:
        log = server.stop()
    if "Traceback" in log:
        raise RuntimeError(f"the server logged an exception:\n{log}")
    warmup = sum(float(ms) for ms in re.findall(r"warmup run\(s\) took ([\d.]+) ms", log)) / 1e3
    return Measurement(ready, first, (ns1 - ns0) / 1e9, later, (ns2 - ns1) / 1e9 / max(count2 - count1, 1),
                       idle, idle_compute, warmup)


def p50_ms(values: list[float]) -> float:
    return float(np.median(values)) * 1e3


def summarize(runs: dict[str, list[Measurement]]) -> dict[str, dict[str, float]]:
    """Per variant: p50s over starts (first request, ready, warmup) and over all steady and after-idle requests."""
    rows = {}
    for variant, ms in runs.items():
        r = {
            "ready_ms": p50_ms([m.ready_s for m in ms]), "warmup_ms": p50_ms([m.warmup_s for m in ms]),
            "first_ms": p50_ms([m.first_s for m in ms]), "first_compute_ms": p50_ms([m.first_compute_s for m in ms]),
            "steady_ms": p50_ms([s for m in ms for s in m.steady_s]),
            "steady_compute_ms": p50_ms([m.steady_compute_s for m in ms]),
            "idle_ms": p50_ms([s for m in ms for s in m.idle_s]),
            "idle_compute_ms": p50_ms([s for m in ms for s in m.idle_compute_s]),
        }
        for base in ("steady", "idle"):
            r[f"first_over_{base}"] = r["first_ms"] / r[f"{base}_ms"]
            r[f"compute_first_over_{base}"] = r["first_compute_ms"] / r[f"{base}_compute_ms"]
        rows[variant] = r
    return rows


def table(model: str, rows: dict[str, dict[str, float]]) -> str:
    lines = [f"| {model} | start to ready ms (warmup) | first request ms (compute) | steady ms (compute) "
             "| after idle ms (compute) | first / steady (compute) | first / after idle (compute) |",
             "|---|---|---|---|---|---|---|"]
    for variant, r in rows.items():
        lines.append(f"| {variant} | {r['ready_ms']:.0f} ({r['warmup_ms']:.1f}) | "
                     f"{r['first_ms']:.3f} ({r['first_compute_ms']:.3f}) | "
                     f"{r['steady_ms']:.3f} ({r['steady_compute_ms']:.3f}) | "
                     f"{r['idle_ms']:.3f} ({r['idle_compute_ms']:.3f}) | "
                     f"{r['first_over_steady']:.2f}x ({r['compute_first_over_steady']:.2f}x) | "
                     f"{r['first_over_idle']:.2f}x ({r['compute_first_over_idle']:.2f}x) |")
    without, with_ = rows[VARIANTS[0]], rows[VARIANTS[1]]
    lines.append(f"\nfirst request without warmup / with: {without['first_ms'] / with_['first_ms']:.2f}x end to end, "
                 f"{without['first_compute_ms'] / with_['first_compute_ms']:.2f}x compute; start to ready with / "
                 f"without: {with_['ready_ms'] / without['ready_ms']:.2f}x")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", choices=[*ONNX_MODELS, "torch_mlp"], default="rank")
    parser.add_argument("--starts", type=int, default=10, help="fresh server starts per variant")
    parser.add_argument("--steady", type=int, default=200, help="requests after the first, per start")
    parser.add_argument("--idle", type=int, default=5,
                        help=f"requests after {IDLE_PAUSE_S * 1e3:.0f} ms pauses, per start (the baseline of a first "
                        "request to a warm model that has sat idle)")
    parser.add_argument("--batch", type=int, default=1, help="rows per request, and the warmup's batch_size")
    parser.add_argument("--warmup-count", type=int, default=2, help="the warmup sample's count")
    parser.add_argument("--json", type=Path, help="also write every measurement here")
    args = parser.parse_args()
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    print(f"commit {commit.stdout.strip()}, {date.today()}, {os.cpu_count()} cores, "
          f"load average at start {os.getloadavg()}", flush=True)
    root = Path(tempfile.mkdtemp(prefix="modelhost-warmup-bench-"))
    try:
        repositories = {variant: root / variant.replace(" ", "_") for variant in VARIANTS}
        inputs = write_model(args.model, repositories[VARIANTS[0]])
        shutil.copytree(repositories[VARIANTS[0]], repositories[VARIANTS[1]])
        with open(repositories[VARIANTS[1]] / args.model / "config.pbtxt", "a") as config:
            config.write(warmup_block(inputs, args.batch, args.warmup_count))
        body, headers = request_body(inputs, args.batch)
        runs: dict[str, list[Measurement]] = {variant: [] for variant in VARIANTS}
        for start in range(args.starts):
            for variant in (VARIANTS if start % 2 == 0 else VARIANTS[::-1]):
                m = measure(repositories[variant], args.model, body, headers, args.steady, args.idle)
                runs[variant].append(m)
                print(f"start {start + 1} {variant}: ready {m.ready_s * 1e3:.0f} ms (warmup {m.warmup_s * 1e3:.1f}), "
                      f"first {m.first_s * 1e3:.3f} ms (compute {m.first_compute_s * 1e3:.3f}), "
                      f"steady p50 {p50_ms(m.steady_s):.3f} ms (compute {m.steady_compute_s * 1e3:.3f}), "
                      f"after idle p50 {p50_ms(m.idle_s):.3f} ms (compute {p50_ms(m.idle_compute_s):.3f})", flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(f"load average at end {os.getloadavg()}\n")
    print(table(args.model, summarize(runs)))
    if args.json:
        args.json.write_text(json.dumps({v: [m.__dict__ for m in ms] for v, ms in runs.items()}, indent=2))


if __name__ == "__main__":
    main()
