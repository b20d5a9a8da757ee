"""Multi-model endpoint benchmark: modelhost and a naive aiohttp peer vs in-process onnxruntime, one run.

    python benchmarks/multi_model.py [--duration 20] [--zipf 1.0,1.2] [--json results.json]

Needs aiohttp (the load generator, and the peer `benchmarks/peers/naive_mme.py`). From the SageMaker
issue: --models `model.tar.gz` archives of a small ONNX model (tests/archives.py's weighted_model,
--width float32 features, OUTPUT0 = INPUT0 + W) and a cache that holds 50 of them. Measured for
modelhost (`serve --multi-model`), the peer and the limit (onnxruntime in-process, no HTTP):
- loaded-model memory: process RSS growth per model over --memory-models loads after a first one,
  and for modelhost what its cache charges per model (modelhost_model_cache_bytes);
- cold load vs cache hit at concurrency 1: cold = the first request to a model that is not loaded
  (download + unpack + load + run), on a cache still filling and on a full one (which evicts);
  hit = --hits requests to one loaded model; with the server's CPU time per request;
- Zipf traffic over all models (the r-th most popular drawn with probability ~ 1/r^s, fixed seed)
  from --concurrency aiohttp clients for --duration s after --warmup s: req/s, p50, p99, cache hit
  ratio, evictions, models loaded before and after. The limit replays the same requests on one thread;
  the peer runs them again holding as many models as modelhost's cache held (mean of before and after).
modelhost's budget (--model-cache-bytes) is 50 x the per-model size its cache charged in the memory
phase, plus 5 %; the peer and the limit keep 50 sessions by count (an OrderedDict LRU). Sessions
everywhere use modelhost's options (intra-op threads = cores, no spinning). Every answer is checked
(its first value is the model's number + 1). Load generator, servers and limit share the machine's
cores: read ratios, not absolute figures.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import OrderedDict, deque
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import onnxruntime as ort
import requests

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks" / "peers"))

from naive_mme import load  # noqa: E402

from tests.archives import write_archives  # noqa: E402
from tests.server import ServerProcess, free_port  # noqa: E402

PEER = ROOT / "benchmarks" / "peers" / "naive_mme.py"
CACHE_MODELS = 50
COLD_MODELS = 60
MATCHED = "peer at modelhost's count"
TIMINGS = ("loading_wait", "downloading", "loading", "unloading")
Streams = list[list[int]]


def archive(i: int) -> str:
    return f"model-{i}.tar.gz"


def resident_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        return next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmRSS:"))


def cpu_seconds(pid: int) -> float:
    """CPU time (user + system) process `pid` has used, its exited threads included; 10 ms ticks."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def ms(seconds: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(seconds) * 1e3, q))


def zipf_sequences(count: int, s: float, streams: int, length: int, draw_seed: int) -> Streams:
    """`streams` request sequences of model numbers; popularity rank r (1-based) drawn with p ~ 1/r^s.
    Ranks go to models by one fixed permutation (popularity unrelated to load order); `draw_seed`
    picks the draws, so warm-up and measurement share the popularity but not the sequence."""
    by_rank = np.random.default_rng(4).permutation(count)
    p = 1.0 / np.arange(1, count + 1) ** s
    rng = np.random.default_rng(draw_seed)
    return [by_rank[rng.choice(count, size=length, p=p / p.sum())].tolist() for _ in range(streams)]


