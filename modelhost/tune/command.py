"""`modelhost tune MODEL --p99-ms 20`: find the configuration of MODEL that serves the most requests/s with
p99 within the budget, on the server that runs it now.

    modelhost serve --model-repository repo --model-control-mode explicit --load-model rank &
    modelhost tune rank --p99-ms 50 -b 500 -u 127.0.0.1:8000

Each trial loads a configuration through the repository extension (load with a config: nothing restarts,
requests in flight finish on the old one) and measures it with `modelhost perf`'s generator. The winner stays
loaded (--restore puts the model's own back); DIR/config.pbtxt holds it, DIR/report.html shows every trial.
The client split factor is the client's: pass it to modelhost.client as `split=`.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from datetime import datetime, timezone
from pathlib import Path

from modelhost.client import Client, ClientError
from modelhost.perf import arguments
from modelhost.perf import inputs as request_inputs
from modelhost.perf.sweep import Sweep
from modelhost.tune.capacity import MAX_CONCURRENCY
from modelhost.tune.knobs import Space, configured, knobs_of
from modelhost.tune.report import write_tune_report
from modelhost.tune.search import Search


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="modelhost tune", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add = parser.add_argument
    add("model", help="the model to tune (the server must allow loading it: --model-control-mode explicit)")
    add("--p99-ms", type=float, required=True, help="the p99 latency budget, milliseconds, as the client sees it")
    add("-u", "--url", default=None, help="the server, host:port (default 127.0.0.1:8000, or :8001 for grpc)")
    add("-i", "--protocol", choices=("http", "grpc"), default="http")
    add("-b", "--batch-size", type=int, default=1, help="rows per request (default 1)")
    add("--input-data", default="random", help="random, zero, or a file of requests (as modelhost perf)")
    add("--shape", action="append", default=[], metavar="NAME:D1,D2", help="dims of a variable-size input")
    add("--time-limit", type=float, default=300.0, metavar="SECONDS", help="search time (default 300)")
    add("--measurement-interval", type=float, default=1500.0, metavar="MS",
        help="each step's window while searching (default 1500; the final comparison uses three times it)")
    add("--warmup", type=float, default=0.5, metavar="SECONDS", help="load before each window (default 0.5)")
    add("--server-cores", type=int, default=os.cpu_count() or 1,
        help="cores the server has, for instance and thread counts (default: this machine's)")
    add("--processes", default="auto", help="load generator processes, or auto")
    add("--max-concurrency", type=int, default=MAX_CONCURRENCY, help="the most requests a trial keeps in "
        f"flight (default {MAX_CONCURRENCY})")
    add("--restore", action="store_true", help="load the model's own configuration again when done")
    add("-o", "--output-dir", type=Path, default=None, help="where the report goes (default tune_<model>)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if (not args.p99_ms > 0 or args.batch_size < 1 or args.server_cores < 1 or not args.time_limit > 0
            or args.max_concurrency < 1):
        parser.error("--p99-ms, --time-limit, -b, --server-cores and --max-concurrency must be above 0")
    try:
        shapes = dict(arguments.parse_shape(text) for text in args.shape)
        processes = arguments.parse_processes(args.processes)
    except ValueError as exc:
        parser.error(str(exc))
    address = arguments.server_address(args.url, args.protocol)
    try:
        base, requests = arguments.model_requests(address, args.model, "", args.batch_size, shapes, args.input_data)
    except ClientError as exc:
        print(f"modelhost tune: {address}: {exc}", file=sys.stderr)
        return 1
    except request_inputs.InputError as exc:
        print(f"modelhost tune: {exc}", file=sys.stderr)
        return 2
    sweep = Sweep(model=args.model, url=address, protocol=args.protocol, mode="concurrency", loads=(),
                  warmup_s=args.warmup, duration_s=args.measurement_interval / 1000.0, processes=processes)
    search = Search(args.model, base, Space(args.batch_size, args.server_cores, args.p99_ms), sweep, args.time_limit,
                    sys.stderr, args.max_concurrency)
    try:
        best = search.run(requests, knobs_of(base))
        baseline, final = search.confirm(requests, best, search.trials[0])
    except ClientError as exc:
        print(f"modelhost tune: {exc}", file=sys.stderr)
        return 1
    assert baseline.result is not None and final.result is not None
    winner = final if final.result.throughput >= baseline.result.throughput else baseline
    config = configured(base, winner.knobs)
    with Client(address) as client:
        client.load_model(args.model, config=base if args.restore else config)
    meta = {"model": args.model, "url": address, "p99_budget_ms": args.p99_ms, "batch_size": args.batch_size,
            "baseline_throughput": baseline.result.throughput, "baseline_p99_ms": baseline.result.p99_ms,
            "tuned_throughput": winner.result.throughput if winner.result else 0.0,
            "tuned_p99_ms": winner.result.p99_ms if winner.result else 0.0,
            "gain": (winner.result.throughput / baseline.result.throughput
                     if winner.result and baseline.result.throughput else 0.0),
            "client_split": winner.knobs.client_split, "trials": len(search.trials),
            "left_loaded": "the model's own configuration" if args.restore else "the tuned configuration",
            "finished": datetime.now(timezone.utc).isoformat(timespec="seconds")}
    directory = args.output_dir or Path(f"tune_{args.model}")
    files = write_tune_report(directory, search.trials, baseline, winner, config, meta)
    print(f"baseline: {baseline.result.throughput:.1f} req/s at p99 {baseline.result.p99_ms:.1f} ms; "
          f"tuned: {meta['tuned_throughput']:.1f} req/s at p99 {meta['tuned_p99_ms']:.1f} ms "
          f"({meta['gain']:.2f}x), budget {args.p99_ms:g} ms")
    print(f"winner: {winner.knobs.describe()}")
    print(f"config: {files['config.pbtxt']}; report: {files['report.html']}")
    return 0
