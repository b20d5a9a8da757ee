"""NVIDIA's perf_analyzer (C++), the load generator Triton users measure with, as side_by_side.py's client.

    python benchmarks/peers/perf_analyzer.py   # find it, or install it into the cache below; print its version

Where it comes from: tritonclient 2.41.0 is the last tritonclient wheel to carry the binary (in its data
directory, tritonclient-2.41.0.data/data/bin/perf_analyzer, manylinux x86_64). It links libcudart.so.12,
taken from the nvidia-cuda-runtime-cu12 wheel of CUDA 12.3 (Triton 23.12's, which tritonclient 2.41.0
belongs to; no GPU is needed, it is only loaded), and libb64.so.0d, which this cannot install (Debian
package libb64-0d). Both wheels are fetched with `pip download --no-deps` and only unpacked, into
MODELHOST_PERF_ANALYZER_DIR (default ~/.cache/modelhost-benchmarks/perf_analyzer): installing tritonclient
2.41.0 would downgrade the tritonclient modelhost uses. A perf_analyzer on PATH is used when none is cached.

How `measure` runs it, for one server, model and concurrency c:
- Load: perf_analyzer's default synchronous mode, `--concurrency-range c`: c threads, one request in
  flight each, over HTTP (the V2 binary tensor extension both ways, perf_analyzer's default) or gRPC.
- Requests: `--input-data` JSON written by `write_input_data`, one step per row of the array (its bytes
  in base64) and `-b rows`. perf_analyzer fills a batch of b from b consecutive steps, starting at step
  (request index x b) mod steps, so with as many steps as rows every request carries the whole array,
  rows in order: rank's 500 x 1000 FP32 array is one 2 MB request, tiny's 1 x 4 one step. With expected
  outputs given (validation_data), perf_analyzer compares every answer byte for byte with them and stops
  on the first mismatch.
- Measurement: `--measurement-mode time_windows`, three windows that together last `seconds` (each
  lasts 1.2 x `--measurement-interval`), stability not asked of them (`--stability-percentage` so large
  that any three windows pass, `--max-trials 3`): perf_analyzer merges its last three windows, so the
  figures cover all of the measured time, as one wrk run's do. A window in which no request completed
  still fails the run. A warm-up is a separate run whose figures are dropped.
- Figures, from its `-f` CSV: req/s = its inferences/s over the batch size; p50 and p99 of the requests
  that completed within the windows (`--percentile=99` also makes p99 the latency it reports on).
A run that exits non-zero (a failed request, a wrong answer, no answer within a window) raises
PerfAnalyzerError with the tail of what it printed.
"""

from __future__ import annotations

import base64
import csv
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import numpy as np

CACHE = Path(os.environ.get("MODELHOST_PERF_ANALYZER_DIR", "~/.cache/modelhost-benchmarks/perf_analyzer")).expanduser()
TRITONCLIENT = "tritonclient==2.41.0"
CUDA_RUNTIME = "nvidia-cuda-runtime-cu12==12.3.101"
BINARY_IN_WHEEL = "tritonclient-2.41.0.data/data/bin/perf_analyzer"
CUDART_IN_WHEEL = "nvidia/cuda_runtime/lib/libcudart.so.12"
PROTOCOLS = ("http", "grpc")
WINDOWS = 3  # the stability window: perf_analyzer merges the last three measurement windows
WINDOW_STRETCH = 1.2  # a time window lasts this many times --measurement-interval
ANY_WINDOWS_STABLE = "1000000"  # --stability-percentage
TAIL_LINES = 20


class PerfAnalyzerError(RuntimeError):
    pass


