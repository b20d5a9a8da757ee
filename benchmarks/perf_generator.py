"""`modelhost perf` as a load generator: its ceiling against wrk, and its agreement with perf_analyzer.

    python benchmarks/perf_generator.py [--duration 5] [--rounds 3] [--parts ceiling,agreement]
        [--ceiling-concurrency 64] [--json results.json]

One `modelhost serve` on the built-in example repository serves every cell; the generators take turns on it.
Every generator gets 1 s of warm-up (side_by_side.WARMUP_S), then `--duration` seconds measured; each
`modelhost perf` run is a subprocess (`python -m modelhost perf ... -o DIR`) whose DIR/results.json is read
(its one step's throughput, p50, p99, errors, and the processes and generator busy share it reports).
Requests carry serving.py's arrays (serving.cases(); `modelhost perf --input-data` gets them as .npy):
`rank`, 500 x 1000 FP32 rows in one 2 MB request (-b 500), and `tiny`, 1 x 4 FP32.
1. Ceiling: is `modelhost perf` what limits the numbers? `tiny` over HTTP at concurrency
   --ceiling-concurrency (closed loop): wrk (C, side_by_side.wrk: 2 threads, serving.py's Lua script, the V2
   binary tensor extension) is the reference; `modelhost perf --processes 1`, `2` and `auto` are each given
   as a ratio to wrk's req/s. The order of the four rotates every round.
2. Agreement: `modelhost perf --processes 1` and NVIDIA's perf_analyzer (benchmarks/peers/perf_analyzer.py:
   c synchronous clients, its answers checked byte for byte against the server's own) on the same points:
   `rank` at c = 1 and 4, `tiny` at c = 1 and 8, each over HTTP and gRPC. Each pair runs back to back, the
   one that goes first alternating between rounds and points; they should agree within 10 % on req/s.
Rounds are the outer loop, so a point's rounds are spread over the run; tables show medians over rounds
(ratios are ratios of medians, with the per-round ratios' range beside them). Every answer format is
checked against onnxruntime before the first round; `modelhost perf` checks no answers, but a run with any
failed request raises. A cell that fails prints n/a with the reason in a footnote.
CPU per request, to tell a generator's cost from the server's: the requests a cell served are the server's
statistics-extension success count over the cell (warm-up included); the server's CPU is its process's over
the cell; wrk's and perf_analyzer's is their processes' (getrusage of children: warm-up and start-up
included, which is small next to seconds of load); `modelhost perf`'s is the busy share it reports over its
measured window (its own start-up and report are Python and would swamp it), that of its busiest process
times the processes (they share the load evenly), per request.

The generators share the machine's cores with the server (2 here): a Python generator's CPU is CPU the
server does not get, which is part of what the ceiling measures. Needs wrk (Debian package) and
perf_analyzer (libb64-0d; benchmarks/peers/perf_analyzer.py installs the rest on first use). The defaults
(5 s, 3 rounds, both parts) take about 7 minutes on 2 cores.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks import side_by_side  # noqa: E402
from benchmarks.peers import perf_analyzer  # noqa: E402
from benchmarks.side_by_side import WARMUP_S, Footnotes, V2Api, Workload  # noqa: E402
from modelhost.client import Client  # noqa: E402
from modelhost.perf import server_stats  # noqa: E402
from tests.server import ServerProcess  # noqa: E402

PARTS = ("ceiling", "agreement")
CEILING_GENERATORS = ("wrk", "perf-1", "perf-2", "perf-auto")
GENERATOR_LABELS = {"wrk": "wrk (C, 2 threads)", "perf-1": "modelhost perf --processes 1",
                    "perf-2": "modelhost perf --processes 2", "perf-auto": "modelhost perf --processes auto"}
# (model, protocol, concurrency): the agreement points.
AGREEMENT_POINTS = tuple((model, protocol, c) for model, levels in (("rank", (1, 4)), ("tiny", (1, 8)))
                         for protocol in ("http", "grpc") for c in levels)
AGREEMENT = 0.10  # |modelhost perf / perf_analyzer - 1| on req/s within this counts as agreeing
PERF_TIMEOUT_S = 120  # beyond its windows: interpreter start, spawning workers, writing the report
Result = dict[str, Any]  # rps, p50, p99 (ms), server_cpu_ms, generator_cpu_ms; modelhost perf's also processes, busy


@dataclass(frozen=True)
class Setup:
    """What every cell needs: the server, the workloads and where their request files are."""

    server: ServerProcess
    jobs: dict[str, Workload]
    npy: dict[str, Path]  # model -> its array, for modelhost perf --input-data
    analyzer_data: dict[str, perf_analyzer.InputData]  # model -> perf_analyzer --input-data, with answers
    workdir: Path
    seconds: int
    stats: Client  # the server's statistics extension: requests served per model


def served(setup: Setup, model: str) -> int:
    return server_stats.totals(setup.stats.statistics(model))["success"][0]


def process_cpu_s(pid: int) -> float:
    """A process's user + system CPU seconds, all threads, from /proc (Linux)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)  # counts a child once it has been waited for
    return usage.ru_utime + usage.ru_stime


