"""Two builds of modelhost side by side: a git revision against the working tree, measured in turns.

    python benchmarks/builds.py --base HEAD [--pairs 6] [--duration 2]
        [--cells tiny:http:8,tiny:http:32,tiny:grpc:8] [--args "--workers 2"] [--base-args ...] [--new-args ...]

A change to a hot path is judged against the build before it, on the same machine in the same seconds:
on a shared machine a run's speed drifts by 1.5-2x within tens of seconds, more than most changes are
worth, and rounds of a minute per build measured the drift (two such runs of 4 rounds each disagreed on
the sign of the same change). So both builds' servers run at once, idle but for the one measured, and
each cell is measured `--pairs` times in turns, base-then-new and new-then-base alternately, so that a
drift in between falls on both. The table gives per cell each build's medians and the median of the
per-pair ratios new / base.

- base: `git worktree add` of the revision into a temporary directory, run with that directory first on
  PYTHONPATH (the installed modelhost is the working tree's, in editable mode). Both servers run with
  PYTHONSAFEPATH=1: `python -m` otherwise puts the current directory first on sys.path, and from a
  checkout that is the working tree's code for both.
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
    """User + system time of the process and of its children while they run (`--workers`: the workers do the work)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    own = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    return own + sum(process_cpu_s(int(child)) for child in children)


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


def remove_tree(tree: Path) -> None:
    """Undo `base_tree`."""
    subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)], check=False,
                   capture_output=True)


def check_source(env: dict[str, str], expected: Path) -> None:
    """That a server started with `env` imports modelhost from `expected`."""
    probe = [sys.executable, "-c", "import modelhost; print(modelhost.__file__)"]
    found = subprocess.run(probe, env={**os.environ, **env}, capture_output=True, text=True, check=True).stdout.strip()
    if not Path(found).resolve().is_relative_to(expected.resolve()):
        raise SystemExit(f"a server would import modelhost from {found}, not from {expected}")


def median(runs: list[dict[str, float]], key: str) -> float:
    return statistics.median(run[key] for run in runs)


def table(cells: list[Cell], results: dict[tuple[str, Cell], list[dict[str, float]]], builds: list[str]) -> str:
    base, new = builds
    lines = [f"| cell | {base}: req/s, p50, p99 ms, CPU µs / request | {new}: the same | new / base req/s, p99, "
             "CPU (median of pairs) |", "|---|---|---|---|"]
    for cell in cells:
        a, b = results[(base, cell)], results[(new, cell)]
        cols = [f"{median(runs, 'rps'):.0f}, {median(runs, 'p50'):.2f}, {median(runs, 'p99'):.2f}, "
                f"{median(runs, 'cpu_us'):.0f}" for runs in (a, b)]
        ratios = [statistics.median(y[key] / x[key] for x, y in zip(a, b, strict=True))
                  for key in ("rps", "p99", "cpu_us")]
        lines.append(f"| {cell} | {cols[0]} | {cols[1]} | {ratios[0]:.2f}x, {ratios[1]:.2f}x, {ratios[2]:.2f}x |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base", required=True, help="the git revision to compare the working tree with")
    parser.add_argument("--pairs", type=int, default=6)
    parser.add_argument("--duration", type=float, default=2.0)
    parser.add_argument("--cells", default="tiny:http:8,tiny:http:32,tiny:http:128,tiny:grpc:8,tiny:grpc:32")
    parser.add_argument("--args", default="", help="extra `modelhost serve` arguments for both builds")
    parser.add_argument("--base-args", default="", help="and for the base build only")
    parser.add_argument("--new-args", default="", help="and for the working tree only")
    options = parser.parse_args()
    cells = parse_cells(options.cells)
    with tempfile.TemporaryDirectory(prefix="builds-") as scratch:
        workdir = Path(scratch)
        repository = ensure_example_repository(workdir / "cache")
        data = {model: input_data(model, workdir) for model in {cell.model for cell in cells}}
        tree = base_tree(options.base, workdir)
        names = [f"base ({options.base})", "working tree"]
        servers: dict[str, ServerProcess] = {}
        results: dict[tuple[str, Cell], list[dict[str, float]]] = {}
        try:
            builds = zip(names, ({"PYTHONPATH": str(tree)}, {}), (options.base_args, options.new_args), strict=True)
            for name, env, own_args in builds:
                env = {**env, "PYTHONSAFEPATH": "1"}
                check_source(env, tree if env.get("PYTHONPATH") else ROOT)
                args = shlex.split(options.args) + shlex.split(own_args)
                servers[name] = ServerProcess(repository, *args, env=env).wait_ready()
            for cell in cells:
                for pair in range(options.pairs):
                    for name in (names if pair % 2 == 0 else names[::-1]):
                        result = measure(servers[name], cell, data[cell.model], options.duration)
                        results.setdefault((name, cell), []).append(result)
                        print(f"{cell}, pair {pair}, {name}: {result['rps']:.0f} req/s, p50 {result['p50']:.2f} ms, "
                              f"p99 {result['p99']:.2f} ms, {result['cpu_us']:.0f} µs CPU per request", flush=True)
        finally:
            for server in servers.values():
                server.stop()
            remove_tree(tree)
        print()
        print(table(cells, results, names))


if __name__ == "__main__":
    main()
