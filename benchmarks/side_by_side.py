"""Side by side: modelhost, NVIDIA Triton, TorchServe 0.12, the naive aiohttp peer and the in-process limit.

    python benchmarks/side_by_side.py [--duration 10] [--concurrency 1,8,32,128] [--models rank,tiny]
        [--servers modelhost,triton,torchserve,aiohttp,limit] [--grpc-client perf_analyzer|python]
        [--json results.json]

Models and requests are serving.py's: `rank`, 500 rows x 1000 FP32 features (2 MB) per request, and
`tiny`, 1 row x 4 FP32, the same arrays (serving.cases()). Every server runs the same model.onnx with
onnxruntime on the CPU, intra_op_num_threads = the machine's cores; see benchmarks/peers/ for how each
peer is started and configured. One server runs at a time; each cell (server, model, protocol and load
generator, concurrency) gets 1 s of warm-up, then `--duration` seconds measured. The protocol column names
the load generator in brackets:
- HTTP (wrk): wrk (C, serving.py's Lua script), `c` keep-alive connections, latency percentiles from wrk.
  V2 servers get the binary tensor extension (serving.infer_body); TorchServe, which has no V2 binary
  protocol, gets the same FP32 rows as a raw body on its /predictions API.
- HTTP and gRPC (perf_analyzer), for the servers with Triton's model metadata and config APIs (modelhost,
  Triton): NVIDIA's perf_analyzer (C++, the client Triton users measure with; benchmarks/peers/
  perf_analyzer.py installs it and says how it is run), `c` synchronous clients, the same arrays as one
  request (rank: -b 500 over 500 rows), the HTTP binary extension both ways over HTTP. It compares every
  answer byte for byte with the server's own answer, which is first checked against onnxruntime. Its
  warm-up is a run of its own.
- gRPC (Python): one grpc.aio channel from one event loop keeping `c` requests in flight, each a
  pre-serialized request (V2 ModelInfer with raw_input_contents; TorchServe's Predictions with raw bytes).
  TorchServe's gRPC always, the V2 servers' with --grpc-client python in place of perf_analyzer.
- limit: onnxruntime in this process, `c` threads calling it back to back on the same inputs.
`p50 / limit` divides a cell's p50 by the median of one onnxruntime call on its own (sequential, same
inputs and threads: grpc_http.limit_p50), as serving.py does: the model's own time, measured on every
run whatever --servers says. At c > 1 even a perfect server queues, so compare servers within one
(model, c, protocol, load generator) group; the limit rows show what c threads reach in-process.
Answers are checked against onnxruntime: HTTP once before and once after each wrk run, Python gRPC on
the first and every CHECK_EVERY-th answer of each in-flight slot, perf_analyzer's as above. A cell a
peer cannot do, or that fails, prints "n/a" with the reason in a footnote.

The load generators share the machine's cores with the server (2 here): the Python gRPC client tops
out at a few thousand requests/s and takes CPU from the server, and wrk and perf_analyzer take a core
at high rates, so for `tiny` read ratios between servers, not absolute figures. Needs wrk (Debian
package), libb64-0d (Debian package, for perf_analyzer, which installs itself on first use), the peers'
installs (their docstrings), and `python benchmarks/peers/triton.py --install` once for Triton;
`--check triton,torchserve` starts each peer and checks one inference per model. A full
run (the defaults: 10 s, c = 1, 8, 32 and 128, every server) takes about 16 minutes on 2 cores;
--duration 2 --concurrency 1,8 about 2.5.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import date
from importlib import metadata
from pathlib import Path
from typing import Any, Protocol

import grpc
import numpy as np
import onnxruntime as ort
import requests
from tritonclient.grpc import service_pb2

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks import grpc_http, serving  # noqa: E402
from benchmarks.peers import perf_analyzer, torchserve, triton  # noqa: E402
from modelhost.example_repository import ensure_example_repository  # noqa: E402
from tests.server import ServerProcess, free_port  # noqa: E402

MODELS = ("rank", "tiny")
CONCURRENCY = (1, 8, 32, 128)
WARMUP_S = 1
CHECK_EVERY = 64
WRK_TIMEOUT = "60s"  # wrk's default 2 s would drop `rank`'s slow answers at c=128 from the percentiles
AIOHTTP_PEER = ROOT / "benchmarks" / "peers" / "aiohttp_v2.py"
GRPC_CLIENTS = ("perf_analyzer", "python")
CLIENT_LABELS = {"wrk": "wrk", "perf_analyzer": "perf_analyzer", "python": "Python"}
Result = dict[str, Any]  # a cell's or a row's fields, as --json writes them


@dataclass(frozen=True)
class Workload:
    """One model's request array and the answer onnxruntime gives for it."""

    model: str
    input: str
    output: str
    array: np.ndarray
    expected: np.ndarray