def with_cpu(setup: Setup, model: str, measure: Callable[[], Result]) -> Result:
    """measure(), with the server's and the generator's CPU ms per request served over it."""
    count, server_cpu, generator_cpu = served(setup, model), process_cpu_s(setup.server.process.pid), children_cpu_s()
    result = measure()
    requests = served(setup, model) - count
    if requests <= 0:
        raise RuntimeError("the server counted no successful requests")
    result["server_cpu_ms"] = 1e3 * (process_cpu_s(setup.server.process.pid) - server_cpu) / requests
    if "busy" in result:  # modelhost perf: its measured window only; busy is its busiest process's share
        result["generator_cpu_ms"] = 1e3 * result["busy"] * result["processes"] / result["rps"]
    else:
        result["generator_cpu_ms"] = 1e3 * (children_cpu_s() - generator_cpu) / requests
    return result


def batch_size(workload: Workload) -> int:
    return len(workload.array)  # one request carries the whole array: rank's 500 rows, tiny's 1


def modelhost_perf(setup: Setup, model: str, protocol: str, c: int, processes: str) -> Result:
    """One `modelhost perf` run of one closed-loop step, read back from its results.json."""
    workload = setup.jobs[model]
    out = Path(tempfile.mkdtemp(prefix="perf-", dir=setup.workdir))
    url = setup.server.grpc_url if protocol == "grpc" else setup.server.url
    command = [sys.executable, "-m", "modelhost", "perf", "-m", model, "-i", protocol, "-u", url,
               "-b", str(batch_size(workload)), "--concurrency", str(c), "--processes", processes,
               "--measurement-interval", str(setup.seconds * 1000), "--warmup", str(WARMUP_S),
               "--input-data", str(setup.npy[model]), "-o", str(out)]
    # --processes auto may run a step again from 2, 4 and 8 processes: allow it every try.
    timeout = 4 * (WARMUP_S + setup.seconds) + PERF_TIMEOUT_S
    done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    if done.returncode != 0:
        tail = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise RuntimeError(f"modelhost perf exited with {done.returncode}: {tail}")
    document = json.loads((out / "results.json").read_text())
    (step,) = document["steps"]
    if step["errors"]:
        raise RuntimeError(f"{step['errors']} failed requests: {step['error_samples'][:1]}")
    return {"rps": step["throughput"], "p50": step["latency_ms"]["p50"], "p99": step["latency_ms"]["p99"],
            "processes": document["meta"]["processes"], "busy": document["meta"]["generator_busy"][-1]}


def analyzer(setup: Setup, model: str, protocol: str, c: int) -> Result:
    url = setup.server.grpc_url if protocol == "grpc" else setup.server.url
    return perf_analyzer.measure(protocol, url, model, setup.analyzer_data[model], c, setup.seconds,
                                 warmup_s=WARMUP_S)


def wrk_cell(setup: Setup, c: int) -> Result:
    """wrk on `tiny` over HTTP (binary extension), checked against onnxruntime before and after."""
    api, workload = V2Api(), setup.jobs["tiny"]
    request = api.http_request(setup.server.base, workload)
    body_file = setup.workdir / "tiny.body"
    body_file.write_bytes(request.body)
    api.check_http(request, workload)
    result = side_by_side.wrk(request, body_file, c, setup.seconds)
    api.check_http(request, workload)
    return result


def ceiling_cell(setup: Setup, generator: str, c: int) -> Result:
    if generator == "wrk":
        return wrk_cell(setup, c)
    return modelhost_perf(setup, "tiny", "http", c, generator.removeprefix("perf-"))


def rotated(items: Sequence[str], by: int) -> list[str]:
    by %= len(items)
    return [*items[by:], *items[:by]]