class Client:
    """aiohttp requests to one server's /invocations; every answer checked."""

    def __init__(self, url: str, width: int) -> None:
        self.url = url
        self.body = ",".join(["1"] * width).encode()
        self.session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))
        self.last_error = ""  # the body of the last answer that was not a 200

    async def invoke(self, i: int) -> tuple[int, float]:
        """(status, seconds); a 200 must answer model i's prediction."""
        headers = {"Content-Type": "text/csv", "Accept": "application/json",
                   "X-Amzn-SageMaker-Target-Model": archive(i)}
        started = time.perf_counter()
        async with self.session.post(self.url, data=self.body, headers=headers) as response:
            content = await response.read()
        elapsed = time.perf_counter() - started
        if response.status == 200 and not content.startswith(b'{"predictions":[[%d.0,' % (i + 1)):
            raise AssertionError(f"model {i} answered {content[:80]!r}")
        if response.status != 200:
            self.last_error = content[:400].decode("utf-8", "replace")
        return response.status, elapsed

    async def ok(self, i: int) -> float:
        status, elapsed = await self.invoke(i)
        if status != 200:
            raise RuntimeError(f"{self.url} answered {status} for model {i}: {self.last_error}")
        return elapsed

    async def sequential(self, models: list[int]) -> list[float]:
        return [await self.ok(i) for i in models]

    async def traffic(self, streams: Streams, seconds: float) -> tuple[list[float], float]:
        """Each stream from its own task, back to back, for `seconds`: (latencies, elapsed seconds)."""
        latencies: list[float] = []
        deadline = time.perf_counter() + seconds

        async def worker(stream: list[int]) -> None:
            for i in stream:
                if time.perf_counter() >= deadline:
                    return
                latencies.append(await self.ok(i))
            raise RuntimeError("request sequence too short for the duration")

        started = time.perf_counter()
        await asyncio.gather(*(worker(s) for s in streams))
        return latencies, time.perf_counter() - started

    async def close(self) -> None:
        await self.session.close()


class ServerUnderTest:
    """What the phases read from a server process: its counters, CPU time and resident memory."""

    label = ""
    pid = 0
    warnings: list[str] = []  # what it logged above INFO, at stop

    def counters(self) -> dict[str, float]:
        raise NotImplementedError

    def loaded(self) -> float:
        return self.counters()["loaded"]

    def cpu(self) -> float:
        return cpu_seconds(self.pid)

    def rss(self) -> int:
        return resident_bytes(self.pid)


class InProcess(ServerUnderTest):
    """The limit, client and server in one: on a miss the peer's load (untar + InferenceSession), then
    run; on a hit run; an LRU of `capacity` sessions. Its traffic interleaves the streams on one thread."""

    label = "limit"

    def __init__(self, root: Path, width: int, capacity: int) -> None:
        self.root = root
        self.feeds = {"INPUT0": np.ones((1, width), np.float32)}
        self.capacity = capacity
        self.sessions: OrderedDict[int, ort.InferenceSession] = OrderedDict()
        self.counts = {"hits": 0.0, "misses": 0.0, "evictions": 0.0}

    def run(self, i: int) -> float:
        started = time.perf_counter()
        if i not in self.sessions:
            self.counts["misses"] += 1
            self.sessions[i] = load(self.root / archive(i))
            while len(self.sessions) > self.capacity:
                self.sessions.popitem(last=False)
                self.counts["evictions"] += 1
        else:
            self.counts["hits"] += 1
        self.sessions.move_to_end(i)
        result = self.sessions[i].run(None, self.feeds)[0]
        elapsed = time.perf_counter() - started
        assert result[0, 0] == i + 1, f"model {i} answered {result[0, 0]}"
        return elapsed

    async def invoke(self, i: int) -> tuple[int, float]:
        return 200, self.run(i)

    async def sequential(self, models: list[int]) -> list[float]:
        return [self.run(i) for i in models]

    async def traffic(self, streams: Streams, seconds: float) -> tuple[list[float], float]:
        latencies, started = [], time.perf_counter()
        for at_once in zip(*streams):
            latencies += [self.run(i) for i in at_once]
            if time.perf_counter() - started >= seconds:
                break
        return latencies, time.perf_counter() - started

    def client(self, width: int) -> InProcess:
        return self

    async def close(self) -> None:
        pass

    def counters(self) -> dict[str, float]:
        return {**self.counts, "loaded": float(len(self.sessions))}

    def cpu(self) -> float:
        return time.process_time()

    def rss(self) -> int:
        return resident_bytes(os.getpid())

    def stop(self) -> None:
        self.sessions.clear()