@dataclass(frozen=True)
class HttpRequest:
    url: str
    body: bytes
    header_length: int | None  # for wrk_post.lua: set means an application/octet-stream body


class RunningServer(Protocol):
    base: str  # http://127.0.0.1:PORT

    def stop(self) -> object: ...


def example_repository(workdir: Path) -> Path:
    return ensure_example_repository(workdir / "cache")


def workloads(repository: Path, models: Sequence[str]) -> dict[str, Workload]:
    """serving.py's arrays for each model, with the expected answers."""
    cases = {case["model"]: case for case in serving.cases()}
    chosen = {}
    for model in models:
        case = cases[model]
        session = ort.InferenceSession(str(repository / model / "1" / "model.onnx"), providers=["CPUExecutionProvider"])
        expected = session.run(None, {case["input"]: case["array"]})[0]
        chosen[model] = Workload(model, case["input"], case["output"], case["array"], expected)
    return chosen


def assert_answer(got: np.ndarray, expected: np.ndarray) -> None:
    np.testing.assert_allclose(got.reshape(expected.shape), expected, rtol=1e-4, atol=1e-5)


class V2Api:
    """KServe V2: HTTP with the binary tensor extension, gRPC ModelInfer with raw_input_contents."""

    http_label = "HTTP binary"
    grpc_label = "gRPC"
    grpc_method = "/inference.GRPCInferenceService/ModelInfer"

    def http_request(self, base: str, workload: Workload) -> HttpRequest:
        body, header_length = serving.infer_body(workload.input, workload.array, workload.output, binary=True)
        return HttpRequest(f"{base}/v2/models/{workload.model}/infer", body, header_length)

    def check_http(self, request: HttpRequest, workload: Workload) -> None:
        serving.check(request.url, request.body, request.header_length, workload.expected)

    def grpc_payload(self, workload: Workload) -> bytes:
        request: bytes = grpc_http.grpc_request(workload.model, workload.array).SerializeToString()
        return request

    def grpc_answer(self, raw: bytes) -> np.ndarray:
        return np.frombuffer(service_pb2.ModelInferResponse.FromString(raw).raw_output_contents[0], np.float32)


class TorchServeApi:
    """TorchServe's own APIs with raw FP32 bytes both ways (see benchmarks/peers/torchserve.py)."""

    http_label = "HTTP raw"
    grpc_label = "gRPC raw"
    grpc_method = torchserve.PREDICTIONS_METHOD

    def http_request(self, base: str, workload: Workload) -> HttpRequest:
        # wrk_post.lua sends application/octet-stream only along with an Inference-Header-Content-Length
        # header; 0 asks for that content type, and TorchServe ignores the header.
        return HttpRequest(f"{base}/predictions/{workload.model}", workload.array.tobytes(), 0)

    def check_http(self, request: HttpRequest, workload: Workload) -> None:
        response = requests.post(request.url, data=request.body, timeout=30,
                                 headers={"Content-Type": "application/octet-stream"})
        response.raise_for_status()
        assert_answer(np.frombuffer(response.content, np.float32), workload.expected)

    def grpc_payload(self, workload: Workload) -> bytes:
        return torchserve.predictions_request(workload.model, workload.array.tobytes()).SerializeToString()

    def grpc_answer(self, raw: bytes) -> np.ndarray:
        _, response_class = torchserve.predictions_messages()
        return np.frombuffer(response_class.FromString(raw).prediction, np.float32)  # type: ignore[attr-defined]


