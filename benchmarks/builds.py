"""Two builds of modelhost side by side: a git revision against the working tree, in alternating rounds.

    python benchmarks/builds.py --base HEAD [--rounds 4] [--duration 3]
        [--cells tiny:http:8,tiny:http:32,tiny:grpc:8] [--args "--workers 2"]

A change to a hot path is judged against the build before it, on the same machine in the same minutes:
on a shared machine a run's speed drifts by 1.5-2x within minutes, more than most changes are worth.
So each round starts the base build's server, measures every cell, stops it, then does the same for
the working tree; the table gives, per cell, the median over rounds of each build's figures and the
ratio of the medians.

- base: `git worktree add` of the revision into a temporary directory, run with that directory first on
  PYTHONPATH (the installed modelhost is the working tree's, in editable mode).
- cells: model:protocol:concurrency over the built-in example repository; perf_analyzer as the client
  (benchmarks/peers/perf_analyzer.py), 1 s of warm-up, then `--duration` seconds.
- server CPU per request: the server process's user + system time over the measured run, divided by
  the requests its statistics counted (a 500-row `rank` request counts once): steal and waiting do
  not count, so it drifts less than the request rate does.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import urllib.request
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks import serving  # noqa: E402
from benchmarks.peers import perf_analyzer  # noqa: E402
from modelhost.example_repository import ensure_example_repository  # noqa: E402
from tests.server import ServerProcess  # noqa: E402

WARMUP_S = 1.0


@dataclass(frozen=True)
class Cell:
    model: str
    protocol: str  # http | grpc
    concurrency: int

    def __str__(self) -> str:
        return f"{self.model} {self.protocol} c={self.concurrency}"


def parse_cells(text: str) -> list[Cell]:
    cells = []
    for item in text.split(","):
        model, protocol, concurrency = item.split(":")
        if protocol not in perf_analyzer.PROTOCOLS:
            raise SystemExit(f"--cells: protocol {protocol!r} is not one of {perf_analyzer.PROTOCOLS}")
        cells.append(Cell(model, protocol, int(concurrency)))
    return cells


def input_data(model: str, workdir: Path) -> perf_analyzer.InputData:
    case = next(case for case in serving.cases() if case["model"] == model)
    return perf_analyzer.write_input_data(workdir / f"{model}.json", case["input"], case["array"])


def process_cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def requests_served(server: ServerProcess, model: str) -> int:
    with urllib.request.urlopen(f"{server.base}/v2/models/{model}/stats") as answer:
        stats = json.load(answer)["model_stats"][0]
    return int(stats["inference_stats"]["success"]["count"])


def measure(server: ServerProcess, cell: Cell, data: perf_analyzer.InputData, seconds: float) -> dict[str, float]:
    url = server.grpc_url if cell.protocol == "grpc" else server.url
    perf_analyzer.measure(cell.protocol, url, cell.model, data, cell.concurrency, WARMUP_S)
    cpu, served = process_cpu_s(server.process.pid), requests_served(server, cell.model)
    result = perf_analyzer.measure(cell.protocol, url, cell.model, data, cell.concurrency, seconds)
    done = requests_served(server, cell.model) - served
    result["cpu_us"] = (process_cpu_s(server.process.pid) - cpu) / max(done, 1) * 1e6
    return result


def base_tree(revision: str, workdir: Path) -> Path:
    tree = workdir / "base"
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(tree), revision], check=True,
                   capture_output=True)
    return tree


def table(cells: list[Cell], results: dict[tuple[str, Cell], list[dict[str, float]]], builds: list[str]) -> str:
    lines = ["| cell | build | req/s | p50 ms | p99 ms | server CPU µs / request | req/s vs base |",
             "|---|---|---|---|---|---|---|"]
    for cell in cells:
        base_rps = None
        for build in builds:
            runs = results.get((build, cell), [])
            if not runs:
                lines.append(f"| {cell} | {build} | n/a | n/a | n/a | n/a | n/a |")
                continue
            median = {key: statistics.median(run[key] for run in runs) for key in ("rps", "p50", "p99", "cpu_us")}
            base_rps = base_rps or median["rps"]
            lines.append(f"| {cell} | {build} | {median['rps']:.0f} | {median['p50']:.2f} | {median['p99']:.2f} | "
                         f"{median['cpu_us']:.0f} | {median['rps'] / base_rps:.2f}x |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base", required=True, help="the git revision to compare the working tree with")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--duration", type=float, default=3.0)
    parser.add_argument("--cells", default="tiny:http:8,tiny:http:32,tiny:http:128,tiny:grpc:8,tiny:grpc:32")
    parser.add_argument("--args", default="", help="extra `modelhost serve` arguments for both builds")
    options = parser.parse_args()
    cells = parse_cells(options.cells)
    with tempfile.TemporaryDirectory(prefix="builds-") as scratch:
        workdir = Path(scratch)
        repository = ensure_example_repository(workdir / "cache")
        data = {model: input_data(model, workdir) for model in {cell.model for cell in cells}}
        tree = base_tree(options.base, workdir)
        builds = {f"base ({options.base})": {"PYTHONPATH": str(tree)}, "working tree": {}}
        results: dict[tuple[str, Cell], list[dict[str, float]]] = {}
        try:
            for round_number in range(options.rounds):
                for build, env in builds.items():
                    server = ServerProcess(repository, *shlex.split(options.args), env=env).wait_ready()
                    try:
                        for cell in cells:
                            result = measure(server, cell, data[cell.model], options.duration)
                            results.setdefault((build, cell), []).append(result)
                            print(f"round {round_number} {build}: {cell}: {result['rps']:.0f} req/s, p50 "
                                  f"{result['p50']:.2f} ms, p99 {result['p99']:.2f} ms, {result['cpu_us']:.0f} µs CPU "
                                  "per request", flush=True)
                    finally:
                        server.stop()
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)], check=False,
                           capture_output=True)
        print()
        print(table(cells, results, list(builds)))


if __name__ == "__main__":
    main()
