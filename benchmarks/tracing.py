"""Tracing benchmark: what the trace extension costs, off (the default) and tracing every request.

    python benchmarks/tracing.py [--duration 5] [--rounds 3] [--before /path/to/a/checkout/without/tracing]

`tiny`, 1 row per binary request over HTTP, wrk at concurrency 8. Servers, each in rounds taken in turn so
that the machine's noise spreads over all of them: `before` (a checkout without the trace extension, by
default none: that server is skipped), `off` (this checkout, no --trace-config), and `every` (rate 1,
TIMESTAMPS, written to a file every 1,000 traces). Prints each server's median requests/s and p50 latency, and
the ratios to `off`.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from serving import ROOT, check, infer_body, wrk  # noqa: E402

from modelhost.example_repository import ensure_example_repository  # noqa: E402
from tests.server import ServerProcess  # noqa: E402


def servers(repository: Path, workdir: Path, before: Path | None) -> dict[str, ServerProcess]:
    started: dict[str, ServerProcess] = {}
    if before is not None:
        started["before"] = ServerProcess(repository, env={"PYTHONPATH": str(before)})
    started["off"] = ServerProcess(repository, env={"PYTHONPATH": str(ROOT)})
    trace = ["--trace-config", f"triton,file={workdir / 'trace.json'}", "--trace-config", "triton,log-frequency=1000",
             "--trace-config", "level=TIMESTAMPS", "--trace-config", "rate=1"]
    started["every"] = ServerProcess(repository, *trace, env={"PYTHONPATH": str(ROOT)})
    for server in started.values():
        server.wait_ready()
    return started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    for flag, kind, default, text in (("--duration", int, 5, "seconds per wrk run (after 1 s warm-up)"),
                                      ("--rounds", int, 3, "runs per server, taken in turn"),
                                      ("--before", Path, None, "a checkout without the trace extension")):
        parser.add_argument(flag, type=kind, default=default, help=text)
    args = parser.parse_args()
    print(f"load average at start {os.getloadavg()}", flush=True)
    repository = ensure_example_repository(Path(os.environ.get("MODELHOST_CACHE_DIR", "/tmp/modelhost-bench")))
    array = np.random.default_rng(0).standard_normal((1, 4)).astype(np.float32)
    body, header_length = infer_body("x", array, "y", binary=True)
    with tempfile.TemporaryDirectory() as workdir:
        body_file = Path(workdir) / "body"
        body_file.write_bytes(body)
        running = servers(repository, Path(workdir), args.before)
        try:
            results: dict[str, list[dict]] = {name: [] for name in running}
            for server in running.values():
                check(f"{server.base}/v2/models/tiny/infer", body, header_length, _tiny(repository, array))
            for _ in range(args.rounds):
                for name, server in running.items():
                    results[name].append(wrk(f"{server.base}/v2/models/tiny/infer", body_file, header_length, 8,
                                             args.duration))
        finally:
            for server in running.values():
                server.stop()
    medians = {name: (statistics.median(r["rps"] for r in runs), statistics.median(r["p50"] for r in runs))
               for name, runs in results.items()}
    off_rps, off_p50 = medians["off"]
    print(f"{'server':<8} {'req/s':>9} {'p50 ms':>8} {'req/s / off':>12} {'p50 / off':>10}")
    for name, (rps, p50) in medians.items():
        print(f"{name:<8} {rps:>9.0f} {p50:>8.3f} {rps / off_rps:>12.3f} {p50 / off_p50:>10.3f}")


def _tiny(repository: Path, array: np.ndarray) -> np.ndarray:
    import onnxruntime as ort

    session = ort.InferenceSession(str(repository / "tiny" / "1" / "model.onnx"), providers=["CPUExecutionProvider"])
    return session.run(["y"], {"x": array})[0]


if __name__ == "__main__":
    main()