class AiohttpPeer:
    """benchmarks/peers/aiohttp_v2.py, as serving.py runs it: onnxruntime in aiohttp's thread pool."""

    def __init__(self, repository: Path) -> None:
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.process = subprocess.Popen([sys.executable, str(AIOHTTP_PEER), str(repository), str(self.port)])

    def wait_ready(self, timeout: float = 60.0) -> AiohttpPeer:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"aiohttp peer exited with {self.process.returncode}")
            try:
                if requests.get(f"{self.base}/v2/health/ready", timeout=1).ok:
                    return self
            except (requests.ConnectionError, requests.Timeout):
                pass
            time.sleep(0.1)
        self.stop()
        raise TimeoutError("aiohttp peer not ready")

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait()


def start_modelhost(repository: Path, models: Sequence[str], workdir: Path) -> RunningServer:
    return ServerProcess(repository).wait_ready()


def start_triton(repository: Path, models: Sequence[str], workdir: Path) -> RunningServer:
    return triton.TritonServer(repository, models, workdir).start()


def start_torchserve(repository: Path, models: Sequence[str], workdir: Path) -> RunningServer:
    return torchserve.TorchServeServer(repository, models, workdir).start()


def start_aiohttp(repository: Path, models: Sequence[str], workdir: Path) -> RunningServer:
    return AiohttpPeer(repository).wait_ready()


@dataclass(frozen=True)
class Peer:
    api: V2Api | TorchServeApi
    start: Callable[[Path, Sequence[str], Path], RunningServer]
    grpc: bool = True
    perf_analyzer: bool = False  # has the model metadata, config and statistics APIs perf_analyzer reads
    note: str = ""


PEERS = {
    "modelhost": Peer(V2Api(), start_modelhost, perf_analyzer=True),
    "triton": Peer(V2Api(), start_triton, perf_analyzer=True, note=(
        "Triton from the nvidia-pytriton wheel, which has only the python backend: a python-backend model.py "
        "runs the same model.onnx with onnxruntime in the backend's stub process (one more shared-memory hop "
        "per request than an onnxruntime backend would take).")),
    "torchserve": Peer(TorchServeApi(), start_torchserve, note=(
        "TorchServe has no V2 binary protocol: HTTP raw = the FP32 rows as an application/octet-stream body on "
        "POST /predictions/<model>, raw FP32 back; gRPC raw = InferenceAPIsService/Predictions with the rows "
        "in input[\"data\"]. One Python worker per model, batch size 1, logging at WARN.")),
    "aiohttp": Peer(V2Api(), start_aiohttp, grpc=False),
}
SERVERS = (*PEERS, "limit")
LIMIT_NOTE = ("limit: onnxruntime in-process, c threads calling it back to back on the same inputs, "
              "intra_op_num_threads = cores.")
RATIO_NOTE = "p50 / limit: the cell's p50 divided by one onnxruntime call's median on its own (sequential)"
NO_GRPC_NOTE = "the aiohttp peer serves HTTP only."


def check_peer(name: str, server: RunningServer, repository: Path) -> None:
    """One checked inference per model over HTTP, and gRPC where the peer has it (the peers' smoke check)."""
    peer = PEERS[name]
    for workload in workloads(repository, MODELS).values():
        peer.api.check_http(peer.api.http_request(server.base, workload), workload)
        if peer.grpc:
            with grpc.insecure_channel(server.grpc_url, grpc_http.GRPC_OPTIONS) as channel:  # type: ignore[attr-defined]
                raw = channel.unary_unary(peer.api.grpc_method)(peer.api.grpc_payload(workload), timeout=30)
            assert_answer(peer.api.grpc_answer(raw), workload.expected)
        print(f"{name} {workload.model}: HTTP{' and gRPC' if peer.grpc else ''} answers correct", flush=True)


