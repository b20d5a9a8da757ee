"""Reload under constant load: latency before, during and after model reloads, and failed requests.

    python benchmarks/reload.py [--model deepfm|rank|tiny|torch_mlp] [--rate 150] [--reloads 5]
                                [--candidates 100] [--json results.json]

A model (by default the example `deepfm`: 100,000 x 16 embedding, 39 fields; `torch_mlp` is a TorchScript
MLP shaped like `rank`, whose first runs are slow) ranks `--candidates` rows per request,
sent over HTTP (binary extension) at a constant rate from an open-loop generator: each request has a
scheduled send time and its latency counts from then, so a stall delays the requests behind it and
shows in the tail (no coordinated omission). The server runs in explicit mode; every few seconds the
model is reloaded (POST /v2/repository/models/deepfm/load) while the load goes on, in three ways:

  modelhost reload         the zero-downtime reload, with model_warmup (zero data, 2 runs) in the config
  reload, no warmup        the same without model_warmup: the new session's first runs are cold
  unload + load            what a server without reload does: the model is gone while it loads

A request counts as "during a reload" when it was scheduled between the start of the load call and
half a second after it returned; the rest are "steady". Reported: p50/p99 of each, their ratio, and
the failed requests. The load generator shares the machine's cores with the server: read ratios.
"""

from __future__ import annotations

import argparse
import http.client
import json
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

sys.path.insert(0, str(ROOT / "benchmarks"))

from warmup import request_body, warmup_block, write_model  # noqa: E402

from tests.server import ServerProcess  # noqa: E402

SETTLE_SECONDS = 0.5
WARMUP_RUNS = 2  # TorchScript optimizes a graph on its second run


@dataclass
class Outcome:
    scheduled: float
    latency: float
    ok: bool


@dataclass
class Run:
    outcomes: list[Outcome] = field(default_factory=list)
    windows: list[tuple[float, float]] = field(default_factory=list)
    reload_seconds: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


def generate(server: ServerProcess, path: str, body: bytes, headers: dict[str, str], rate: float, threads: int,
             start: float, stop: float, run: Run) -> None:
    """Open loop: thread i sends the requests scheduled at start + (i + k * threads) / rate."""
    lock = threading.Lock()

    def worker(index: int) -> None:
        connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
        k = 0
        while True:
            scheduled = start + (index + k * threads) / rate
            if scheduled >= stop:
                break
            k += 1
            delay = scheduled - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            ok = False
            try:
                connection.request("POST", path, body, headers)
                response = connection.getresponse()
                data = response.read()
                ok = response.status == 200
                if not ok:
                    with lock:
                        run.errors.append(data[:200].decode(errors="replace"))
            except (OSError, http.client.HTTPException) as exc:
                with lock:
                    run.errors.append(repr(exc))
                connection.close()
                connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
            outcome = Outcome(scheduled, time.monotonic() - scheduled, ok)
            with lock:
                run.outcomes.append(outcome)
        connection.close()

    workers = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(threads)]
    for thread in workers:
        thread.start()
    for thread in workers:
        thread.join()


def reloader(server: ServerProcess, model: str, how: str, first: float, every: float, count: int,
             run: Run) -> None:
    base = f"/v2/repository/models/{model}"
    for n in range(count):
        delay = first + n * every - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=120)
        started = time.monotonic()
        calls = [f"{base}/unload", f"{base}/load"] if how == "unload + load" else [f"{base}/load"]
        for path in calls:
            connection.request("POST", path, b"")
            response = connection.getresponse()
            response.read()
            assert response.status == 200, (path, response.status)
        ended = time.monotonic()
        connection.close()
        run.windows.append((started, ended + SETTLE_SECONDS))
        run.reload_seconds.append(ended - started)