class Modelhost(ServerUnderTest):
    label = "modelhost"

    def __init__(self, root: Path, workdir: Path, budget: int, priority: str = "auto",
                 flags: tuple[str, ...] = ()) -> None:
        self.server = ServerProcess(root, "--multi-model", "--model-cache-bytes", str(budget),
                                    "--compute-priority", priority, *flags,
                                    cache_dir=Path(tempfile.mkdtemp(dir=workdir)))
        self.server.wait_ready(path=self.server.sagemaker + "/ping")
        self.pid = self.server.process.pid
        # ServerProcess pipes the server's log and reads it only at stop: a full pipe (64 KiB, a few
        # hundred loads' log lines) blocks the server's event loop.
        self.log: deque[str] = deque(maxlen=200)
        threading.Thread(target=self._drain, daemon=True).start()

    def _drain(self) -> None:
        assert self.server.process.stdout is not None
        for line in self.server.process.stdout:
            self.log.append(line)

    def client(self, width: int) -> Client:
        return Client(self.server.sagemaker + "/invocations", width)

    def counters(self) -> dict[str, float]:
        """hits, misses, evictions, loaded, bytes, and <timing>_sum / <timing>_count for TIMINGS."""
        text = requests.get(f"http://127.0.0.1:{self.server.metrics_port}/metrics", timeout=10).text
        raw = dict(line.removeprefix("modelhost_").split() for line in text.splitlines()
                   if line.startswith("modelhost_") and "{" not in line)
        names = {name: f"model_cache_{name}_total" for name in ("hits", "misses", "evictions")}
        names |= {"loaded": "loaded_models", "bytes": "model_cache_bytes"}
        names |= {f"{t}_{part}": f"model_{t}_seconds_{part}" for t in TIMINGS for part in ("sum", "count")}
        return {name: float(raw[metric]) for name, metric in names.items()}

    def stop(self) -> None:
        self.server.stop()
        self.warnings = [line for line in self.log if " INFO " not in line]


class NaivePeer(ServerUnderTest):
    label = "naive peer"

    def __init__(self, root: Path, capacity: int) -> None:
        port = free_port()
        self.process = subprocess.Popen([sys.executable, str(PEER), str(root), str(port), str(capacity)])
        self.pid = self.process.pid
        self.base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while True:
            try:
                if requests.get(self.base + "/ping", timeout=1).ok:
                    break
            except requests.ConnectionError:
                if time.monotonic() > deadline:
                    raise TimeoutError("naive peer did not start") from None
                time.sleep(0.1)

    def client(self, width: int) -> Client:
        return Client(self.base + "/invocations", width)

    def counters(self) -> dict[str, float]:
        """hits, misses, evictions, loaded (the peer counts them for this benchmark)."""
        return {k: float(v) for k, v in requests.get(self.base + "/loaded", timeout=10).json().items()}

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait()


Subject = InProcess | Modelhost | NaivePeer


async def memory(subject: Subject, width: int, loads: int) -> dict[str, Any]:
    """RSS growth per model over `loads` loads after a first one (which pays one-time costs)."""
    client = subject.client(width)
    try:
        started = subject.rss()
        first_status, _ = await client.invoke(0)
        rss0, counters0 = subject.rss(), subject.counters()
        await client.sequential(list(range(1, loads + 1)))
        rss1, counters1 = subject.rss(), subject.counters()
    finally:
        await client.close()
        subject.stop()
    result = {"first_status": first_status, "rss_first": rss0 - started, "rss_per_model": (rss1 - rss0) / loads}
    if "bytes" in counters1:
        result |= {"charged_first": counters0["bytes"], "charged_per_model": (counters1["bytes"] - counters0["bytes"])
                   / loads, "charged_mean": counters1["bytes"] / counters1["loaded"]}
    return result