def wrk(request: HttpRequest, body_file: Path, c: int, seconds: int) -> Result:
    """wrk with serving.py's Lua script: 1 s warm-up, then `seconds` measured; any failed answer raises."""
    env = dict(os.environ, BODY_FILE=str(body_file),
               HEADER_LENGTH="" if request.header_length is None else str(request.header_length))
    command = ["wrk", f"-t{1 if c == 1 else 2}", f"-c{c}", "--timeout", WRK_TIMEOUT, "-s", str(serving.LUA),
               "--latency"]
    subprocess.run([*command, f"-d{WARMUP_S}s", request.url], env=env, capture_output=True, check=True)
    out = subprocess.run([*command, f"-d{seconds}s", request.url], env=env, capture_output=True, text=True,
                         check=True).stdout
    failures = re.search(r"Non-2xx or 3xx responses: (\d+)|Socket errors: .*", out)
    if failures:
        raise RuntimeError(f"wrk: {failures.group(0)}")
    if re.search(r"^\s*0 requests in", out, re.M):
        raise RuntimeError(f"no answer came back within the {seconds} s measured")
    return {"rps": float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1)),  # type: ignore[union-attr]
            "p50": serving._latency(out, "50%"), "p99": serving._latency(out, "99%")}


def http_cell(api: V2Api | TorchServeApi, server: RunningServer, workload: Workload, c: int, seconds: int,
              workdir: Path) -> Result:
    request = api.http_request(server.base, workload)
    body_file = workdir / f"{workload.model}-{type(api).__name__}.body"
    body_file.write_bytes(request.body)
    api.check_http(request, workload)
    result = wrk(request, body_file, c, seconds)
    api.check_http(request, workload)
    return result


async def grpc_cell(api: V2Api | TorchServeApi, target: str, workload: Workload, c: int, seconds: int) -> Result:
    """`c` coroutines on one grpc.aio channel, each sending the pre-serialized request back to back."""
    payload = api.grpc_payload(workload)
    async with grpc.aio.insecure_channel(target, options=grpc_http.GRPC_OPTIONS) as channel:
        call = channel.unary_unary(api.grpc_method)  # bytes in, bytes out: no (de)serializing in the loop
        start = time.perf_counter()
        measure_from, deadline = start + WARMUP_S, start + WARMUP_S + seconds
        latencies: list[float] = []
        total = 0

        async def slot() -> None:
            nonlocal total
            answered = 0
            while (begin := time.perf_counter()) < deadline:
                raw = await call(payload)
                if answered % CHECK_EVERY == 0:
                    assert_answer(api.grpc_answer(raw), workload.expected)
                answered += 1
                if begin >= measure_from:
                    latencies.append(time.perf_counter() - begin)
            total += answered

        await asyncio.gather(*(slot() for _ in range(c)))
    if not latencies:
        raise RuntimeError(f"no answer came back within the {seconds} s measured")
    return grpc_http.summary(latencies, seconds, total)


def run_grpc_cell(api: V2Api | TorchServeApi, target: str, workload: Workload, c: int, seconds: int) -> Result:
    return asyncio.run(grpc_cell(api, target, workload, c, seconds))


def v2_answer(server: RunningServer, workload: Workload) -> np.ndarray:
    """The server's answer to the workload's request over gRPC, checked against onnxruntime."""
    api = V2Api()
    with grpc.insecure_channel(server.grpc_url, grpc_http.GRPC_OPTIONS) as channel:  # type: ignore[attr-defined]
        raw = channel.unary_unary(api.grpc_method)(api.grpc_payload(workload), timeout=30)
    answer = api.grpc_answer(raw).reshape(workload.expected.shape)
    assert_answer(answer, workload.expected)
    return answer


