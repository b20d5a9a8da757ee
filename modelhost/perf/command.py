"""`modelhost perf`: load a model on any KServe V2 server and report what it holds.

    modelhost perf -m rank -u 127.0.0.1:8000 --concurrency-range 1:8:1 -b 500
    modelhost perf -m rank -i grpc -u 127.0.0.1:8001 --request-rate 50,100,200 --input-data requests.json

Flags follow perf_analyzer's where it has them (-m, -u, -i, -b, --concurrency-range, --request-rate-range,
--measurement-interval in ms, --input-data, --shape, -f). Writes results.csv, results.json, latency.png and
report.html into --output-dir.
"""

from __future__ import annotations

import argparse
import platform
import sys
from collections.abc import Sequence
from datetime import datetime, timezone
from pathlib import Path

from modelhost.client import ClientError
from modelhost.perf import arguments
from modelhost.perf import inputs as request_inputs
from modelhost.perf.report import write_csv, write_report
from modelhost.perf.sweep import Sweep, run_sweep


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="modelhost perf", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add = parser.add_argument
    add("-m", "--model-name", required=True, help="the model to load")
    add("-x", "--model-version", default="", help="its version (default: the server's choice)")
    add("-u", "--url", default=None, help="the server, host:port (default 127.0.0.1:8000, or :8001 for grpc)")
    add("-i", "--protocol", choices=("http", "grpc"), default="http")
    add("-b", "--batch-size", type=int, default=1, help="rows per request for a batching model (default 1)")
    add("--concurrency-range", metavar="START[:END[:STEP]]", help="closed loop: requests kept in flight, "
        "from START to END by STEP (default 1)")
    add("--concurrency", metavar="N,N,...", help="closed loop: these concurrency levels")
    add("--request-rate-range", metavar="START[:END[:STEP]]", help="open loop: Poisson arrivals, requests/s")
    add("--request-rate", metavar="R,R,...", help="open loop: these request rates")
    add("--measurement-interval", type=float, default=5000.0, metavar="MS",
        help="each step's measured window in milliseconds (default 5000)")
    add("--warmup", type=float, default=1.0, metavar="SECONDS", help="load before each window (default 1)")
    add("--input-data", default="random", help="random (default), zero, or a file: .json (perf_analyzer's "
        "input data, or V2 request bodies), .npy (the one input), .npz (inputs by name)")
    add("--shape", action="append", default=[], metavar="NAME:D1,D2", help="dims of a variable-size input, "
        "without the batch dim (repeatable)")
    add("--processes", default="auto", help="generator processes, or auto: more when one is the bottleneck")
    add("--timeout", type=float, default=None, metavar="SECONDS", help="each request's deadline")
    add("--split", type=int, default=1, help="parts the client cuts each request into (default 1: whole; "
        "0: as the model's config suggests)")
    add("--json-tensors", action="store_true", help="HTTP: send tensors as JSON instead of binary")
    add("-o", "--output-dir", type=Path, default=None, help="where the report goes (default perf_<model>)")
    add("-f", "--latency-report-file", type=Path, default=None, help="also write the CSV here")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        mode, loads = _loads(args)
        shapes = dict(arguments.parse_shape(text) for text in args.shape)
        processes = arguments.parse_processes(args.processes)
    except ValueError as exc:
        parser.error(str(exc))
    address = arguments.server_address(args.url, args.protocol)
    try:
        _, requests = arguments.model_requests(address, args.model_name, args.model_version, args.batch_size, shapes,
                                               args.input_data)
    except ClientError as exc:
        print(f"modelhost perf: {address}: {exc}", file=sys.stderr)
        return 1
    except request_inputs.InputError as exc:
        print(f"modelhost perf: {exc}", file=sys.stderr)
        return 2
    sweep = Sweep(model=args.model_name, url=address, protocol=args.protocol, mode=mode, loads=loads,
                  warmup_s=args.warmup, duration_s=args.measurement_interval / 1000.0, timeout_s=args.timeout,
                  split=None if args.split == 0 else args.split, processes=processes, binary=not args.json_tensors)
    steps, learned = run_sweep(sweep, requests, sys.stderr)
    meta = {"model": args.model_name, "version": args.model_version, "url": address, "protocol": args.protocol,
            "batch_size": args.batch_size, "input_data": args.input_data, "split": args.split,
            "warmup_s": args.warmup, "measurement_interval_ms": args.measurement_interval,
            "started": datetime.now(timezone.utc).isoformat(timespec="seconds"), "client_host": platform.node(),
            **learned}
    directory = args.output_dir or Path(f"perf_{args.model_name}")
    files = write_report(directory, steps, meta, title=f"modelhost perf: {args.model_name} over {args.protocol}")
    if args.latency_report_file:
        write_csv(args.latency_report_file, steps)
    print(f"report: {files['html']}")
    return 0


def _loads(args: argparse.Namespace) -> tuple[str, list[float]]:
    given = [(name, value) for name, value in (("concurrency-range", args.concurrency_range),
                                               ("concurrency", args.concurrency),
                                               ("request-rate-range", args.request_rate_range),
                                               ("request-rate", args.request_rate)) if value]
    if len(given) > 1:
        raise ValueError(f"give one of --{given[0][0]} and --{given[1][0]}, not both")
    name, value = given[0] if given else ("concurrency-range", "1")
    mode = "concurrency" if name.startswith("concurrency") else "rate"
    loads = _range(value, name) if name.endswith("range") else [_number(v, name) for v in value.split(",")]
    if mode == "concurrency" and any(load != int(load) for load in loads):
        raise ValueError(f"--{name} takes whole numbers of requests, got {value}")
    return mode, loads


def _range(text: str, name: str) -> list[float]:
    parts = [_number(part, name) for part in text.split(":")]
    if len(parts) > 3:
        raise ValueError(f"--{name} is START[:END[:STEP]], got {text}")
    start = parts[0]
    end = parts[1] if len(parts) > 1 else start
    step = parts[2] if len(parts) > 2 else 1.0
    if end < start:
        raise ValueError(f"--{name}: END {end:g} is below START {start:g}")
    count = int((end - start) / step + 1e-9) + 1
    if count > 1000:
        raise ValueError(f"--{name} {text} makes {count} steps; at most 1000")
    return [start + step * index for index in range(count)]


def _number(text: str, name: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"--{name}: {text!r} is not a number") from None
    if not value > 0:
        raise ValueError(f"--{name}: {text} must be above 0")
    return value
