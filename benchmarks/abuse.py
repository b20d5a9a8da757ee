"""Abuse benchmark: what hostile or broken clients cost a live server, one run.

    python benchmarks/abuse.py [--clients 1000] [--declared 200] [--hold 10] [--overload-seconds 5]
                               [--overload-rounds 3] [--server-cpus 0 --generator-cpus 1]
                               [--json results.json] [-- extra modelhost serve flags]

Part 1, edge attacks on the HTTP port (each while a well-behaved client sends `tiny` requests one
after another over one keep-alive connection, and the server's RSS is sampled every 100 ms):
- slow headers: N clients send a request line, then one header line every 2 s, never finishing;
- idle: N clients connect and send nothing;
- declared bodies: M clients declare a 64 MiB body (Content-Length) and send 1 KiB of it.
Each row gives RSS before, peak during and after the clients leave (3 s later), the `tiny` client's
p50/p99, and how many attack connections the server had closed by the end of the hold.

Part 2, overload: a CPU-bound ONNX MLP (18 MB of weights; 256 rows of 256 features per request) with
a bounded queue (`max_queue_size` 16). Capacity is what 4 closed-loop clients get; then requests
arrive open-loop at 10x that rate; the two alternate for --overload-rounds rounds. Reported (medians of
the rounds): accepted (200) throughput as a share of capacity, rejection (503) latency beside the floor
(a health check sent by the same generator at the same rate), and whether every accepted answer equals
in-process onnxruntime's.

The load generator is Python (asyncio over raw sockets) in its own process. Unless --server-cpus and
--generator-cpus pin them apart, it shares the server's cores, so read ratios, not absolute figures.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import http.client
import json
import multiprocessing
import os
import resource
import socket
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import orjson
from onnx import TensorProto, helper, numpy_helper

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.cpu_list import cpu_list  # noqa: E402
from modelhost.example_repository import ensure_example_repository  # noqa: E402
from tests.server import ServerProcess  # noqa: E402

TINY = np.array([[1.0, 2.0, 3.0, 4.0]], dtype=np.float32)
FEATURES, HIDDEN, ROWS, QUEUE = 256, 2048, 256, 16


# --------------------------------------------------------------------------- part 1: edge attacks


def rss_mib(pid: int) -> float:
    """Resident MiB of a process; 0 once it has exited (a zombie has no VmRSS)."""
    try:
        lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    except OSError:
        return 0.0
    return next((int(line.split()[1]) / 1024 for line in lines if line.startswith("VmRSS:")), 0.0)


def binary_infer(name: str, output: str, array: np.ndarray) -> tuple[bytes, dict[str, str]]:
    header = orjson.dumps({
        "inputs": [{"name": name, "datatype": "FP32", "shape": list(array.shape),
                    "parameters": {"binary_data_size": array.nbytes}}],
        "outputs": [{"name": output, "parameters": {"binary_data": True}}],
    })
    return header + array.tobytes(), {"Inference-Header-Content-Length": str(len(header)),
                                      "Content-Type": "application/octet-stream"}


class Sampler:
    """Peak RSS of a process, sampled every 100 ms in a thread."""

    def __init__(self, pid: int) -> None:
        self.pid, self.peak, self._stop = pid, 0.0, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, rss_mib(self.pid))
            self._stop.wait(0.1)

    def stop(self) -> float:
        self._stop.set()
        self._thread.join()
        return self.peak


def probe(port: int, seconds: float) -> list[float]:
    """`tiny` requests back to back over one keep-alive connection for `seconds`: latencies in ms."""
    body, headers = binary_infer("x", "y", TINY)
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    times, deadline = [], time.monotonic() + seconds
    while time.monotonic() < deadline:
        start = time.perf_counter()
        connection.request("POST", "/v2/models/tiny/infer", body, headers)
        response = connection.getresponse()
        response.read()
        if response.status != 200:
            raise RuntimeError(f"tiny answered {response.status}")
        times.append((time.perf_counter() - start) * 1e3)
    connection.close()
    return times


def open_clients(port: int, count: int, first: bytes) -> list[socket.socket]:
    sockets = []
    for _ in range(count):
        sock = socket.create_connection(("127.0.0.1", port))
        if first:
            sock.sendall(first)
        sock.setblocking(False)
        sockets.append(sock)
    return sockets


def trickle(sockets: list[socket.socket], data: bytes, every: float, stop: threading.Event) -> None:
    while not stop.wait(every):
        for sock in sockets:
            try:
                sock.send(data)
            except OSError:
                pass


def closed_by_server(sockets: list[socket.socket]) -> int:
    closed = 0
    for sock in sockets:
        try:
            data = sock.recv(65536)
            closed += not data or data.startswith(b"HTTP/1.1 4")  # EOF, or a refusal before the close
        except BlockingIOError:
            pass
        except OSError:
            closed += 1
    return closed


def attack(server: ServerProcess, label: str, count: int, first: bytes, drip: bytes, hold: float) -> dict:
    pid = server.process.pid
    probe(server.port, 1.0)  # warm
    time.sleep(1.0)
    before = rss_mib(pid)
    sampler = Sampler(pid)
    stop = threading.Event()
    sockets = open_clients(server.port, count, first)
    dripper = threading.Thread(target=trickle, args=(sockets, drip, 2.0, stop), daemon=True) if drip else None
    if dripper:
        dripper.start()
    try:
        times = probe(server.port, hold)
    except OSError as exc:  # the server died (out of memory) or stopped answering
        times = []
        print(f"{label}: the tiny client failed: {exc!r}; server exit code {server.process.poll()}", flush=True)
    closed = closed_by_server(sockets)
    stop.set()
    if dripper:
        dripper.join()
    for sock in sockets:
        sock.close()
    time.sleep(3.0)
    peak = sampler.stop()
    after = rss_mib(pid)
    quantiles = statistics.quantiles(times, n=100) if len(times) > 1 else [float("nan")] * 99
    row = {"attack": label, "clients": count, "rss_before_mib": before, "rss_peak_mib": peak,
           "rss_after_mib": after, "peak_over_before": peak / before, "tiny_requests": len(times),
           "tiny_p50_ms": statistics.median(times) if times else float("nan"), "tiny_p99_ms": quantiles[98],
           "closed_by_server": closed, "server_alive": server.process.poll() is None}
    print(f"{label}: RSS {before:.0f} -> peak {peak:.0f} ({peak / before:.2f}x) -> after {after:.0f} MiB; "
          f"tiny p50 {row['tiny_p50_ms']:.2f} ms p99 {row['tiny_p99_ms']:.2f} ms over {len(times)} requests; "
          f"{closed}/{count} closed by the server", flush=True)
    return row


def edge_attacks(args: argparse.Namespace, cache: Path) -> list[dict]:
    """Each attack on a fresh server, so that one's leftovers (or death) do not skew the next."""
    head = b"POST /v2/models/tiny/infer HTTP/1.1\r\nHost: x\r\n"
    declared = head + b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % (64 * 1024**2)
    attacks = [("slow headers", args.clients, head, b"X-Slow: 1\r\n"),
               ("idle connections", args.clients, b"", b""),
               ("declared 64 MiB bodies", args.declared, declared + b"{" * 1024, b"")]
    rows = []
    for label, count, first, drip in attacks:
        server = ServerProcess(None, *args.serve_flags, cache_dir=cache).wait_ready()
        try:
            rows.append(attack(server, label, count, first, drip, args.hold))
        finally:
            server.stop()
    return rows