def perf_analyzer_cell(protocol: str, server: RunningServer, workload: Workload, c: int, seconds: int,
                       workdir: Path) -> Result:
    """perf_analyzer with the workload's array as one request, every answer compared byte for byte with the
    server's own (checked) answer."""
    data = perf_analyzer.write_input_data(workdir / f"{workload.model}.perf_analyzer.json", workload.input,
                                          workload.array, workload.output, v2_answer(server, workload))
    url = server.grpc_url if protocol == "gRPC" else server.base.removeprefix("http://")  # type: ignore[attr-defined]
    return perf_analyzer.measure(protocol.lower(), url, workload.model, data, c, seconds, warmup_s=WARMUP_S)


def limit_cell(session: ort.InferenceSession, workload: Workload, c: int, seconds: int) -> Result:
    """`c` threads calling onnxruntime back to back, as a server with no overhead would."""
    feeds = {workload.input: workload.array}
    assert_answer(session.run(None, feeds)[0], workload.expected)
    return grpc_http.threaded([lambda: session.run(None, feeds)] * c, WARMUP_S, seconds)


def limit_session(repository: Path, model: str) -> ort.InferenceSession:
    """serving.py's limit session: the server's thread count."""
    options = ort.SessionOptions()
    options.intra_op_num_threads = os.cpu_count() or 1
    return ort.InferenceSession(str(repository / model / "1" / "model.onnx"), options,
                                providers=["CPUExecutionProvider"])


@dataclass(frozen=True)
class Load:
    """How a cell loads its server: the protocol and the load generator."""

    protocol: str  # "HTTP" or "gRPC"
    client: str  # "wrk", "perf_analyzer" or "python"; "" where the peer has no such protocol

    def label(self, api: V2Api | TorchServeApi) -> str:
        protocol = api.http_label if self.protocol == "HTTP" else api.grpc_label
        return f"{protocol} ({CLIENT_LABELS[self.client]})" if self.client else protocol


def loads(peer: Peer, grpc_client: str) -> list[Load]:
    """wrk over HTTP, and perf_analyzer beside it where the peer allows; gRPC with `grpc_client` where the
    peer allows perf_analyzer, else the Python client."""
    chosen = [Load("HTTP", "wrk")]
    if peer.perf_analyzer:
        chosen.append(Load("HTTP", "perf_analyzer"))
    if not peer.grpc:
        chosen.append(Load("gRPC", ""))
    else:
        chosen.append(Load("gRPC", grpc_client if peer.perf_analyzer else "python"))
    return chosen


def run_cell(peer: Peer, load: Load, server: RunningServer, workload: Workload, c: int, seconds: int,
             workdir: Path) -> tuple[Result | None, str]:
    if not load.client:
        return None, NO_GRPC_NOTE
    if load.client == "wrk":
        return attempt(http_cell, peer.api, server, workload, c, seconds, workdir)
    if load.client == "perf_analyzer":
        return attempt(perf_analyzer_cell, load.protocol, server, workload, c, seconds, workdir)
    return attempt(run_grpc_cell, peer.api, server.grpc_url, workload, c, seconds)  # type: ignore[attr-defined]


def row(server: str, model: str, protocol: str, c: int, result: Result | None = None, na: str = "") -> Result:
    entry = {"server": server, "model": model, "protocol": protocol, "c": c}
    if result is None:
        return {**entry, "na": na}
    return {**entry, "rps": result["rps"], "p50": result["p50"], "p99": result["p99"]}


def attempt(measure: Callable[..., Result], *args: Any) -> tuple[Result | None, str]:
    """measure(*args), or None and why it failed: one failed cell must not end a long run."""
    try:
        return measure(*args), ""
    except Exception as error:  # noqa: BLE001 (any failure becomes the cell's footnote)
        first_line = (str(error).strip().splitlines() or [type(error).__name__])[0][:300]
        return None, f"failed: {type(error).__name__}: {first_line}"


def one_call_p50(repository: Path, jobs: dict[str, Workload]) -> dict[str, float]:
    """Per model, one in-process onnxruntime call's median ms: the denominator of p50 / limit."""
    return {model: grpc_http.limit_p50(repository, model, w.array)[0] for model, w in jobs.items()}


