"""What a server of many models pays for being watched: its requests' tail while it polls the repository or is
scraped for metrics, and the CPU each poll and scrape takes.

    python benchmarks/many_models.py [--models 300] [--poll-secs 2] [--scrape-secs 1] [--seconds 12] [--base REV]
        [--via v2|sagemaker]

A Triton-layout repository of --models small ONNX models (tests/archives.py's weighted_model, 16 FP32 features,
each with its config.pbtxt) served by `modelhost serve` in turn: left alone, polling the repository every
--poll-secs, and scraped (GET /metrics on the metrics port) every --scrape-secs; with --base, the base build (a
`git worktree` of REV first on PYTHONPATH) left alone, polled and scraped too. Each way: one client sends one model's
request back to back (requests, one connection) for --seconds, while a second process scrapes where the way does:
V2 JSON, or (--via sagemaker) a CSV line to the SageMaker port's /invocations naming the model in
X-Amzn-SageMaker-Custom-Attributes, one endpoint serving the whole repository; p50, p99, p99.9, the slowest and the
server's CPU per request; then --seconds with no requests for its CPU per poll or scrape (from /proc, 10 ms ticks).
Client and server share the machine's cores: compare the rows of one run.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
import requests

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.builds import base_tree, check_source, remove_tree  # noqa: E402
from tests.archives import weighted_model  # noqa: E402
from tests.server import free_port  # noqa: E402

WIDTH = 16
TICK = os.sysconf("SC_CLK_TCK")


def write_repository(root: Path, count: int) -> None:
    for i in range(count):
        model = root / f"m{i:03d}"
        (model / "1").mkdir(parents=True)
        onnx.save_model(weighted_model(float(i), WIDTH), str(model / "1" / "model.onnx"))
        (model / "config.pbtxt").write_text(f'name: "m{i:03d}"\nbackend: "onnxruntime"\nmax_batch_size: 8\n')


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def scrape_every(url: str, seconds: float) -> subprocess.Popen[bytes]:
    """A process that GETs `url` every `seconds` until killed (apart from the client: no GIL shared with it)."""
    loop = (f"import time, urllib.request\nwhile True:\n    urllib.request.urlopen({url!r}, timeout=60).read()\n"
            f"    time.sleep({seconds})\n")
    return subprocess.Popen([sys.executable, "-c", loop], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def measure(repository: Path, tree: Path, poll_secs: float, scrape_secs: float, seconds: float,
            via: str) -> dict[str, float]:
    port, metrics_port, sagemaker_port = free_port(), free_port(), free_port()
    mode = ["--model-control-mode", "poll", "--repository-poll-secs", str(poll_secs)] if poll_secs else [
        "--model-control-mode", "none"]
    env = {"PYTHONPATH": str(tree), "PYTHONSAFEPATH": "1"}
    check_source(env, tree)
    server = subprocess.Popen(
        [sys.executable, "-m", "modelhost", "serve", "--model-repository", str(repository), *mode,
         "--http-port", str(port), "--grpc-port", str(free_port()), "--metrics-port", str(metrics_port),
         "--sagemaker-port", str(sagemaker_port)],
        env={**os.environ, **env}, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    session = requests.Session()
    session.headers["Accept-Encoding"] = "identity"  # requests asks for gzip by default, which V2 infer honours
    url = f"http://127.0.0.1:{port}"
    scraper: subprocess.Popen[bytes] | None = None
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                if session.get(f"{url}/v2/health/ready", timeout=5).ok:
                    break
            except requests.ConnectionError:
                pass
            if time.monotonic() > deadline or server.poll() is not None:
                raise SystemExit("the server did not become ready")
            time.sleep(0.2)
        time.sleep(max(2.0, poll_secs))  # past the first poll
        if scrape_secs:
            scraper = scrape_every(f"http://127.0.0.1:{metrics_port}/metrics", scrape_secs)
        if via == "sagemaker":
            target, body = f"http://127.0.0.1:{sagemaker_port}/invocations", ",".join(["1.0"] * WIDTH)
            headers = {"Content-Type": "text/csv", "X-Amzn-SageMaker-Custom-Attributes": "tfs-model-name=m007"}
        else:
            target, headers = f"{url}/v2/models/m007/infer", {"Content-Type": "application/json"}
            body = json.dumps({"inputs": [{"name": "INPUT0", "shape": [1, WIDTH], "datatype": "FP32",
                                           "data": [1.0] * WIDTH}]})
        latencies = []
        busy_from = cpu_seconds(server.pid)
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            started = time.perf_counter()
            answer = session.post(target, data=body, headers=headers, timeout=30)
            latencies.append(time.perf_counter() - started)
            answer.raise_for_status()
        busy_cpu = cpu_seconds(server.pid) - busy_from
        idle_from = cpu_seconds(server.pid)
        time.sleep(seconds)
        idle_cpu = cpu_seconds(server.pid) - idle_from
    finally:
        if scraper is not None:
            scraper.kill()
            scraper.wait()
        server.terminate()
        server.wait(timeout=60)
    ms = np.asarray(latencies) * 1e3
    events = seconds / poll_secs if poll_secs else seconds / scrape_secs if scrape_secs else 0
    return {"requests": len(ms), "cpu_us_per_request": busy_cpu / len(ms) * 1e6,
            "p50": float(np.percentile(ms, 50)), "p99": float(np.percentile(ms, 99)),
            "p99.9": float(np.percentile(ms, 99.9)), "max": float(ms.max()),
            "idle_cpu_ms_per_s": idle_cpu / seconds * 1e3, "cpu_ms_per_event": idle_cpu / events * 1e3 if events else 0}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", type=int, default=300)
    parser.add_argument("--poll-secs", type=float, default=2.0)
    parser.add_argument("--scrape-secs", type=float, default=1.0)
    parser.add_argument("--seconds", type=float, default=12.0)
    parser.add_argument("--base", help="a git revision to measure beside this build")
    parser.add_argument("--via", choices=("v2", "sagemaker"), default="v2", help="the requests' protocol")
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="modelhost-poll-"))
    repository = workdir / "repository"
    write_repository(repository, args.models)
    poll, scrape = f"polled every {args.poll_secs:g} s", f"scraped every {args.scrape_secs:g} s"
    ways = [("this build, alone", ROOT, 0.0, 0.0), (f"this build, {poll}", ROOT, args.poll_secs, 0.0),
            (f"this build, {scrape}", ROOT, 0.0, args.scrape_secs)]
    if args.base:
        base = base_tree(args.base, workdir)
        ways += [(f"{args.base}, alone", base, 0.0, 0.0), (f"{args.base}, {poll}", base, args.poll_secs, 0.0),
                 (f"{args.base}, {scrape}", base, 0.0, args.scrape_secs)]
    try:
        print(f"{args.models} models; one client ({args.via}), back to back, {args.seconds:g} s a way\n")
        print("| server | requests | CPU µs a request | p50 ms | p99 ms | p99.9 ms | max ms | idle CPU ms/s | "
              "CPU ms a poll or scrape |\n|---|---|---|---|---|---|---|---|---|")
        for label, tree, poll_secs, scrape_secs in ways:
            r = measure(repository, tree, poll_secs, scrape_secs, args.seconds, args.via)
            print(f"| {label} | {r['requests']:.0f} | {r['cpu_us_per_request']:.0f} | {r['p50']:.2f} | "
                  f"{r['p99']:.2f} | {r['p99.9']:.2f} | {r['max']:.1f} | {r['idle_cpu_ms_per_s']:.1f} | "
                  f"{r['cpu_ms_per_event']:.0f} |", flush=True)
    finally:
        if args.base:
            remove_tree(workdir / "base")
        subprocess.run(["rm", "-rf", str(workdir)], check=False)


if __name__ == "__main__":
    main()
