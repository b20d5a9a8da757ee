"""A ranking model whose embedding table is ten times the RAM it is given: the embedding store over HTTP against
the table in RAM, measured in one run.

    python benchmarks/embedding_store.py [--rows 10000000] [--dim 64] [--cache 0.1] [--warmup 30] [--duration 20]
        [--concurrency 1,8] [--traffic zipf1.0,zipf1.2,uniform] [--work DIR]

The table: --rows x --dim float32 vectors (10,000,000 x 64: 2.56 GB) under hashed-looking int64 ids. The model:
DeepFM-style, 39 fields: each field's id looked up (embeddings [500, 39, dim]), then FM + a 2496-200-200-1 MLP in
ONNX. Requests: 500 candidates, 13 fields shared by every candidate (user and context) and 26 per candidate, each
id drawn by popularity (Zipf s = 1.0 or 1.2 over the ranks, or uniform), the ranks placed at random rows. Every
request is new (bodies are generated ahead, none sent twice); the V2 binary extension carries feat_ids and
feat_vals (234 KB).

Configurations, each a `modelhost serve` of its own, one at a time:
- `tiered`: the ensemble (embedding model over the store, then the dense model), the cache --cache of the table;
- `no cache`: the same with a cache of 0 (every lookup from disk);
- `in RAM (ONNX)`: one ONNX model whose Gather holds the whole table as an initializer (external data);
- `limit`: in this process, numpy gathers from the table in RAM, then onnxruntime on the dense model: what a
  request costs with no server and no disk.
`tiered` under the first traffic then measures the update p99 ratio at each of --updates-at (default: the highest
concurrency): 10,000 updated rows/s posted beside the traffic (1,000-row batches every 0.1 s over HTTP) in 4
periods alternating with 4 without, on the same warm cache.

--compaction LOG_BYTES measures a compaction through the server instead (embedding_store_compaction.py).

--table-dir keeps the table and repositories for the next run (the tiered table's delta log is removed at each
start); --server-env sets variables in the servers' environment (e.g. allocator settings).

Disk reads are honest: the store reads with O_DIRECT (the OS page cache holds no table rows), and the page cache
is dropped before each configuration (/proc/sys/vm/drop_caches, where writable). The client is Python threads
(one keep-alive connection each, `c` of them) on the same 2 cores as the server: read ratios. Each cell: --warmup
seconds (the cache fills), then --duration measured. Reported: p50, p99, req/s, the cache hit ratio of the
measured period (from the server's metrics), and the server's RSS in MB (10^6 bytes, as the cache budget is given):
its highest sample (every 0.5 s) while measured, and right after.
"""

from __future__ import annotations

import argparse
import http.client
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.embedding_cache_policy import Popularity  # noqa: E402
from modelhost.embeddings.table_files import write_version  # noqa: E402
from tests.server import ServerProcess  # noqa: E402

CANDIDATES, SHARED, ITEM_FIELDS = 500, 13, 26
FIELDS = SHARED + ITEM_FIELDS
HIDDEN = 200
TABLE_FILE = "table.bin"
TRAFFIC = {"zipf1.0": 1.0, "zipf1.2": 1.2, "uniform": None}


def feature_ids(rows: int) -> np.ndarray:
    """The table's ids: sorted, sparse over int64, as hashed ids are."""
    return np.arange(rows, dtype=np.int64) * 2_654_435_761 + 12_345


def make_vectors(path: Path, rows: int, dim: int) -> np.ndarray:
    vectors = np.lib.format.open_memmap(path, mode="w+", dtype=np.float32, shape=(rows, dim))
    rng = np.random.default_rng(0)
    for start in range(0, rows, 1_000_000):
        end = min(rows, start + 1_000_000)
        vectors[start:end] = rng.standard_normal((end - start, dim), dtype=np.float32) * 0.05
    vectors.flush()
    return np.load(path, mmap_mode="r")