def measure_limit(repository: Path, jobs: dict[str, Workload], concurrency: Sequence[int],
                  seconds: int) -> list[Result]:
    rows = []
    for workload in jobs.values():
        session = limit_session(repository, workload.model)
        for c in concurrency:
            result, why = attempt(limit_cell, session, workload, c, seconds)
            rows.append(report(row("limit", workload.model, "in-process", c, result, why)))
    return rows


def measure_peer(name: str, repository: Path, jobs: dict[str, Workload], concurrency: Sequence[int], seconds: int,
                 workdir: Path, grpc_client: str) -> list[Result]:
    """Start the peer, run every cell of it, stop it."""
    peer = PEERS[name]
    cells = [(workload, load, c) for workload in jobs.values() for load in loads(peer, grpc_client)
             for c in concurrency]
    try:
        server = peer.start(repository, list(jobs), workdir / name)
    except Exception as error:  # noqa: BLE001
        why = f"did not start: {type(error).__name__}: {str(error).strip()[:300]}"
        return [report(row(name, w.model, load.label(peer.api), c, na=why)) for w, load, c in cells]
    rows = []
    try:
        for workload, load, c in cells:
            result, why = run_cell(peer, load, server, workload, c, seconds, workdir)
            rows.append(report(row(name, workload.model, load.label(peer.api), c, result, why)))
    finally:
        server.stop()
    return rows


def report(entry: Result) -> Result:
    """Print a cell as it completes (a full run takes a while), and pass it on."""
    head = f"{entry['server']} {entry['model']} {entry['protocol']} c={entry['c']}:"
    if "na" in entry:
        print(f"{head} n/a ({entry['na']})", flush=True)
    else:
        print(f"{head} {entry['rps']:.0f} req/s p50 {entry['p50']:.2f} ms p99 {entry['p99']:.2f} ms", flush=True)
    return entry


class Footnotes:
    """Numbered footnotes, one number per distinct text."""

    def __init__(self) -> None:
        self.texts: list[str] = []

    def mark(self, text: str) -> str:
        if not text:
            return ""
        if text not in self.texts:
            self.texts.append(text)
        return f" [{self.texts.index(text) + 1}]"

    def render(self) -> str:
        return "\n".join(f"[{i}] {text}" for i, text in enumerate(self.texts, 1))


def protocol_group(label: str) -> tuple[int, int]:
    """Where a protocol column's rows go: in-process, HTTP, gRPC; within those, by load generator."""
    family = 0 if label == "in-process" else 1 if label.startswith("HTTP") else 2
    clients = [f"({name})" for name in CLIENT_LABELS.values()]
    return family, next((i for i, client in enumerate(clients) if label.endswith(client)), len(clients))


def table(rows: list[Result], one_call: dict[str, float]) -> str:
    """One markdown table: per model and concurrency, the limit, then each protocol and load generator's
    servers."""
    notes = Footnotes()
    medians = ", ".join(f"{model} {p50:.3f} ms" for model, p50 in one_call.items())
    ratio_head = "p50 / limit" + notes.mark(f"{RATIO_NOTE}: {medians}.")
    order = {name: i for i, name in enumerate(SERVERS)}
    lines = [f"| server | model | protocol | c | req/s | p50 ms | p99 ms | {ratio_head} |",
             "|---|---|---|---|---|---|---|---|"]
    models = list(one_call)
    for r in sorted(rows, key=lambda r: (models.index(r["model"]), r["c"], protocol_group(r["protocol"]),
                                         order[r["server"]])):
        server = r["server"] + notes.mark(PEERS[r["server"]].note if r["server"] in PEERS else LIMIT_NOTE)
        if "na" in r:
            lines.append(f"| {server} | {r['model']} | {r['protocol']} | {r['c']} | n/a{notes.mark(r['na'])} "
                         "| n/a | n/a | n/a |")
            continue
        lines.append(f"| {server} | {r['model']} | {r['protocol']} | {r['c']} | {r['rps']:.0f} | {r['p50']:.2f} "
                     f"| {r['p99']:.2f} | {r['p50'] / one_call[r['model']]:.1f}x |")
    return "\n".join(lines) + "\n\n" + notes.render()