def delta(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    return {name: after[name] - before[name] for name in after if name in before}


async def cold_and_hit(subject: Subject, client: Client | InProcess, hits: int) -> dict[str, Any]:
    """Cold loads on a filling cache (models 1..49), on a full one (the next COLD_MODELS), then hits."""
    status, _ = await client.invoke(0)
    if status != 200:
        await client.sequential([0])  # modelhost's first load can be refused: reported, then retried
    result: dict[str, Any] = {"first_status": status}
    result["cold_filling"] = await client.sequential(list(range(1, CACHE_MODELS)))
    result["loaded_after_fill"] = subject.loaded()
    before, cpu = subject.counters(), subject.cpu()
    result["cold_full"] = await client.sequential(list(range(CACHE_MODELS, CACHE_MODELS + COLD_MODELS)))
    result["cold_cpu"] = (subject.cpu() - cpu) / COLD_MODELS
    result["cold_counters"] = delta(before, subject.counters())
    cpu = subject.cpu()
    result["hit"] = await client.sequential([CACHE_MODELS + COLD_MODELS - 1] * hits)
    result["hit_cpu"] = (subject.cpu() - cpu) / hits
    return result


async def zipf(subject: Subject, client: Client | InProcess, warmup: Streams, measured: Streams,
               args: argparse.Namespace) -> dict[str, Any]:
    await client.traffic(warmup, args.warmup)
    # No scraping while measuring: modelhost renders /metrics on its event loop (~40 ms at 200 models).
    before, cpu = subject.counters(), subject.cpu()
    latencies, elapsed = await client.traffic(measured, args.duration)
    cpu = subject.cpu() - cpu
    after = subject.counters()
    counters = delta(before, after)
    return {"rps": len(latencies) / elapsed, "p50": ms(latencies, 50), "p99": ms(latencies, 99),
            "requests": len(latencies), "cpu_per_request": cpu / len(latencies), "cpu_share": cpu / elapsed,
            "hit_ratio": counters["hits"] / max(counters["hits"] + counters["misses"], 1),
            "evictions_per_s": counters["evictions"] / elapsed, "loaded": [before["loaded"], after["loaded"]],
            "counters": counters, "rss_end": subject.rss(), "charged_end": after.get("bytes")}


async def measure(subject: Subject, args: argparse.Namespace, traffic: dict[float, tuple[Streams, Streams]],
                  cold: bool = True) -> dict[str, Any]:
    client = subject.client(args.width)
    result: dict[str, Any] = {"label": subject.label}
    try:
        if cold:
            result |= await cold_and_hit(subject, client, args.hits)
            print(f"  {subject.label}: {_brief(result)}{_timings(result['cold_counters'])}", flush=True)
        for s, (warmup, measured) in traffic.items():
            z = result[f"zipf {s}"] = await zipf(subject, client, warmup, measured, args)
            print(f"  {subject.label}: Zipf s={s}: {_brief(z)}, loaded {z['loaded']}{_timings(z['counters'])}",
                  flush=True)
    finally:
        await client.close()
        subject.stop()
    result["server_warnings"] = subject.warnings
    for line in subject.warnings[-5:]:
        print(f"  {subject.label} logged: {line.rstrip()}")
    return result


def _timings(counters: dict[str, float]) -> str:
    """modelhost's cache histograms over a phase: means, and the misses and evictions in it."""
    if "loading_sum" not in counters:
        return ""
    means = [f"{t} {counters[f'{t}_sum'] / max(counters[f'{t}_count'], 1) * 1e3:.2f}" for t in TIMINGS]
    return f"\n    means ms: {', '.join(means)}; {counters['misses']:.0f} misses, {counters['evictions']:.0f} evictions"


def _brief(values: dict[str, Any]) -> str:
    return ", ".join(f"{k} {v:.4g}" for k, v in values.items() if isinstance(v, int | float))


def summary(memory: dict[str, Any], r: dict[str, Any], zipfs: list[float]) -> dict[str, float]:
    """One subject's figures by row name (the rows of docs/benchmarks.md); what it did not measure is left out."""
    row: dict[str, float] = {}
    if memory:
        row |= {"RSS growth, first model, MiB": memory["rss_first"] / 2**20,
                "RSS growth per model after it, KiB": memory["rss_per_model"] / 1024}
    if "charged_first" in memory:
        row |= {"cache charge, first model, MiB": memory["charged_first"] / 2**20,
                "cache charge per model after it, KiB": memory["charged_per_model"] / 1024}
    if "hit" in r:
        row |= {"cold p50 ms, cache filling": ms(r["cold_filling"], 50),
                "cold p50 ms, cache full": ms(r["cold_full"], 50), "cold p90 ms, cache full": ms(r["cold_full"], 90),
                "hit p50 ms": ms(r["hit"], 50), "hit p99 ms": ms(r["hit"], 99),
                "cold / hit, p50": ms(r["cold_full"], 50) / ms(r["hit"], 50),
                "CPU ms per cold request": r["cold_cpu"] * 1e3, "CPU ms per hit": r["hit_cpu"] * 1e3}
    for s in (s for s in zipfs if f"zipf {s}" in r):
        z = r[f"zipf {s}"]
        row |= {f"Zipf s={s}: {name}": value for name, value in (
            ("req/s", z["rps"]), ("p50 ms", z["p50"]), ("p99 ms", z["p99"]),
            ("CPU ms per request", z["cpu_per_request"] * 1e3), ("hit ratio", z["hit_ratio"]),
            ("evictions/s", z["evictions_per_s"]), ("models loaded at the start", z["loaded"][0]),
            ("models loaded at the end", z["loaded"][-1]))}
        if r["label"] != "limit":  # the limit's process is the load generator's too
            row[f"Zipf s={s}: server RSS MiB at the end"] = z["rss_end"] / 2**20
    return row


def _table(rows: dict[str, dict[str, float]]) -> str:
    """A markdown table: a column per subject, then modelhost's ratio to each other subject."""
    others = [label for label in rows if label != "modelhost"]
    lines = ["| measure | modelhost | " + " | ".join(others) + " | " + " | ".join(f"modelhost / {o}" for o in others)
             + " |", "|---" * (2 * len(others) + 2) + "|"]
    for name, ours in rows["modelhost"].items():
        values = [ours] + [rows[label].get(name) for label in others]
        cells = ["-" if v is None else f"{v:.0f}" if abs(v) >= 100 else f"{v:.3g}" for v in values]
        cells += [f"{ours / v:.2f}x" if v else "-" for v in values[1:]]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def run(root: Path, workdir: Path, args: argparse.Namespace, traffic: dict[float, tuple[Streams, Streams]],
        ) -> dict[str, Any]:
    loads = args.memory_models
    memories = {"limit": asyncio.run(memory(InProcess(root, args.width, loads + 1), args.width, loads)),
                "modelhost": asyncio.run(memory(Modelhost(root, workdir, 4 * 2**30), args.width, loads)),
                "naive peer": asyncio.run(memory(NaivePeer(root, loads + 1), args.width, loads))}
    print(f"memory: {memories}", flush=True)
    budget = int(CACHE_MODELS * memories["modelhost"]["charged_per_model"] * 1.05)
    results: dict[str, Any] = {"memory": memories, "budget": budget, MATCHED: {"label": MATCHED}}
    for make in (lambda: InProcess(root, args.width, CACHE_MODELS),
                 lambda: Modelhost(root, workdir, budget, args.compute_priority),
                 lambda: NaivePeer(root, CACHE_MODELS)):
        subject = make()
        results[subject.label] = asyncio.run(measure(subject, args, traffic))
    # The peer again, holding as many models as modelhost's cache held: the same hit ratio, the same work.
    for s in traffic:
        count = round(statistics.mean(results["modelhost"][f"zipf {s}"]["loaded"]))  # at its start and end
        peer = NaivePeer(root, count)
        results[MATCHED][f"zipf {s}"] = asyncio.run(measure(peer, args, {s: traffic[s]}, cold=False))[f"zipf {s}"]
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", type=int, default=200)
    parser.add_argument("--width", type=int, default=256, help="float32 features per row and weights per model")
    parser.add_argument("--duration", type=float, default=20.0, help="seconds of Zipf traffic measured")
    parser.add_argument("--warmup", type=float, default=3.0, help="seconds of Zipf traffic before each measurement")
    parser.add_argument("--zipf", default="1.0,1.2", help="Zipf exponents s, comma-separated")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--hits", type=int, default=500, help="requests to one loaded model for the hit latency")
    parser.add_argument("--memory-models", type=int, default=40, help="loads after the first for memory per model")
    parser.add_argument("--json", type=Path, help="also write the raw results here")
    parser.add_argument("--compute-priority", default="auto", choices=("auto", "low", "nice", "normal"),
                        help="modelhost's; normal on a machine other processes share without a cgroup between them, "
                             "where `auto`'s SCHED_IDLE loads wait behind all of them while the peer's run at normal "
                             "priority (default auto, the server's default)")
    args = parser.parse_args()
    zipfs = [float(s) for s in args.zipf.split(",")]
    started = time.monotonic()
    workdir = Path(tempfile.mkdtemp(prefix="modelhost-mme-bench-"))
    root = workdir / "archives"
    write_archives(root, args.models, args.width)
    traffic = {s: (zipf_sequences(args.models, s, args.concurrency, 40_000, 1),
                   zipf_sequences(args.models, s, args.concurrency, 40_000, 2)) for s in zipfs}
    try:
        results = run(root, workdir, args, traffic)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    print(f"\nrun took {time.monotonic() - started:.0f} s; modelhost --model-cache-bytes {results['budget']}\n")
    rows = {label: summary(results["memory"].get(label, {}), results[label], zipfs)
            for label in ("modelhost", "limit", "naive peer", MATCHED)}
    print(_table(rows))
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