def dense_model(dim: int, gather_from: np.ndarray | None = None) -> onnx.ModelProto:
    """FM + MLP over embeddings [B, 39, dim] and values [B, 39]; with `gather_from`, the embeddings are gathered
    in the model from that table (the all-in-RAM model), `feat_ids` being row numbers."""
    rng = np.random.default_rng(1)
    inits = [numpy_helper.from_array(np.array([1], np.int64), "axis1"),
             numpy_helper.from_array(np.array([2], np.int64), "axis2"),
             numpy_helper.from_array(np.array(0.5, np.float32), "half")]
    nodes = []
    if gather_from is not None:  # the table as external data: a protobuf message holds 2 GB at most
        table = TensorProto(name="table", data_type=TensorProto.FLOAT, dims=list(gather_from.shape),
                            data_location=TensorProto.EXTERNAL)
        for key, value in (("location", TABLE_FILE), ("offset", "0"), ("length", str(gather_from.nbytes))):
            entry = table.external_data.add()
            entry.key, entry.value = key, value
        inits.append(table)
        nodes.append(helper.make_node("Gather", ["table", "feat_ids"], ["emb_raw"]))
        inputs = [helper.make_tensor_value_info("feat_ids", TensorProto.INT64, ["B", FIELDS])]
    else:
        inputs = [helper.make_tensor_value_info("emb_raw", TensorProto.FLOAT, ["B", FIELDS, dim])]
    inputs.append(helper.make_tensor_value_info("feat_vals", TensorProto.FLOAT, ["B", FIELDS]))
    nodes += [helper.make_node("Unsqueeze", ["feat_vals", "axis2"], ["vals3"]),
              helper.make_node("Mul", ["emb_raw", "vals3"], ["emb"]),
              helper.make_node("ReduceSum", ["emb", "axis1"], ["sum_e"], keepdims=0),
              helper.make_node("Mul", ["sum_e", "sum_e"], ["sum_e_sq"]),
              helper.make_node("Mul", ["emb", "emb"], ["emb_sq"]),
              helper.make_node("ReduceSum", ["emb_sq", "axis1"], ["sum_sq_e"], keepdims=0),
              helper.make_node("Sub", ["sum_e_sq", "sum_sq_e"], ["fm_diff"]),
              helper.make_node("ReduceSum", ["fm_diff", "axis1"], ["fm_sum"], keepdims=1),
              helper.make_node("Mul", ["fm_sum", "half"], ["fm"]),
              helper.make_node("Flatten", ["emb"], ["h0"], axis=1)]
    sizes = [FIELDS * dim, HIDDEN, HIDDEN, 1]
    for layer, (fan_in, fan_out) in enumerate(zip(sizes, sizes[1:])):
        weight = (rng.standard_normal((fan_in, fan_out)) * np.sqrt(2 / fan_in)).astype(np.float32)
        inits += [numpy_helper.from_array(weight, f"w{layer}"),
                  numpy_helper.from_array(np.zeros(fan_out, np.float32), f"b{layer}")]
        nodes += [helper.make_node("MatMul", [f"h{layer}", f"w{layer}"], [f"m{layer}"]),
                  helper.make_node("Add", [f"m{layer}", f"b{layer}"], [f"a{layer}"])]
        last = layer == len(sizes) - 2
        nodes.append(helper.make_node("Identity" if last else "Relu", [f"a{layer}"], [f"h{layer + 1}"]))
    nodes += [helper.make_node("Add", ["h3", "fm"], ["logit"]), helper.make_node("Sigmoid", ["logit"], ["prob"])]
    graph = helper.make_graph(nodes, "ranker", inputs,
                              [helper.make_tensor_value_info("prob", TensorProto.FLOAT, ["B", 1])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def write_repositories(work: Path, ids: np.ndarray, vectors: np.ndarray, dim: int,
                       in_ram_model: bool) -> tuple[Path, Path]:
    """The tiered and the in-RAM repositories under `work`; those an earlier run wrote there are reused (less
    the tiered table's delta log: every run starts from the version as built)."""
    tiered, in_ram = work / "tiered_repository", work / "ram_repository"
    if not (tiered / "ranker" / "config.pbtxt").exists():
        shutil.rmtree(tiered, ignore_errors=True)
        write_tiered(tiered, ids, vectors, dim)
    for log in (tiered / "emb" / "1" / "table").glob("v*/delta.log"):
        log.unlink()
    if in_ram_model and not (in_ram / "ranker" / "config.pbtxt").exists():
        shutil.rmtree(in_ram, ignore_errors=True)
        write_in_ram(in_ram, vectors, dim)
    return tiered, in_ram


def write_tiered(tiered: Path, ids: np.ndarray, vectors: np.ndarray, dim: int) -> None:
    (tiered / "emb" / "1").mkdir(parents=True)
    (tiered / "emb" / "config.pbtxt").write_text(
        f'backend: "embedding"\nmax_batch_size: {CANDIDATES}\n'
        f'input [ {{ name: "feat_ids" data_type: TYPE_INT64 dims: [ {FIELDS} ] }} ]\n'
        f'output [ {{ name: "embeddings" data_type: TYPE_FP32 dims: [ {FIELDS}, {dim} ] }} ]\n')
    write_version(tiered / "emb" / "1" / "table", ids, vectors, "float32")
    (tiered / "dense" / "1").mkdir(parents=True)
    onnx.save_model(dense_model(dim), str(tiered / "dense" / "1" / "model.onnx"))
    (tiered / "dense" / "config.pbtxt").write_text(f'platform: "onnxruntime_onnx"\nmax_batch_size: {CANDIDATES}\n')
    (tiered / "ranker" / "1").mkdir(parents=True)
    (tiered / "ranker" / "config.pbtxt").write_text(
        f'platform: "ensemble"\nmax_batch_size: {CANDIDATES}\n'
        f'input [ {{ name: "feat_ids" data_type: TYPE_INT64 dims: [ {FIELDS} ] }},'
        f' {{ name: "feat_vals" data_type: TYPE_FP32 dims: [ {FIELDS} ] }} ]\n'
        'output [ { name: "prob" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
        'ensemble_scheduling {\n'
        '  step { model_name: "emb" model_version: -1 input_map { key: "feat_ids" value: "feat_ids" }'
        ' output_map { key: "embeddings" value: "emb_raw" } }\n'
        '  step { model_name: "dense" model_version: -1 input_map { key: "emb_raw" value: "emb_raw" }'
        ' input_map { key: "feat_vals" value: "feat_vals" } output_map { key: "prob" value: "prob" } }\n}\n')


def write_in_ram(in_ram: Path, vectors: np.ndarray, dim: int) -> None:
    (in_ram / "ranker" / "1").mkdir(parents=True)
    onnx.save_model(dense_model(dim, gather_from=vectors), str(in_ram / "ranker" / "1" / "model.onnx"))
    with open(in_ram / "ranker" / "1" / TABLE_FILE, "wb") as out:
        for start in range(0, len(vectors), 1_000_000):
            out.write(np.ascontiguousarray(vectors[start:start + 1_000_000]).tobytes())
    (in_ram / "ranker" / "config.pbtxt").write_text(f'platform: "onnxruntime_onnx"\nmax_batch_size: {CANDIDATES}\n')


def request_ids(popularity: Popularity) -> np.ndarray:
    """One request's rows [500, 39]: 13 shared fields, 26 per candidate."""
    shared = popularity.draw(SHARED)
    items = popularity.draw(CANDIDATES * ITEM_FIELDS).reshape(CANDIDATES, ITEM_FIELDS)
    return np.hstack([np.broadcast_to(shared, (CANDIDATES, SHARED)), items])


def post_update(connection: http.client.HTTPConnection, body: bytes, header_length: int) -> None:
    """One batch of rows (a v2_body) to the embedding model's update call; RuntimeError unless it is applied."""
    connection.request("POST", "/v2/models/emb/embeddings/update", body,
                       {"Inference-Header-Content-Length": str(header_length)})
    response = connection.getresponse()
    response.read()
    if response.status != 200:
        raise RuntimeError(f"update failed: {response.status}")


def v2_body(inputs: dict[str, np.ndarray]) -> tuple[bytes, int]:
    header = {"inputs": [{"name": name, "datatype": "INT64" if a.dtype == np.int64 else "FP32",
                          "shape": list(a.shape), "parameters": {"binary_data_size": a.nbytes}}
                         for name, a in inputs.items()],
              "outputs": [{"name": "prob", "parameters": {"binary_data": False}}]}
    text = json.dumps(header).encode()
    return text + b"".join(a.tobytes() for a in inputs.values()), len(text)


class Load:
    """`c` threads, each a keep-alive connection sending bodies in turn until told to stop; latencies per phase."""

    def __init__(self, port: int, path: str, bodies: list[Any], concurrency: int) -> None:
        self._port, self._path, self._bodies = port, path, bodies
        self._next = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self.phase: str | None = None  # latencies of requests started in a phase are kept under its name
        self.by_phase: dict[str, list[float]] = {}
        self.cycle = False  # send requests again once all were sent (where no cache could remember them)
        self.failures = 0
        self.timeline: list[tuple[float, float]] | None = None  # (start, seconds) of each request, where kept
        self._threads = [threading.Thread(target=self._run, daemon=True) for _ in range(concurrency)]

    def __enter__(self) -> Load:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join()

    @property
    def sent(self) -> int:
        return self._next

    def _body(self) -> tuple[bytes, int]:
        with self._lock:
            if self._next >= len(self._bodies) and not self.cycle:
                raise RuntimeError("out of distinct requests: raise --requests")
            body = self._bodies[self._next % len(self._bodies)]
            self._next += 1
        return body if isinstance(body, tuple) else body()

    def _run(self) -> None:
        connection = http.client.HTTPConnection("127.0.0.1", self._port, timeout=120)
        while not self._stop.is_set():
            body, header_length = self._body()
            phase = self.phase
            started = time.perf_counter()
            connection.request("POST", self._path, body, {"Inference-Header-Content-Length": str(header_length),
                                                          "Content-Type": "application/octet-stream"})
            response = connection.getresponse()
            response.read()
            elapsed = time.perf_counter() - started
            if response.status != 200:
                self.failures += 1
            elif phase is not None:
                self.by_phase.setdefault(phase, []).append(elapsed)
                if self.timeline is not None:
                    self.timeline.append((started, elapsed))


def drop_page_cache() -> None:
    try:
        subprocess.run(["sync"], check=True)
        Path("/proc/sys/vm/drop_caches").write_text("1\n")
    except OSError:
        print("  (the page cache could not be dropped: O_DIRECT still keeps table reads off it)", flush=True)


def metrics(server: ServerProcess) -> dict[str, float]:
    connection = http.client.HTTPConnection("127.0.0.1", server.metrics_port, timeout=10)
    connection.request("GET", "/metrics")
    text = connection.getresponse().read().decode()
    values = {}
    for line in text.splitlines():
        if line.startswith("modelhost_embedding_"):
            name, value = line.rsplit(" ", 1)
            values[name.split("{")[0]] = float(value)
    return values


def rss_mb(pid: int, field: str = "VmRSS") -> float:
    """The process's resident memory in MB (10^6 bytes, as the budget is given), or one part of it (RssAnon:
    the process's own memory; RssFile: mapped files, its libraries)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024 / 1e6
    return 0.0


def cell(server: ServerProcess, bodies: list[Any], concurrency: int, warmup: float,
         duration: float, cycle: bool = False) -> dict[str, Any]:
    before: dict[str, float] = {}
    load = Load(server.port, "/v2/models/ranker/infer", bodies, concurrency)
    load.cycle = cycle
    with load:
        time.sleep(warmup)
        before = metrics(server)
        load.phase = "measured"
        started = time.perf_counter()
        peak = 0.0
        while time.perf_counter() - started < duration:  # the server's RSS under load: its highest sample
            time.sleep(min(0.5, max(0.0, duration - (time.perf_counter() - started))))
            peak = max(peak, rss_mb(server.process.pid))
        load.phase = None
        elapsed = time.perf_counter() - started
    after = metrics(server)
    hits = after.get("modelhost_embedding_cache_hits_total", 0) - before.get("modelhost_embedding_cache_hits_total", 0)
    misses = (after.get("modelhost_embedding_cache_misses_total", 0)
              - before.get("modelhost_embedding_cache_misses_total", 0))
    latencies = sorted(load.by_phase.get("measured", []))
    if not latencies:
        return {"rps": 0.0, "p50": float("nan"), "p99": float("nan"), "hit": float("nan"), "failures": load.failures,
                "sent": load.sent, "peak_rss": peak}
    return {"rps": len(latencies) / elapsed, "p50": statistics.median(latencies) * 1000,
            "p99": latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))] * 1000,
            "hit": hits / (hits + misses) if hits + misses else float("nan"), "failures": load.failures,
            "sent": load.sent, "peak_rss": peak}


def _paced(port: int, updates: list[tuple[bytes, int]], updating: threading.Event, stop: threading.Event) -> None:
    """1,000-row updates every 0.1 s (10,000 rows/s) while `updating` is set, until `stop`."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    sent = 0
    while not stop.is_set():
        updating.wait()
        if stop.is_set():
            return
        started = time.perf_counter()
        body, header_length = updates[sent % len(updates)]
        sent += 1
        post_update(connection, body, header_length)
        time.sleep(max(0.0, 0.1 - (time.perf_counter() - started)))


def update_ratio(server: ServerProcess, bodies: list[Any], concurrency: int, duration: float,
                 updates: list[tuple[bytes, int]], pairs: int = 4) -> int:
    """p99 with 10,000 updated rows/s beside the traffic against p99 without, on the same warm cache: `pairs`
    alternating periods of each (the order swapped every pair), so that the other load on the machine falls on
    both alike; a period's first 0.5 s is not counted. Returns the requests sent."""
    load = Load(server.port, "/v2/models/ranker/infer", bodies, concurrency)
    updating = threading.Event()
    stop = threading.Event()
    updater = threading.Thread(target=_paced, args=(server.port, updates, updating, stop), daemon=True)
    updater.start()
    period = duration / pairs
    with load:
        time.sleep(5)
        for pair in range(pairs):
            for phase in (("with", "without") if pair % 2 == 0 else ("without", "with")):
                load.phase = None
                if phase == "with":
                    updating.set()
                else:
                    updating.clear()
                time.sleep(0.5)
                load.phase = phase
                time.sleep(period)
        load.phase = None
        stop.set()
        updating.set()
        updater.join()
    p50 = {phase: statistics.median(load.by_phase[phase]) * 1000 for phase in ("with", "without")}
    p99 = {phase: _p99(load.by_phase[phase]) for phase in ("with", "without")}
    counts = {phase: len(load.by_phase[phase]) for phase in ("with", "without")}
    print(f"tiered         updates  c={concurrency:<2} with 10,000 updated rows/s: p50 {p50['with']:.2f} "
          f"p99 {p99['with']:.2f} ms ({counts['with']} requests), without: p50 {p50['without']:.2f} "
          f"p99 {p99['without']:.2f} ms ({counts['without']}), p99 ratio {p99['with'] / p99['without']:.2f} "
          f"({pairs} alternating pairs)", flush=True)
    return load.sent


def _p99(latencies: list[float]) -> float:
    ordered = sorted(latencies)
    return ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))] * 1000


