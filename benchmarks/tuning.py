"""The ranking case: how much `rank` (500 candidates x 1,000 FP32 features a request) serves within a p99
budget (default 50 ms) with (a) the example's own config, (b) `modelhost tune`'s config, (c) the online
latency target on the own config, (d) the tuned config with the client's splitting on top; a load step with
and without the target; and perf_analyzer beside `modelhost perf` at the same points.

    python benchmarks/tuning.py [--budget-ms 50] [--tune-seconds 300] [--window 3] [--json results.json]

One `modelhost serve --model-control-mode explicit` on a copy of the example repository's rank model (max
batch 1024, one instance, no dynamic batcher); configs are changed through the repository extension.
Capacity: the closed loop of modelhost perf (modelhost.client over HTTP binary, one process), concurrency
doubling from 1, `--window` seconds a step after 1 s of warm-up; the best requests/s whose client-side p99 is
within the budget. The target is measured open loop (Poisson arrivals at 0.5-2x the default's capacity), and
the default beside it the same way: a closed loop whose clients resend a refused request at once measures
that spin, not the server; the figure is the answered requests/s, refusals counted apart.
The load step: open loop (Poisson) at half the default's capacity for 3 s, then 1.5x it for 10 s; p99 of the
answered requests per second of the step. perf_analyzer (Triton's, C++) and modelhost perf each measure the
same concurrency on the same config back to back, `--window` x 3 seconds.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.peers import perf_analyzer  # noqa: E402
from modelhost.client import AsyncClient, Client, ClientError, RetryPolicy  # noqa: E402
from modelhost.example_repository import write_example_repository  # noqa: E402
from modelhost.perf.report import StepResult  # noqa: E402
from modelhost.perf.sweep import Loader, Sweep  # noqa: E402
from modelhost.tune.knobs import Knobs, configured  # noqa: E402
from tests.server import ServerProcess  # noqa: E402

MODEL, ROWS = "rank", 500


def rank_repository(workdir: Path) -> Path:
    example = write_example_repository(workdir / "example")
    repo = workdir / "repo"
    repo.mkdir()
    (repo / MODEL).symlink_to(example / MODEL, target_is_directory=True)
    return repo


def sweep_capacity(url: str, requests: list[dict[str, np.ndarray]], budget_ms: float, window: float,
                   split: int | None, label: str, max_concurrency: int = 64) -> dict[str, Any]:
    """Every step of a doubling closed loop until p99 passes twice the budget or throughput stops growing,
    and the best answered requests/s within the budget."""
    sweep = Sweep(MODEL, url, "http", "concurrency", (), warmup_s=1.0, duration_s=window, split=split, processes=1)
    steps: list[StepResult] = []
    with Loader(sweep, requests, out=sys.stderr) as loader:
        concurrency = 1
        while concurrency <= max_concurrency:
            step = loader.measure(concurrency, f"{label}: concurrency {concurrency}")
            steps.append(step)
            if step.latency_ms["p99"] > 2 * budget_ms:
                break
            concurrency *= 2
    within = [s for s in steps if s.requests and s.latency_ms["p99"] <= budget_ms]
    best = max(within, key=lambda s: s.throughput, default=None)
    return {"label": label, "capacity": best.throughput if best else 0.0,
            "p99_ms": best.latency_ms["p99"] if best else None, "concurrency": int(best.load) if best else None,
            "steps": [{"concurrency": int(s.load), "throughput": s.throughput, "p50_ms": s.latency_ms["p50"],
                       "p99_ms": s.latency_ms["p99"], "refused": s.errors} for s in steps]}


def rate_capacity(url: str, requests: list[dict[str, np.ndarray]], budget_ms: float, window: float,
                  rates: list[float], label: str) -> dict[str, Any]:
    """Open-loop (Poisson) steps at `rates`: requests answered per second and their p99, refusals apart; the
    best answered rate within the budget."""
    sweep = Sweep(MODEL, url, "http", "rate", (), warmup_s=1.0, duration_s=window, split=1, processes=1)
    with Loader(sweep, requests, out=sys.stderr) as loader:
        steps = [loader.measure(rate, f"{label}: {rate:.0f} requests/s") for rate in rates]
    within = [s for s in steps if s.requests and s.latency_ms["p99"] <= budget_ms]
    best = max(within, key=lambda s: s.throughput, default=None)
    return {"label": label, "capacity": best.throughput if best else 0.0,
            "p99_ms": best.latency_ms["p99"] if best else None, "rate": best.load if best else None,
            "steps": [{"rate": s.load, "throughput": s.throughput, "p50_ms": s.latency_ms["p50"],
                       "p99_ms": s.latency_ms["p99"], "refused": s.errors} for s in steps]}


def run_tune(server: ServerProcess, budget_ms: float, seconds: float, workdir: Path) -> dict[str, Any]:
    done = subprocess.run([sys.executable, "-m", "modelhost", "tune", MODEL, "--p99-ms", str(budget_ms),
                           "-u", server.url, "-b", str(ROWS), "--time-limit", str(seconds), "--processes", "1",
                           "-o", str(workdir / "tune")], capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"modelhost tune failed:\n{done.stderr[-3000:]}")
    print(done.stdout, file=sys.stderr)
    report: dict[str, Any] = json.loads((workdir / "tune" / "trials.json").read_text())
    return report


async def load_step(url: str, requests: list[dict[str, np.ndarray]], low: float, high: float,
                    seconds_low: float = 3.0, seconds_high: float = 10.0) -> list[dict[str, float]]:
    """Open-loop arrivals at `low` then `high` requests/s; per second: answered, refused, p99 of the answered."""
    client = AsyncClient(url, retry=RetryPolicy(attempts=1))
    rng = random.Random(1)
    start = time.monotonic()
    end = start + seconds_low + seconds_high
    outcomes: list[tuple[float, float | None]] = []  # (due, latency or None when refused)
    tasks = set()

    async def one(due: float, request: dict[str, np.ndarray]) -> None:
        try:
            await client.infer(MODEL, request, split=1)
            outcomes.append((due, time.monotonic() - due))
        except ClientError:
            outcomes.append((due, None))

    due, turn = start, 0
    while due < end:
        await asyncio.sleep(max(due - time.monotonic(), 0))
        task = asyncio.ensure_future(one(due, requests[turn % len(requests)]))
        tasks.add(task)
        task.add_done_callback(tasks.discard)
        turn += 1
        due += rng.expovariate(low if due - start < seconds_low else high)
    await asyncio.gather(*tasks)
    await client.close()
    seconds = []
    for second in range(int(seconds_low + seconds_high)):
        inside = [latency for when, latency in outcomes if second <= when - start < second + 1]
        answered = sorted(latency for latency in inside if latency is not None)
        p99 = answered[min(len(answered) - 1, int(0.99 * len(answered)))] * 1000 if answered else 0.0
        seconds.append({"second": second, "answered": len(answered), "refused": len(inside) - len(answered),
                        "p99_ms": p99})
    return seconds


def agreement(server: ServerProcess, requests: list[dict[str, np.ndarray]], concurrency: int, window: float,
              workdir: Path, label: str) -> dict[str, Any]:
    data = perf_analyzer.write_input_data(workdir / f"pa-{label}.json", "features", requests[0]["features"])
    analyzer = perf_analyzer.measure("http", server.url, MODEL, data, concurrency, 3 * window, warmup_s=1.0)
    sweep = Sweep(MODEL, server.url, "http", "concurrency", (), warmup_s=1.0, duration_s=3 * window, split=1,
                  processes=1)
    with Loader(sweep, requests, out=sys.stderr) as loader:
        ours = loader.measure(concurrency, f"{label}: modelhost perf at {concurrency}")
    return {"label": label, "concurrency": concurrency, "perf_analyzer_rps": analyzer["rps"],
            "perf_analyzer_p50_ms": analyzer["p50"], "perf_analyzer_p99_ms": analyzer["p99"],
            "modelhost_perf_rps": ours.throughput, "modelhost_perf_p50_ms": ours.latency_ms["p50"],
            "modelhost_perf_p99_ms": ours.latency_ms["p99"], "ratio": ours.throughput / analyzer["rps"]}


def in_process_limit(repo: Path, requests: list[dict[str, np.ndarray]], seconds: float = 3.0) -> dict[str, float]:
    """requests/s of onnxruntime in this process on the same requests, no server: one session on every core, and
    one single-threaded session per core running at once (the better is the limit)."""
    import os
    import threading

    import onnxruntime as ort

    cores = os.cpu_count() or 1
    model = str(repo / MODEL / "1" / "model.onnx")

    def session(threads: int) -> ort.InferenceSession:
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        return ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])

    def rate(sessions: list[ort.InferenceSession]) -> float:
        counts = [0] * len(sessions)
        end = time.monotonic() + seconds

        def work(index: int) -> None:
            while time.monotonic() < end:
                sessions[index].run(None, requests[counts[index] % len(requests)])
                counts[index] += 1

        threads = [threading.Thread(target=work, args=(i,)) for i in range(len(sessions))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        return sum(counts) / seconds

    return {"one session, all cores": rate([session(cores)]),
            f"{cores} sessions, one core each": rate([session(1) for _ in range(cores)])}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--budget-ms", type=float, default=50.0)
    parser.add_argument("--tune-seconds", type=float, default=300.0)
    parser.add_argument("--window", type=float, default=3.0)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="modelhost-tuning-"))
    rng = np.random.default_rng(0)
    requests = [{"features": rng.standard_normal((ROWS, 1000), dtype=np.float32)} for _ in range(16)]
    repo = rank_repository(workdir)
    results: dict[str, Any] = {"budget_ms": args.budget_ms, "limit": in_process_limit(repo, requests)}
    server = ServerProcess(repo, "--model-control-mode", "explicit", "--load-model", MODEL)
    server.wait_ready()
    try:
        with Client(server.url) as client:
            base = client.model_config(MODEL)
        results["default"] = sweep_capacity(server.url, requests, args.budget_ms, args.window, 1, "(a) default")
        pa_default = agreement(server, requests, results["default"]["concurrency"] or 1, args.window, workdir,
                               "default")
        target = configured(base, Knobs(1, 0, 1024, -1, False, 0, 1))
        target.setdefault("parameters", {})["target_p99_ms"] = {"string_value": f"{args.budget_ms:g}"}
        with Client(server.url) as client:
            client.load_model(MODEL, config=target)
        capacity = results["default"]["capacity"] or 10.0
        rates = [capacity * share for share in (0.5, 0.75, 1.0, 1.25, 1.5, 2.0)]
        results["target_open"] = rate_capacity(server.url, requests, args.budget_ms, args.window, rates,
                                               "(c) target, open loop")
        results["step_target"] = asyncio.run(load_step(server.url, requests, capacity / 2, capacity * 1.5))
        with Client(server.url) as client:
            client.load_model(MODEL, config=base)
        results["default_open"] = rate_capacity(server.url, requests, args.budget_ms, args.window, rates,
                                                "(a) default, open loop")
        results["step_default"] = asyncio.run(load_step(server.url, requests, capacity / 2, capacity * 1.5))
        tuned = run_tune(server, args.budget_ms, args.tune_seconds, workdir)
        results["tune"] = {"final": tuned["final"], "trials": len(tuned["trials"]), "meta": tuned["meta"]}
        results["tuned"] = sweep_capacity(server.url, requests, args.budget_ms, args.window, 1, "(b) tuned")
        split = tuned["final"]["client_split"]
        results["tuned_split"] = sweep_capacity(server.url, requests, args.budget_ms, args.window,
                                                split if split > 1 else None, "(d) tuned + client split")
        pa_tuned = agreement(server, requests, results["tuned"]["concurrency"] or 1, args.window, workdir, "tuned")
        results["agreement"] = [pa_default, pa_tuned]
    finally:
        server.stop()
    print_tables(results)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


def print_tables(results: dict[str, Any]) -> None:
    default = results["default"]["capacity"] or 1.0
    limit = max(results["limit"].values())
    print("In-process limit (onnxruntime, no server, no client): " + ", ".join(
        f"{name} {value:.1f} req/s" for name, value in results["limit"].items()))
    print()
    print(f"| case (p99 budget {results['budget_ms']:g} ms) | req/s within the budget | p99 ms | at "
          "| vs default | vs in-process limit |")
    print("|---|---|---|---|---|---|")
    for key in ("default", "tuned", "tuned_split", "default_open", "target_open"):
        row = results[key]
        p99 = f"{row['p99_ms']:.1f}" if row["p99_ms"] is not None else "-"
        at = f"c={row['concurrency']}" if "concurrency" in row else f"{row['rate'] or 0:.0f}/s offered"
        print(f"| {row['label']} | {row['capacity']:.1f} | {p99} | {at} "
              f"| {row['capacity'] / default:.2f}x | {row['capacity'] / limit:.2f}x |")
    print()
    print("| case | load | answered req/s | p50 ms | p99 ms | refused in the window |")
    print("|---|---|---|---|---|---|")
    for key in ("default", "tuned", "tuned_split", "default_open", "target_open"):
        for step in results[key]["steps"]:
            load = f"c={step['concurrency']}" if "concurrency" in step else f"{step['rate']:.0f}/s"
            print(f"| {results[key]['label']} | {load} | {step['throughput']:.1f} | "
                  f"{step['p50_ms']:.1f} | {step['p99_ms']:.1f} | {step['refused']} |")
    print()
    print("| second | default: answered | default: p99 ms | target: answered | target: refused | target: p99 ms |")
    print("|---|---|---|---|---|---|")
    for plain, targeted in zip(results["step_default"], results["step_target"]):
        print(f"| {plain['second']} | {plain['answered']} | {plain['p99_ms']:.1f} | {targeted['answered']} | "
              f"{targeted['refused']} | {targeted['p99_ms']:.1f} |")
    print()
    print("| config | concurrency | perf_analyzer req/s | p50 | p99 | modelhost perf req/s | p50 | p99 | ratio |")
    print("|---|---|---|---|---|---|---|---|---|")
    for row in results["agreement"]:
        print(f"| {row['label']} | {row['concurrency']} | {row['perf_analyzer_rps']:.1f} | "
              f"{row['perf_analyzer_p50_ms']:.1f} | {row['perf_analyzer_p99_ms']:.1f} | "
              f"{row['modelhost_perf_rps']:.1f} | {row['modelhost_perf_p50_ms']:.1f} | "
              f"{row['modelhost_perf_p99_ms']:.1f} | {row['ratio']:.2f} |")
    print(f"\ntuned: {results['tune']['final']}")


if __name__ == "__main__":
    main()