def run_rounds(setup: Setup, parts: Sequence[str], rounds: int, c: int) -> dict[tuple[str, ...], list[Any]]:
    """Every cell of every round, in order; cells[key] holds one (result or None, why) per round."""
    cells: dict[tuple[str, ...], list[Any]] = {}

    def run(key: tuple[str, ...], label: str, model: str, measure: Callable[..., Result], *args: Any) -> None:
        result, why = side_by_side.attempt(with_cpu, setup, model, lambda: measure(setup, *args))
        cells.setdefault(key, []).append((result, why))
        print(f"{label}: {describe(result, why)}", flush=True)

    for round_index in range(rounds):
        if "ceiling" in parts:
            for generator in rotated(CEILING_GENERATORS, round_index):
                run(("ceiling", generator), f"round {round_index} ceiling tiny http c={c} {generator}",
                    "tiny", ceiling_cell, generator, c)
        if "agreement" in parts:
            for point_index, (model, protocol, level) in enumerate(AGREEMENT_POINTS):
                order = ["perf", "perf_analyzer"]
                if (round_index + point_index) % 2:
                    order.reverse()
                for generator in order:
                    label = f"round {round_index} {model} {protocol} c={level} {generator}"
                    key = ("agreement", model, protocol, str(level), generator)
                    if generator == "perf":
                        run(key, label, model, modelhost_perf, model, protocol, level, "1")
                    else:
                        run(key, label, model, analyzer, model, protocol, level)
    return cells


def describe(result: Result | None, why: str) -> str:
    if result is None:
        return f"n/a ({why})"
    extra = f", {result['processes']} process(es) busy {result['busy']:.0%}" if "busy" in result else ""
    return (f"{result['rps']:.0f} req/s p50 {result['p50']:.2f} ms p99 {result['p99']:.2f} ms; CPU ms/request: "
            f"generator {result['generator_cpu_ms']:.3f}, server {result['server_cpu_ms']:.3f}{extra}")


def median_of(runs: list[Any], notes: Footnotes) -> tuple[Result | None, str]:
    """Medians of a cell's successful rounds (rps, p50, p99, busy), or None and the footnote mark of a failure."""
    done = [result for result, _ in runs if result is not None]
    failures = "; ".join(dict.fromkeys(why for result, why in runs if result is None))
    mark = notes.mark(f"{len(runs) - len(done)} of {len(runs)} rounds failed: {failures}" if failures else "")
    if not done:
        return None, mark
    keys = [key for key in ("rps", "p50", "p99", "busy", "generator_cpu_ms", "server_cpu_ms") if key in done[0]]
    medians: Result = {key: statistics.median(result[key] for result in done) for key in keys}
    medians["per_round_rps"] = [result["rps"] for result in done]
    if "processes" in done[0]:
        medians["processes"] = [result["processes"] for result in done]
    return medians, mark


def ceiling_table(cells: dict[tuple[str, ...], list[Any]], c: int, notes: Footnotes) -> tuple[str, list[Result]]:
    lines = [f"Ceiling: tiny over HTTP, concurrency {c} (closed loop), medians over rounds", "",
             "| generator | processes | req/s | / wrk | p50 ms | p99 ms | generator busy | CPU ms/request: "
             "generator | server |", "|---|---|---|---|---|---|---|---|---|"]
    reference, _ = median_of(cells.get(("ceiling", "wrk"), []), Footnotes())
    rows = []
    for generator in CEILING_GENERATORS:
        medians, mark = median_of(cells.get(("ceiling", generator), []), notes)
        label = GENERATOR_LABELS[generator] + mark
        if medians is None:
            lines.append(f"| {label} |" + " n/a |" * 8)
            continue
        ratio = medians["rps"] / reference["rps"] if reference else None
        processes = "/".join(str(p) for p in medians.get("processes", [])) or "-"
        busy = f"{medians['busy']:.0%}" if "busy" in medians else "-"
        lines.append(f"| {label} | {processes} | {medians['rps']:.0f} | "
                     f"{'n/a' if ratio is None else f'{ratio:.2f}'} | {medians['p50']:.2f} | {medians['p99']:.2f} | "
                     f"{busy} | {medians['generator_cpu_ms']:.3f} | {medians['server_cpu_ms']:.3f} |")
        rows.append({"generator": generator, **medians, "ratio_to_wrk": ratio})
    return "\n".join(lines), rows


