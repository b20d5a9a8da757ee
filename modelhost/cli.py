"""Console entries: `modelhost serve ...` and `serve` (a SageMaker image's entry): flags -> ServerSettings -> run.

Flags have no argparse defaults (SUPPRESS), so that only the flags given beat the environment:
default < SAGEMAKER_* variable < explicit flag (settings_sources.resolve_settings).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

from modelhost import __version__
from modelhost.sagemaker_triton import default_model_error
from modelhost.serve_flags import add_serve_flags
from modelhost.settings import ServerSettings, SettingsError
from modelhost.settings_checks import check_settings
from modelhost.settings_sources import resolve_settings, sagemaker_repository, unused_variables

if TYPE_CHECKING:
    from modelhost.protocols.tfserving.model_server import TfServingFlags
    from modelhost.protocols.torchserve.config_properties import TorchServeConfig

# What `serve` changes in a container: listen on every interface (SageMaker connects from outside).
CONTAINER_DEFAULTS = ServerSettings(host="0.0.0.0")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="modelhost", description="Serve a Triton-layout model repository.")
    parser.add_argument("--version", action="version", version=f"modelhost {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve", help="start the server", argument_default=argparse.SUPPRESS)
    add_serve_flags(serve, ServerSettings(), "built-in examples")
    # Listed for --help; `main` hands `modelhost tfserving ...` to its own parser, which has TF Serving's flags.
    commands.add_parser("torchserve", add_help=False,
                        help="serve TorchServe archives as torchserve does, with its flags and config.properties "
                             "(modelhost torchserve --help)")
    commands.add_parser("tfserving", add_help=False,
                        help="serve as tensorflow_model_server, with its flags (modelhost tfserving --help)")
    commands.add_parser("embeddings", add_help=False,
                        help="build embedding tables, or extract them from an ONNX model (modelhost embeddings "
                             "--help)")
    commands.add_parser("perf", add_help=False,
                        help="load a model on any KServe V2 server: latency and throughput by load, with a report "
                             "(modelhost perf --help)")
    commands.add_parser("ray", add_help=False,
                        help="serve on a Ray Serve cluster, each model's requests routed to a replica that holds it "
                             "(modelhost ray --help)")
    commands.add_parser("tune", add_help=False,
                        help="find a model's configuration that serves the most within a p99 budget, on a running "
                             "server (modelhost tune --help)")
    return parser


def build_container_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="serve", argument_default=argparse.SUPPRESS,
        description="Serve models the way a SageMaker container does (docker run <image> serve).",
    )
    parser.add_argument("--version", action="version", version=f"modelhost {__version__}")
    add_serve_flags(parser, CONTAINER_DEFAULTS, "/opt/ml/model, or /opt/ml/models in multi-model mode, when present")
    return parser


def modelhost_settings(argv: Sequence[str] | None, environ: Mapping[str, str]) -> ServerSettings:
    """Settings of `modelhost <argv>`; a bad flag or variable exits 2 with the message on stderr."""
    parser = build_parser()
    args = vars(parser.parse_args(argv))
    args.pop("command")
    args = {name: tuple(value) if isinstance(value, list) else value for name, value in args.items()}
    try:
        return resolve_settings(ServerSettings(), environ, args)
    except SettingsError as exc:
        parser.error(str(exc))


def serve_settings(argv: Sequence[str] | None, environ: Mapping[str, str]) -> ServerSettings:
    """Settings of `serve <argv>`: SageMaker runs `serve` with the argument `serve`, so a leading
    `serve` is dropped. Host 0.0.0.0; with no --model-repository, /opt/ml/model (/opt/ml/models in
    multi-model mode) when that directory exists."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["serve"]:
        argv = argv[1:]
    parser = build_container_parser()
    flags = {name: tuple(value) if isinstance(value, list) else value
             for name, value in vars(parser.parse_args(argv)).items()}
    try:
        settings = resolve_settings(CONTAINER_DEFAULTS, environ, flags)
    except SettingsError as exc:
        parser.error(str(exc))
    if settings.model_repository is None:
        settings = replace(settings, model_repository=sagemaker_repository(environ, settings.multi_model))
    refused = default_model_error(environ, settings.model_repository, settings.multi_model)
    if refused:
        parser.error(refused)
    return settings