def measure(how: str, args: argparse.Namespace, work: Path) -> dict:
    repo = work / how.replace(" ", "_").replace("+", "").replace(",", "")
    repo.mkdir()
    inputs = write_model(args.model, repo)
    config = repo / args.model / "config.pbtxt"
    if how != "reload, no warmup":
        config.write_text(config.read_text() + warmup_block(inputs, args.candidates, WARMUP_RUNS))
    server = ServerProcess(repo, "--model-control-mode", "explicit", "--load-model", args.model, "--grpc-port", "0",
                           "--metrics-port", "0", "--sagemaker-port", "0").wait_ready()
    try:
        body, headers = request_body(inputs, args.candidates)
        run = Run()
        start = time.monotonic() + 0.5
        stop = start + args.steady + args.reloads * args.every + args.steady
        reloads = threading.Thread(target=reloader, args=(server, args.model, how, start + args.steady, args.every,
                                                          args.reloads, run), daemon=True)
        rss_before = rss_mib(server)
        reloads.start()
        generate(server, f"/v2/models/{args.model}/infer", body, headers, args.rate, args.threads, start, stop, run)
        reloads.join()
        time.sleep(SETTLE_SECONDS)
        rss_after = rss_mib(server)
    finally:
        server.stop()
    return summarize(how, run) | {"rss_before_mib": rss_before, "rss_after_mib": rss_after}


def rss_mib(server: ServerProcess) -> float:
    """The server's resident memory: flat across reloads when each old version's memory is returned."""
    for line in Path(f"/proc/{server.process.pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def summarize(how: str, run: Run) -> dict:
    def during(outcome: Outcome) -> bool:
        return any(a <= outcome.scheduled <= b for a, b in run.windows)

    steady = [o.latency * 1e3 for o in run.outcomes if not during(o) and o.ok]
    reload = [o.latency * 1e3 for o in run.outcomes if during(o) and o.ok]
    failed = sum(not o.ok for o in run.outcomes)
    result = {
        "how": how, "requests": len(run.outcomes), "failed": failed,
        "steady_p50_ms": percentile(steady, 50), "steady_p99_ms": percentile(steady, 99),
        "reload_p50_ms": percentile(reload, 50), "reload_p99_ms": percentile(reload, 99),
        "reload_max_ms": max(reload, default=float("nan")),
        "reload_seconds_median": statistics.median(run.reload_seconds) if run.reload_seconds else float("nan"),
        "errors": sorted(set(run.errors))[:3],
    }
    result["p99_ratio"] = result["reload_p99_ms"] / result["steady_p99_ms"]
    return result


def percentile(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", choices=["deepfm", "rank", "tiny", "torch_mlp"], default="deepfm")
    parser.add_argument("--rate", type=float, default=150.0, help="requests per second")
    parser.add_argument("--threads", type=int, default=8, help="client threads (connections)")
    parser.add_argument("--candidates", type=int, default=100, help="rows per request")
    parser.add_argument("--reloads", type=int, default=5)
    parser.add_argument("--every", type=float, default=3.0, help="seconds between reloads")
    parser.add_argument("--steady", type=float, default=4.0, help="seconds of load before the first reload and after")
    parser.add_argument("--only", choices=["modelhost reload", "reload, no warmup", "unload + load"], action="append")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    results = []
    with tempfile.TemporaryDirectory(prefix="reload-bench-") as work:
        for how in args.only or ["modelhost reload", "reload, no warmup", "unload + load"]:
            result = measure(how, args, Path(work))
            results.append(result)
            r = result
            print(f"{how:20s} requests {r['requests']:5d} failed {r['failed']:4d} | steady p50 "
                  f"{r['steady_p50_ms']:6.2f} p99 {r['steady_p99_ms']:6.2f} ms | during reload p50 "
                  f"{r['reload_p50_ms']:6.2f} p99 {r['reload_p99_ms']:6.2f} max {r['reload_max_ms']:7.1f}"
                  f" ms | p99 ratio {r['p99_ratio']:.2f}x | reload {r['reload_seconds_median']:.2f} s | RSS "
                  f"{r['rss_before_mib']:.0f} -> {r['rss_after_mib']:.0f} MiB", flush=True)
            for error in result["errors"]:
                print(f"    e.g. {error}")
    if args.json:
        settings = vars(args) | {"json": str(args.json)}
        args.json.write_text(json.dumps({"date": time.strftime("%Y-%m-%d"), "args": settings, "results": results},
                                        indent=2))


if __name__ == "__main__":
    main()