@dataclass(frozen=True)
class PerfAnalyzer:
    binary: Path
    library_dir: Path | None  # where its libcudart.so.12 is, when not on the system's path

    def environment(self) -> dict[str, str]:
        env = dict(os.environ)
        if self.library_dir is not None:
            env["LD_LIBRARY_PATH"] = os.pathsep.join(filter(None, [str(self.library_dir), env.get("LD_LIBRARY_PATH")]))
        return env

    def run(self, args: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
        """Run it; a non-zero exit raises PerfAnalyzerError with the tail of its output."""
        done = subprocess.run([str(self.binary), *args], env=self.environment(), capture_output=True, text=True,
                              timeout=timeout)
        if done.returncode != 0:
            raise PerfAnalyzerError(failure_message(done))
        return done

    def version(self) -> str:
        done = self.run(["--version"], timeout=30)
        return (done.stdout + done.stderr).strip()  # 2.41.0 prints it on stderr


def failure_message(done: subprocess.CompletedProcess[str]) -> str:
    """First line: the exit status and the last thing it said (a cell's footnote); then the tails."""
    stderr = [line for line in done.stderr.splitlines() if line.strip()]
    stdout = [line for line in done.stdout.splitlines() if line.strip()]
    last = (stderr or stdout or ["(no output)"])[-1].strip()
    return "\n".join([f"perf_analyzer exited with {done.returncode}: {last}", "stderr:", *stderr[-TAIL_LINES:],
                      "stdout:", *stdout[-TAIL_LINES:]])


@dataclass(frozen=True)
class InputData:
    path: Path  # perf_analyzer --input-data JSON
    batch_size: int  # -b: the rows of one request


def encoded(array: np.ndarray) -> dict[str, str]:
    return {"b64": base64.b64encode(np.ascontiguousarray(array).tobytes()).decode("ascii")}


def write_input_data(path: Path, input_name: str, array: np.ndarray, output_name: str | None = None,
                     expected: np.ndarray | None = None) -> InputData:
    """`array` (first axis: the model's batch dimension) as perf_analyzer --input-data JSON, one step per
    row; with `expected` (the answer to the whole array), perf_analyzer checks every answer against it."""
    document: dict[str, list[dict[str, dict[str, str]]]] = {"data": [{input_name: encoded(row)} for row in array]}
    if expected is not None:
        if output_name is None or len(expected) != len(array):
            raise ValueError("expected needs output_name and one row per row of array")
        document["validation_data"] = [{output_name: encoded(row)} for row in expected]
    path.write_text(json.dumps(document))
    return InputData(path, len(array))


def measure(protocol: str, url: str, model: str, data: InputData, concurrency: int, seconds: float,
            warmup_s: float = 0.0, shared_memory: str = "none", rate: float = 0.0) -> dict[str, float]:
    """req/s, p50 and p99 ms of `concurrency` synchronous clients over `seconds` (after `warmup_s`, if any).
    `url` is host:port of the server's HTTP or gRPC endpoint, as `protocol` says. `shared_memory` "system":
    inputs and outputs through system shared memory regions perf_analyzer registers (its --shared-memory).
    `rate` > 0: open loop instead, requests sent at that many a second whenever the last are answered or not
    (its --request-rate-range; `concurrency` is then ignored)."""
    if protocol not in PROTOCOLS:
        raise ValueError(f"protocol: {protocol!r}, not one of {PROTOCOLS}")
    analyzer = find_or_install()
    with tempfile.TemporaryDirectory(prefix="perf-analyzer-") as scratch:
        if warmup_s > 0:
            run_windows(analyzer, protocol, url, model, data, concurrency, warmup_s, Path(scratch) / "warmup.csv",
                        shared_memory, rate)
        return run_windows(analyzer, protocol, url, model, data, concurrency, seconds, Path(scratch) / "run.csv",
                           shared_memory, rate)


def run_windows(analyzer: PerfAnalyzer, protocol: str, url: str, model: str, data: InputData, concurrency: int,
                seconds: float, csv_file: Path, shared_memory: str = "none", rate: float = 0.0) -> dict[str, float]:
    interval_ms = max(1, round(seconds * 1000 / (WINDOWS * WINDOW_STRETCH)))
    load = f"--request-rate-range={rate:g}" if rate > 0 else f"--concurrency-range={concurrency}"
    args = ["-m", model, "-i", protocol, "-u", url, "-b", str(data.batch_size), "--input-data", str(data.path),
            load, "--measurement-mode=time_windows",
            f"--measurement-interval={interval_ms}", "--percentile=99",
            f"--stability-percentage={ANY_WINDOWS_STABLE}", f"--max-trials={WINDOWS}", "-f", str(csv_file),
            f"--shared-memory={shared_memory}"]
    analyzer.run(args, timeout=2 * seconds + 60)
    return read_csv(csv_file, data.batch_size)


BREAKDOWN = ("Client Send", "Network+Server Send/Recv", "Server Queue", "Server Compute Input",
             "Server Compute Infer", "Server Compute Output", "Client Recv")


def read_csv(csv_file: Path, batch_size: int) -> dict[str, float]:
    """The one concurrency's row of perf_analyzer's -f CSV (latencies in us there)."""
    with csv_file.open(newline="") as file:
        rows = list(csv.DictReader(file))
    if len(rows) != 1:
        raise PerfAnalyzerError(f"expected one row in {csv_file}, found {len(rows)}")
    row = rows[0]
    result = {"rps": float(row["Inferences/Second"]) / batch_size, "p50": float(row["p50 latency"]) / 1e3,
              "p99": float(row["p99 latency"]) / 1e3}
    # Mean ms per request of each part, as perf_analyzer splits it (the server's from its statistics extension).
    for column in BREAKDOWN:
        if row.get(column):
            result[column] = float(row[column]) / 1e3
    return result


@cache
def find_or_install(cache_dir: Path = CACHE) -> PerfAnalyzer:
    """The cached perf_analyzer, else one on PATH, else a fresh install into `cache_dir`."""
    binary, library_dir = cache_dir / "perf_analyzer", cache_dir / "lib"
    if binary.is_file() and (library_dir / "libcudart.so.12").is_file():
        return PerfAnalyzer(binary, library_dir)
    on_path = shutil.which("perf_analyzer")
    if on_path is not None:
        return PerfAnalyzer(Path(on_path), None)
    return install(cache_dir)


def install(cache_dir: Path = CACHE) -> PerfAnalyzer:
    """Unpack perf_analyzer and libcudart.so.12 from their wheels into `cache_dir`, binary last (its presence
    means a complete install), and check that it runs."""
    (cache_dir / "lib").mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="perf-analyzer-wheels-") as downloads:
        cudart = extract(download_wheel(CUDA_RUNTIME, Path(downloads)), CUDART_IN_WHEEL, cache_dir / "lib")
        binary = extract(download_wheel(TRITONCLIENT, Path(downloads)), BINARY_IN_WHEEL, cache_dir)
    binary.chmod(0o755)
    analyzer = PerfAnalyzer(binary, cudart.parent)
    try:
        analyzer.version()
    except PerfAnalyzerError as error:
        hint = " (libb64.so.0d: apt-get install libb64-0d)" if "libb64" in str(error) else ""
        raise PerfAnalyzerError(f"perf_analyzer installed in {cache_dir} does not run{hint}: {error}") from error
    return analyzer


def download_wheel(requirement: str, dest: Path) -> Path:
    """`pip download` one binary wheel, no dependencies; its path."""
    before = set(dest.glob("*.whl"))
    done = subprocess.run([sys.executable, "-m", "pip", "download", requirement, "--no-deps", "--only-binary=:all:",
                           "-d", str(dest)], capture_output=True, text=True)
    if done.returncode != 0:
        raise PerfAnalyzerError(f"pip download {requirement} failed:\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
    (wheel,) = set(dest.glob("*.whl")) - before
    return wheel


def extract(wheel: Path, member: str, dest_dir: Path) -> Path:
    """One file out of a wheel into dest_dir, put in place by a rename."""
    target = dest_dir / Path(member).name
    partial = target.with_name(f".{target.name}.partial")
    with zipfile.ZipFile(wheel) as archive, archive.open(member) as source, partial.open("wb") as out:
        shutil.copyfileobj(source, out)
    partial.replace(target)
    return target


def main() -> None:
    analyzer = find_or_install()
    print(f"{analyzer.binary} (libcudart from {analyzer.library_dir or 'the system'}): {analyzer.version()}")


if __name__ == "__main__":
    main()