# --------------------------------------------------------------------------- part 2: overload


def mlp_repository(root: Path) -> tuple[Path, np.ndarray, np.ndarray]:
    """An ONNX MLP FEATURES -> HIDDEN -> HIDDEN -> 1 with a bounded queue; (repository, input, expected)."""
    rng = np.random.default_rng(0)
    weights = [(rng.standard_normal(shape) / np.sqrt(shape[0])).astype(np.float32)
               for shape in ((FEATURES, HIDDEN), (HIDDEN, HIDDEN), (HIDDEN, 1))]
    nodes, previous = [], "features"
    for i in range(3):
        nodes.append(helper.make_node("MatMul", [previous, f"w{i}"], [f"m{i}"]))
        previous = f"m{i}"
        if i < 2:
            nodes.append(helper.make_node("Relu", [previous], [f"r{i}"]))
            previous = f"r{i}"
    nodes.append(helper.make_node("Identity", [previous], ["score"]))
    graph = helper.make_graph(
        nodes, "mlp", [helper.make_tensor_value_info("features", TensorProto.FLOAT, ["batch", FEATURES])],
        [helper.make_tensor_value_info("score", TensorProto.FLOAT, ["batch", 1])],
        [numpy_helper.from_array(w, f"w{i}") for i, w in enumerate(weights)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    directory = root / "mlp"
    (directory / "1").mkdir(parents=True)
    onnx.save_model(model, str(directory / "1" / "model.onnx"))
    (directory / "config.pbtxt").write_text(f"""
platform: "onnxruntime_onnx"
max_batch_size: {ROWS * 4}
input [ {{ name: "features" data_type: TYPE_FP32 dims: [ {FEATURES} ] }} ]
output [ {{ name: "score" data_type: TYPE_FP32 dims: [ 1 ] }} ]
dynamic_batching {{ default_queue_policy {{ max_queue_size: {QUEUE} }} }}
""")
    features = rng.standard_normal((ROWS, FEATURES)).astype(np.float32)
    expected = ort.InferenceSession(str(directory / "1" / "model.onnx")).run(None, {"features": features})[0]
    return root, features, expected


class _Connection:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    async def call(self, request: bytes) -> tuple[int, bytes]:
        self.writer.write(request)
        head = await self.reader.readuntil(b"\r\n\r\n")
        status = int(head[9:12])
        length = 0
        for line in head.split(b"\r\n")[1:]:
            if line[:15].lower() == b"content-length:":
                length = int(line[15:])
        return status, await self.reader.readexactly(length)


async def _generate(port: int, request: bytes, rate: float | None, clients: int, seconds: float) -> list[tuple]:
    """Open loop at `rate` requests/s (None: `clients` closed-loop clients): [(status, ms, body)]."""
    idle: list[_Connection] = []
    results: list[tuple] = []

    async def connection() -> _Connection:
        return idle.pop() if idle else _Connection(*await asyncio.open_connection("127.0.0.1", port))

    async def one() -> None:
        conn = await connection()
        start = time.perf_counter()
        try:
            status, body = await conn.call(request)
        except (OSError, asyncio.IncompleteReadError):
            results.append((0, (time.perf_counter() - start) * 1e3, b""))
            return
        results.append((status, (time.perf_counter() - start) * 1e3, body))
        idle.append(conn)

    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    if rate is None:
        async def client() -> None:
            while loop.time() < deadline:
                await one()
        await asyncio.gather(*(client() for _ in range(clients)))
        return results
    tasks, start, sent = [], loop.time(), 0
    while loop.time() < deadline:
        due = start + sent / rate
        if due > loop.time():
            await asyncio.sleep(due - loop.time())
        tasks.append(asyncio.ensure_future(one()))
        sent += 1
    await asyncio.gather(*tasks)
    return results


def _generate_in_process(port: int, request: bytes, rate: float | None, clients: int, seconds: float,
                         cpus: set[int] | None, queue: multiprocessing.Queue) -> None:
    import uvloop

    if cpus:
        os.sched_setaffinity(0, cpus)
    gc.disable()  # a collection pass over the results would show as the server's latency

    started = time.process_time()
    results = uvloop.run(_generate(port, request, rate, clients, seconds))
    queue.put((results, time.process_time() - started))


def generate(port: int, request: bytes, rate: float | None, clients: int, seconds: float,
             cpus: set[int] | None = None) -> tuple[list[tuple], float]:
    """Runs the generator in its own process (on `cpus`, when given), so the measuring process's threads cost
    the server nothing. Returns the results and the CPU seconds the generator itself used."""
    queue: multiprocessing.Queue = multiprocessing.Queue()
    process = multiprocessing.Process(target=_generate_in_process,
                                      args=(port, request, rate, clients, seconds, cpus, queue))
    process.start()
    results, cpu = queue.get()
    process.join()
    return results, cpu


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds a process has used (all its threads)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def overload(args: argparse.Namespace, work: Path) -> dict:
    repository, features, expected = mlp_repository(work / "overload")
    own = os.sched_getaffinity(0)
    if args.server_cpus:
        os.sched_setaffinity(0, args.server_cpus)  # inherited by the server and every thread it starts
    try:
        server = ServerProcess(repository, *args.serve_flags)
    finally:
        os.sched_setaffinity(0, own)
    server.wait_ready()
    cpus, seconds = args.generator_cpus, args.overload_seconds
    rounds: list[dict] = []
    try:
        body, headers = binary_infer("features", "score", features)
        request = (b"POST /v2/models/mlp/infer HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n" % len(body)
                   + b"".join(f"{k}: {v}\r\n".encode() for k, v in headers.items()) + b"\r\n" + body)
        pid = server.process.pid
        generate(server.port, request, None, 4, 2.0, cpus)  # warm
        for _ in range(args.overload_rounds):
            # Capacity and flood alternate, so that the machine's drift (it is shared) hits both alike.
            before = cpu_seconds(pid)
            closed, closed_generator_cpu = generate(server.port, request, None, 4, seconds, cpus)
            closed_cpu = cpu_seconds(pid) - before
            capacity = sum(1 for r in closed if r[0] == 200) / seconds
            before = cpu_seconds(pid)
            flood, flood_generator_cpu = generate(server.port, request, capacity * 10, 0, seconds, cpus)
            flood_cpu = cpu_seconds(pid) - before
            rounds.append(_round(seconds, capacity, flood, expected, closed_cpu, flood_cpu, closed_generator_cpu,
                                 flood_generator_cpu))
            print("overload round: " + ", ".join(f"{k} {v:.3g}" for k, v in rounds[-1].items()), flush=True)
        # The floor: the same generator at the flood's rejection rate, against a health check of the server
        # with its model idle. What the machine and the generator themselves add to any answer's latency.
        rate = statistics.median(r["rejected"] for r in rounds) / seconds
        floor, _ = generate(server.port, b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n", rate, 0, seconds, cpus)
    finally:
        server.stop()
    floor_ms = [r[1] for r in floor if r[0] == 200]
    row = {key: statistics.median(r[key] for r in rounds) for key in rounds[0]}
    row |= {"rounds": rounds, "floor_p50_ms": statistics.median(floor_ms),
            "floor_p99_ms": statistics.quantiles(floor_ms, n=100)[98]}
    print(f"overload (median of {len(rounds)} rounds): capacity {row['capacity_rps']:.0f} req/s; accepted "
          f"{row['accepted_share']:.0%} of capacity; rejections p50 {row['reject_p50_ms']:.2f} ms, p99 "
          f"{row['reject_p99_ms']:.2f} ms (floor: a health check at the same rate, p50 {row['floor_p50_ms']:.2f} ms, "
          f"p99 {row['floor_p99_ms']:.2f} ms); {sum(r['other'] for r in rounds)} other answers; "
          f"{sum(r['wrong_answers'] for r in rounds)} wrong answers; server CPU {row['server_cores_at_capacity']:.2f} "
          f"cores at capacity, {row['server_cores_flood']:.2f} under the flood; generator "
          f"{row['generator_cores_flood']:.2f} cores under the flood", flush=True)
    return row


def _round(seconds: float, capacity: float, flood: list[tuple], expected: np.ndarray, closed_cpu: float,
           flood_cpu: float, closed_generator_cpu: float, flood_generator_cpu: float) -> dict:
    accepted = [r for r in flood if r[0] == 200]
    rejected = [r[1] for r in flood if r[0] == 503]
    return {
        "capacity_rps": capacity, "offered_rps": capacity * 10, "sent": len(flood),
        "accepted_rps": len(accepted) / seconds, "accepted_share": len(accepted) / seconds / capacity,
        "rejected": len(rejected), "other": sum(1 for r in flood if r[0] not in (200, 503)),
        "wrong_answers": sum(1 for r in accepted if not _correct(r[2], expected)),
        "reject_p50_ms": statistics.median(rejected) if rejected else float("nan"),
        "reject_p99_ms": statistics.quantiles(rejected, n=100)[98] if len(rejected) > 1 else float("nan"),
        "accepted_p50_ms": statistics.median(r[1] for r in accepted) if accepted else float("nan"),
        # CPU (cores) of the server and of the generator, at capacity and under the flood: unless they are
        # pinned apart (--server-cpus, --generator-cpus), the generator's share comes from the server's cores.
        "server_cores_at_capacity": closed_cpu / seconds, "server_cores_flood": flood_cpu / seconds,
        "generator_cores_at_capacity": closed_generator_cpu / seconds,
        "generator_cores_flood": flood_generator_cpu / seconds,
    }


def _correct(body: bytes, expected: np.ndarray) -> bool:
    got = np.frombuffer(body[-expected.nbytes:], dtype=np.float32).reshape(expected.shape)
    return bool(np.allclose(got, expected, rtol=1e-4, atol=1e-5))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", type=int, default=1000, help="slow-header and idle clients")
    parser.add_argument("--declared", type=int, default=200, help="clients declaring 64 MiB bodies")
    parser.add_argument("--hold", type=float, default=10.0, help="seconds each attack lasts")
    parser.add_argument("--overload-seconds", type=float, default=5.0, help="of each capacity and flood phase")
    parser.add_argument("--overload-rounds", type=int, default=3, help="capacity/flood alternations (medians)")
    parser.add_argument("--server-cpus", type=cpu_list, help="overload: run the server on these CPUs (e.g. 0)")
    parser.add_argument("--generator-cpus", type=cpu_list,
                        help="overload: run the load generator on these CPUs (e.g. 1), off the server's")
    parser.add_argument("--skip-overload", action="store_true")
    parser.add_argument("--skip-edge", action="store_true")
    parser.add_argument("--json", type=Path, help="also write the raw results here")
    parser.add_argument("serve_flags", nargs="*", help="extra `modelhost serve` flags (after --)")
    args = parser.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 65536)), hard))  # the server inherits it
    work = Path(tempfile.mkdtemp(prefix="modelhost-abuse-"))
    ensure_example_repository(work / "cache")
    results = {} if args.skip_edge else {"edge": edge_attacks(args, work / "cache")}
    if not args.skip_overload:
        results["overload"] = overload(args, work)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