def limit(vectors: np.ndarray, dense: Path, requests: list[np.ndarray], values: np.ndarray) -> float:
    """Median ms of a request in this process: gather from RAM, then the dense model (50 requests)."""
    session = ort.InferenceSession(str(dense), providers=["CPUExecutionProvider"])
    times = []
    for rows in requests[:50]:
        started = time.perf_counter()
        embeddings = vectors[rows]
        session.run(None, {"emb_raw": embeddings, "feat_vals": values})
        times.append(time.perf_counter() - started)
    return statistics.median(times) * 1000


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--cache", type=float, default=0.1)
    parser.add_argument("--warmup", type=float, default=30.0)
    parser.add_argument("--duration", type=float, default=20.0)
    parser.add_argument("--concurrency", default="1,8")
    parser.add_argument("--traffic", default="zipf1.0,zipf1.2,uniform")
    parser.add_argument("--requests", type=int, default=8000,
                        help="distinct requests per traffic (more than a configuration sends: none is sent twice)")
    parser.add_argument("--work", type=Path, default=None, help="where a new temporary directory is made")
    parser.add_argument("--table-dir", type=Path, default=None,
                        help="reuse the table and repositories an earlier run built here (built there if absent)")
    parser.add_argument("--server-env", default="",
                        help="KEY=VALUE,... set in the servers' environment (e.g. MALLOC_ARENA_MAX=2)")
    parser.add_argument("--updates-at", default=None,
                        help="concurrencies at which the update p99 ratio is measured (default: the highest; none)")
    parser.add_argument("--configurations", default="tiered,no,in", help="of tiered,no (no cache),in (in RAM)")
    parser.add_argument("--compaction", type=int, default=None, metavar="LOG_BYTES",
                        help="only a compaction through the server, of a log past LOG_BYTES "
                        "(embedding_store_compaction.py)")
    args = parser.parse_args()
    concurrency = [int(c) for c in args.concurrency.split(",")]
    traffics = args.traffic.split(",")
    if args.table_dir is not None:
        work = args.table_dir
        work.mkdir(parents=True, exist_ok=True)
    else:
        work = Path(tempfile.mkdtemp(dir=args.work))
    server_env = dict(item.split("=", 1) for item in args.server_env.split(",") if item)
    updates_at = [] if args.updates_at == "none" else \
        [int(c) for c in args.updates_at.split(",")] if args.updates_at else concurrency[-1:]
    ids = feature_ids(args.rows)
    print(f"table {args.rows:,} x {args.dim} float32 ({args.rows * args.dim * 4 / 1e9:.2f} GB), "
          f"cache {args.cache:.0%}, {work}", flush=True)
    started = time.perf_counter()
    vectors_path = work / "vectors.npy"
    if vectors_path.exists() and np.load(vectors_path, mmap_mode="r").shape == (args.rows, args.dim):
        vectors = np.load(vectors_path, mmap_mode="r")
    else:
        vectors = make_vectors(vectors_path, args.rows, args.dim)
    tiered, in_ram = write_repositories(work, ids, vectors, args.dim, "in" in args.configurations.split(","))
    print(f"built in {time.perf_counter() - started:.0f} s", flush=True)
    values = np.random.default_rng(2).random((CANDIDATES, FIELDS), dtype=np.float32)
    rows_by_traffic, bodies, ram_bodies = {}, {}, {}
    for name in traffics:
        popularity = Popularity(args.rows, TRAFFIC[name], seed=7)
        rows = [request_ids(popularity).astype(np.int32) for _ in range(args.requests)]
        rows_by_traffic[name] = rows
        # Bodies are made as they are sent (0.2 ms each), from rows drawn ahead: enough that none is sent twice.
        bodies[name] = [partial(lambda r: v2_body({"feat_ids": ids[r], "feat_vals": values}), r) for r in rows]
        # The ONNX model gathers row numbers: its users map ids to rows (a vocabulary) before they call it.
        ram_bodies[name] = [partial(lambda r: v2_body({"feat_ids": r.astype(np.int64), "feat_vals": values}), r)
                            for r in rows]
    rng = np.random.default_rng(3)
    updates = [v2_body({"ids": ids[rng.choice(args.rows, 1000, replace=False)],
                        "vectors": rng.standard_normal((1000, args.dim)).astype(np.float32) * 0.05})
               for _ in range(50)]
    cache_bytes = int(args.rows * args.dim * 4 * args.cache)
    if args.compaction is not None:
        from benchmarks.embedding_store_compaction import compaction_run  # it imports this module's parts

        compaction_run(tiered, args.work or work, ids, args.dim, bodies[traffics[0]],
                       ["--embedding-cache-bytes", str(cache_bytes), "--embedding-updates"], concurrency[0],
                       args.warmup, args.duration, args.compaction)
        return 0
    in_ram_vectors = np.ascontiguousarray(vectors)
    limit_ms = limit(in_ram_vectors, tiered / "dense" / "1" / "model.onnx", rows_by_traffic[traffics[0]], values)
    print(f"limit (in-process gather from RAM + dense model): p50 {limit_ms:.2f} ms", flush=True)
    del in_ram_vectors
    results: list[tuple[str, str, int, dict[str, Any], float]] = []
    configurations = [(label, repository, flags) for label, repository, flags in (
        ("tiered", tiered, ["--embedding-cache-bytes", str(cache_bytes), "--embedding-updates"]),
        ("no cache", tiered, ["--embedding-cache-bytes", "0"]),
        ("in RAM (ONNX)", in_ram, []),
    ) if label.split(" ")[0].lower() in args.configurations.split(",")]
    for label, repository, flags in configurations:
        for traffic in (traffics if label == "tiered" else traffics[:1]):
            drop_page_cache()
            server = ServerProcess(repository, *flags, env=server_env)
            try:
                server.wait_ready(timeout=600)
                used = 0  # requests this server has been sent: the next cell's are new to it
                for c in concurrency:
                    sent = ram_bodies if repository == in_ram else bodies
                    result = cell(server, sent[traffic][used:], c, args.warmup, args.duration,
                                  cycle=repository == in_ram)
                    used = 0 if repository == in_ram else used + result["sent"]
                    results.append((label, traffic, c, result, rss_mb(server.process.pid)))
                    print(f"{label:14} {traffic:8} c={c:<2} {result['rps']:7.1f} req/s  p50 {result['p50']:8.2f} ms"
                          f"  p99 {result['p99']:8.2f} ms  hit {result['hit']:.3f}  RSS peak "
                          f"{result['peak_rss']:5.0f}, after {results[-1][4]:5.0f} MB "
                          f"(anon {rss_mb(server.process.pid, 'RssAnon'):.0f}, files "
                          f"{rss_mb(server.process.pid, 'RssFile'):.0f})  failures {result['failures']}", flush=True)
                if label == "tiered" and traffic == traffics[0]:
                    for c in updates_at:
                        used += update_ratio(server, bodies[traffic][used:], c, args.duration, updates)
            finally:
                server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