def agreement_table(cells: dict[tuple[str, ...], list[Any]], notes: Footnotes) -> tuple[str, list[Result]]:
    lines = ["Agreement: modelhost perf --processes 1 (mh) against perf_analyzer (pa), medians over rounds", "",
             "| model | protocol | c | pa req/s | mh req/s | mh / pa | per round | pa p50 ms | mh p50 ms "
             "| pa p99 ms | mh p99 ms | pa CPU ms/req | mh CPU ms/req | server CPU ms/req pa, mh | within 10 % |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    rows = []
    for model, protocol, c in AGREEMENT_POINTS:
        key = ("agreement", model, protocol, str(c))
        ours, our_mark = median_of(cells.get((*key, "perf"), []), notes)
        theirs, their_mark = median_of(cells.get((*key, "perf_analyzer"), []), notes)
        head = f"| {model} | {protocol} | {c} |"
        if ours is None or theirs is None:
            pa = f"{theirs['rps']:.0f}" if theirs else "n/a"
            mh = f"{ours['rps']:.0f}" if ours else "n/a"
            lines.append(f"{head} {pa}{their_mark} | {mh}{our_mark} |" + " n/a |" * 10)
            continue
        ratio = ours["rps"] / theirs["rps"]
        paired = [a / b for a, b in zip(ours["per_round_rps"], theirs["per_round_rps"])]
        agrees = abs(ratio - 1) <= AGREEMENT
        lines.append(f"{head} {theirs['rps']:.1f}{their_mark} | {ours['rps']:.1f}{our_mark} | {ratio:.3f} | "
                     f"{min(paired):.2f}-{max(paired):.2f} | {theirs['p50']:.2f} | {ours['p50']:.2f} | "
                     f"{theirs['p99']:.2f} | {ours['p99']:.2f} | {theirs['generator_cpu_ms']:.3f} | "
                     f"{ours['generator_cpu_ms']:.3f} | {theirs['server_cpu_ms']:.3f}, {ours['server_cpu_ms']:.3f} | "
                     f"{'yes' if agrees else 'NO'} |")
        rows.append({"model": model, "protocol": protocol, "c": c, "modelhost_perf": ours, "perf_analyzer": theirs,
                     "rps_ratio": ratio, "per_round_ratios": paired, "agrees": agrees})
    return "\n".join(lines), rows


def prepare(server: ServerProcess, workdir: Path, seconds: int) -> Setup:
    """The workloads, each answer format checked once (HTTP and gRPC), and both generators' input files."""
    jobs = side_by_side.workloads(server.example_repository, ("rank", "tiny"))
    npy, data = {}, {}
    for model, workload in jobs.items():
        V2Api().check_http(V2Api().http_request(server.base, workload), workload)
        answer = side_by_side.v2_answer(server, workload)  # gRPC, checked against onnxruntime
        npy[model] = workdir / f"{model}.npy"
        np.save(npy[model], workload.array)
        data[model] = perf_analyzer.write_input_data(workdir / f"{model}.perf_analyzer.json", workload.input,
                                                     workload.array, workload.output, answer)
    return Setup(server, jobs, npy, data, workdir, seconds, Client(server.base))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--duration", type=int, default=5, help="seconds measured per cell (after 1 s warm-up)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--parts", default=",".join(PARTS), help="ceiling, agreement or both")
    parser.add_argument("--ceiling-concurrency", type=int, default=64)
    parser.add_argument("--json", type=Path, help="also write the versions, every round and the medians here")
    args = parser.parse_args()
    parts = [part.strip() for part in args.parts.split(",") if part.strip()]
    if not parts or any(part not in PARTS for part in parts):
        parser.error(f"--parts: choose from {', '.join(PARTS)}")

    started = time.monotonic()
    found = side_by_side.versions()
    about = {key: found[key] for key in ("commit", "date", "cores", "onnxruntime", "grpcio")}
    about["perf_analyzer"] = side_by_side.perf_analyzer_version()
    print(", ".join(f"{k} {v}" for k, v in about.items()) + f", load average at start {os.getloadavg()}", flush=True)
    workdir = Path(tempfile.mkdtemp(prefix="modelhost-perf-generator-"))
    server = ServerProcess(None, cache_dir=workdir / "cache").wait_ready()
    try:
        setup = prepare(server, workdir, args.duration)
        with setup.stats:
            cells = run_rounds(setup, parts, args.rounds, args.ceiling_concurrency)
    finally:
        server.stop()
        shutil.rmtree(workdir, ignore_errors=True)  # the example repository and every run's report: ~25 MB
    elapsed = time.monotonic() - started
    print(f"load average at end {os.getloadavg()}, {elapsed:.0f} s in all", flush=True)

    notes = Footnotes()
    tables, document = [], {"versions": about, "duration_s": args.duration, "warmup_s": WARMUP_S,
                            "rounds": args.rounds, "elapsed_s": elapsed}
    if "ceiling" in parts:
        text, document["ceiling"] = ceiling_table(cells, args.ceiling_concurrency, notes)
        tables.append(text)
    if "agreement" in parts:
        text, document["agreement"] = agreement_table(cells, notes)
        tables.append(text)
    document["cells"] = [{"key": list(key), "rounds": [result or {"na": why} for result, why in runs]}
                         for key, runs in cells.items()]
    if args.json:
        args.json.write_text(json.dumps(document, indent=2))
    print()
    print("\n\n".join(tables) + ("\n\n" + notes.render() if notes.texts else ""))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