def run(settings: ServerSettings, notes: Sequence[str] = ()) -> int:
    """Serve until SIGTERM/SIGINT; one process, or --workers processes. `notes` are logged as warnings first."""
    logging.basicConfig(level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for note in notes:
        logging.getLogger("modelhost").warning("%s", note)
    if settings.workers > 1:
        from modelhost.workers import run_workers

        return run_workers(settings)
    from modelhost.app import Server

    Server(settings).run()
    return 0


def main(argv: list[str] | None = None) -> int:
    """`modelhost ...` (the `modelhost` console entry and `python -m modelhost`)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["tfserving"]:
        return tfserving_main(argv[1:])
    if argv[:1] == ["torchserve"]:
        return torchserve_main(argv[1:])
    if argv[:1] == ["embeddings"]:
        from modelhost.embeddings.command import main as embeddings_main

        return embeddings_main(argv[1:])
    if argv[:1] == ["perf"]:
        from modelhost.perf.command import main as perf_main

        return perf_main(argv[1:])
    if argv[:1] == ["tune"]:
        from modelhost.tune.command import main as tune_main

        return tune_main(argv[1:])
    if argv[:1] == ["ray"]:
        from modelhost.ray_serve.command import main as ray_main

        return ray_main(argv[1:])
    return run(modelhost_settings(argv, os.environ), unused_variables(os.environ))


def tfserving_settings(flags: TfServingFlags) -> ServerSettings:
    """`modelhost tfserving`'s ServerSettings: TF Serving's ports on every interface, its models polled for new
    versions every --file_system_poll_wait_seconds, no SageMaker or separate metrics port."""
    poll = flags.file_system_poll_seconds
    settings = ServerSettings(
        host="0.0.0.0", http_port=flags.rest_api_port, grpc_port=flags.grpc_port, sagemaker_port=0, metrics_port=0,
        model_control_mode="poll" if poll > 0 else "none", repository_poll_seconds=poll if poll > 0 else 15.0,
        model_overrides=flags.overrides,
    )
    check_settings(settings)
    return settings


def tfserving_main(argv: Sequence[str]) -> int:
    """`modelhost tfserving ...`: tensorflow_model_server's command line (protocols/tfserving/model_server.py)."""
    from modelhost.protocols.tfserving.model_server import TfServingFlagError, parse_flags

    try:
        flags = parse_flags(argv)
        settings = tfserving_settings(flags)
    except (TfServingFlagError, SettingsError) as exc:
        print(f"modelhost tfserving: error: {exc}", file=sys.stderr)
        return 2
    if flags.print_version:
        print(f"modelhost {__version__} (TensorFlow ModelServer command line)")
        return 0
    logging.basicConfig(level="INFO", format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for note in flags.setup.notes:
        logging.getLogger("modelhost").warning("%s", note)
    from modelhost.app import Server

    Server(settings, tfserving=flags.setup).run()
    return 0


def torchserve_settings(config: TorchServeConfig, metrics_port: int = 0) -> ServerSettings:
    """`modelhost torchserve`'s ServerSettings: no port of modelhost's own (TorchServe's front-ends have theirs) but
    its metrics where asked, models loaded as they are registered, TorchServe's request and response size limits."""
    settings = ServerSettings(
        host=config.inference_address.host, http_port=0, grpc_port=0, sagemaker_port=0, metrics_port=metrics_port,
        model_control_mode="explicit", http_max_body_bytes=config.max_request_size,
        http_max_buffered_bytes=max(config.max_request_size, ServerSettings().http_max_buffered_bytes),
        max_output_bytes=config.max_response_size,
        tls_cert_file=str(config.certificate_file) if config.certificate_file else None,
        tls_key_file=str(config.private_key_file) if config.private_key_file else None,
    )
    check_settings(settings)
    return settings


def torchserve_main(argv: Sequence[str]) -> int:
    """`modelhost torchserve ...`: torchserve's command line (protocols/torchserve/model_server.py)."""
    from modelhost.backends.torchserve.runtime import TORCHSERVE_VERSION
    from modelhost.protocols.torchserve.config_properties import TorchServeConfigError
    from modelhost.protocols.torchserve.model_server import (
        parse_flags,
        remove_pid_file,
        running_pid,
        stop_server,
        write_pid_file,
    )

    try:
        flags = parse_flags(argv)
        if flags.stop:
            print(stop_server())
            return 0
        if flags.print_version:
            print(f"modelhost {__version__} (TorchServe command line, handlers of TorchServe "
                  f"{TORCHSERVE_VERSION})")
            return 0
        settings = torchserve_settings(flags.setup.config, flags.setup.metrics_port)
    except (TorchServeConfigError, SettingsError) as exc:
        print(f"modelhost torchserve: error: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(level="INFO", format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for note in flags.setup.notes:
        logging.getLogger("modelhost").warning("%s", note)
    from modelhost.app import Server

    if running_pid() is not None:
        print("TorchServe is already running, please use torchserve --stop to stop TorchServe.", file=sys.stderr)
        return 1
    write_pid_file()
    try:
        Server(settings, torchserve=flags.setup).run()
    finally:
        remove_pid_file()
    return 0


def serve_main(argv: list[str] | None = None) -> int:
    """`serve ...`, the entry of a SageMaker image: `ENTRYPOINT ["serve"]`."""
    return run(serve_settings(argv, os.environ), unused_variables(os.environ))