def versions() -> dict[str, str]:
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    found = {"commit": commit.stdout.strip(), "date": str(date.today()), "cores": str(os.cpu_count()),
             "onnxruntime": ort.__version__, "grpcio": grpc.__version__}
    for package in ("torchserve", "aiohttp"):
        try:
            found[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            found[package] = "not installed"
    pytriton = sorted(triton.VENV.glob("lib/python*/site-packages/nvidia_pytriton-*.dist-info"))
    found["nvidia-pytriton"] = pytriton[-1].name.removesuffix(".dist-info").split("-")[1] if pytriton else "absent"
    return found


def perf_analyzer_version() -> str:
    """Its version, installing it first if need be (a failure here shows again in its cells)."""
    try:
        return perf_analyzer.find_or_install().version().removeprefix("Perf Analyzer Version ")
    except Exception as error:  # noqa: BLE001
        return f"unavailable ({type(error).__name__})"


def parse_list(text: str, allowed: Sequence[str] | None = None) -> list[str]:
    items = [item.strip() for item in text.split(",") if item.strip()]
    unknown = [item for item in items if allowed is not None and item not in allowed]
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown: {', '.join(unknown)} (choose from {', '.join(allowed or [])})")
    return items


def check_peers(names: Sequence[str]) -> None:
    """The peers' smoke check: each started, one checked inference per model over HTTP and gRPC, stopped."""
    workdir = Path(tempfile.mkdtemp(prefix="modelhost-side-by-side-check-"))
    repository = example_repository(workdir)
    for name in names:
        server = PEERS[name].start(repository, MODELS, workdir / name)
        try:
            check_peer(name, server, repository)
        finally:
            server.stop()
        print(f"{name}: ok", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--duration", type=int, default=10, help="seconds measured per cell (after 1 s warm-up)")
    parser.add_argument("--concurrency", type=lambda s: [int(c) for c in parse_list(s)], default=list(CONCURRENCY))
    parser.add_argument("--models", type=lambda s: parse_list(s, MODELS), default=list(MODELS))
    parser.add_argument("--servers", type=lambda s: parse_list(s, SERVERS), default=list(SERVERS))
    parser.add_argument("--grpc-client", choices=GRPC_CLIENTS, default="perf_analyzer",
                        help="the V2 servers' gRPC load generator (TorchServe's is always the Python one)")
    parser.add_argument("--json", type=Path, help="also write the versions and rows here")
    parser.add_argument("--check", type=lambda s: parse_list(s, PEERS),
                        help="only start these servers, check one inference per model each, and stop them")
    args = parser.parse_args()
    if args.check:
        check_peers(args.check)
        return

    started = time.monotonic()
    about = versions()
    if any(name in PEERS and PEERS[name].perf_analyzer for name in args.servers):
        about["perf_analyzer"] = perf_analyzer_version()
    print(", ".join(f"{k} {v}" for k, v in about.items()) + f", load average at start {os.getloadavg()}", flush=True)
    workdir = Path(tempfile.mkdtemp(prefix="modelhost-side-by-side-"))
    repository = example_repository(workdir)
    jobs = workloads(repository, args.models)
    one_call = one_call_p50(repository, jobs)
    print("one call in-process, median: " + ", ".join(f"{m} {p50:.3f} ms" for m, p50 in one_call.items()), flush=True)
    rows = measure_limit(repository, jobs, args.concurrency, args.duration) if "limit" in args.servers else []
    for name in (s for s in args.servers if s in PEERS):
        rows += measure_peer(name, repository, jobs, args.concurrency, args.duration, workdir, args.grpc_client)
    print(f"load average at end {os.getloadavg()}, {time.monotonic() - started:.0f} s in all", flush=True)
    if args.json:
        args.json.write_text(json.dumps({"versions": about, "one_call_p50_ms": one_call, "rows": rows}, indent=2))
    print()
    print(table(rows, one_call))


if __name__ == "__main__":
    main()
