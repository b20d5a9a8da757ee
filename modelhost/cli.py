"""`modelhost serve ...`: flags -> ServerSettings -> Server.run()."""

from __future__ import annotations

import argparse
import logging
from dataclasses import fields
from pathlib import Path

from modelhost import __version__
from modelhost.settings import ServerSettings

_LOG_LEVELS = ["critical", "error", "warning", "info", "debug"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="modelhost", description="Serve a Triton-layout model repository.")
    parser.add_argument("--version", action="version", version=f"modelhost {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve", help="start the server")
    serve.add_argument("--model-repository", type=Path, help="model repository (default: built-in examples)")
    serve.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    serve.add_argument("--http-port", type=int, default=8000)
    serve.add_argument("--grpc-port", type=int, default=8001, help="reserved for the gRPC front-end")
    serve.add_argument("--metrics-port", type=int, default=8002, help="Prometheus metrics at /metrics (0: off)")
    serve.add_argument("--log-level", default="info", choices=_LOG_LEVELS)
    serve.add_argument("--strict-readiness", action="store_true",
                       help="server ready only when every model loaded (Triton's default)")
    serve.add_argument("--default-max-batch-size", type=int, default=4,
                       help="max_batch_size given to auto-completed models that can batch")
    serve.add_argument("--http-max-body-bytes", type=int, default=64 * 1024 * 1024)
    serve.add_argument("--workers", type=int, default=1,
                       help="server processes sharing the HTTP port; each loads every model (default 1)")
    serve.add_argument("--graceful-shutdown-seconds", type=float, default=30.0,
                       help="how long SIGTERM waits for in-flight requests")
    return parser


def settings_from_args(args: argparse.Namespace) -> ServerSettings:
    names = {f.name for f in fields(ServerSettings)}
    return ServerSettings(**{k: v for k, v in vars(args).items() if k in names})


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    settings = settings_from_args(args)
    if settings.workers < 1:
        build_parser().error("--workers must be at least 1")
    if settings.workers > 1:
        from modelhost.workers import run_workers

        return run_workers(settings)
    from modelhost.app import Server

    Server(settings).run()
    return 0
