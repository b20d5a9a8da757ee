"""Console entries: `modelhost serve ...` and `serve` (a SageMaker image's entry): flags -> ServerSettings -> run.

Flags have no argparse defaults (SUPPRESS), so that only the flags given beat the environment:
default < SAGEMAKER_* variable < explicit flag (settings_sources.resolve_settings).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

from modelhost import __version__
from modelhost.access import API_NAMES, GRPC_HEADER_PREFIX, Restriction, parse_restriction
from modelhost.core.code_policy import USER_CODE_MODES
from modelhost.core.compute_threads import PRIORITIES
from modelhost.sagemaker_triton import default_model_error
from modelhost.settings import TLS_SITES, ServerSettings, SettingsError, check_settings, parse_byte_size
from modelhost.settings_sources import resolve_settings, sagemaker_repository, unused_variables

if TYPE_CHECKING:
    from modelhost.protocols.tfserving.model_server import TfServingFlags
    from modelhost.protocols.torchserve.config_properties import TorchServeConfig

_LOG_LEVELS = ["critical", "error", "warning", "info", "debug"]
# What `serve` changes in a container: listen on every interface (SageMaker connects from outside).
CONTAINER_DEFAULTS = ServerSettings(host="0.0.0.0")


def _byte_size(text: str) -> int:
    try:
        return parse_byte_size(text)
    except SettingsError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _true_or_false(text: str) -> bool:
    """A Triton-style boolean flag's value (`--allow-client-shm=true`)."""
    if text.lower() not in ("true", "1", "false", "0"):
        raise argparse.ArgumentTypeError(f"must be true or false, got '{text}'")
    return text.lower() in ("true", "1")


def _restriction(prefix: str) -> Callable[[str], Restriction]:
    def parse(text: str) -> Restriction:
        try:
            return parse_restriction(text, prefix)
        except ValueError as exc:  # ArgumentTypeError: argparse then does not echo the value, a secret
            raise argparse.ArgumentTypeError(str(exc)) from None

    return parse


def _add_security_flags(parser: argparse.ArgumentParser, d: ServerSettings) -> None:
    """TLS and access control (docs/security.md)."""
    add = parser.add_argument
    add("--tls-cert-file", metavar="PEM", help="server certificate (and chain); with --tls-key-file every port "
        "speaks TLS, reloaded on SIGHUP (default: off, plain HTTP and gRPC)")
    add("--tls-key-file", metavar="PEM", help="the certificate's private key, unencrypted")
    add("--tls-ca-file", metavar="PEM", help="mutual TLS: clients must present a certificate this CA issued")
    add("--tls-off", dest="tls_off", action="append", choices=TLS_SITES,
        help="a port left plain while TLS is on (repeatable), e.g. sagemaker when SageMaker itself calls it")
    add("--tls-handshake-timeout-seconds", type=float,
        help=f"how long a client may take over its TLS handshake (default {d.tls_handshake_timeout_seconds:g})")
    apis = ", ".join(API_NAMES)
    add("--http-restricted-api", dest="http_restricted_apis", action="append", type=_restriction(""),
        metavar="API[,API...]:HEADER=VALUE", help="Triton's: requests to these APIs need header HEADER=VALUE, "
        f"else 401/403 (repeatable; APIs: {apis})")
    add("--grpc-restricted-protocol", dest="grpc_restricted_protocols", action="append",
        type=_restriction(GRPC_HEADER_PREFIX), metavar="API[,API...]:KEY=VALUE",
        help=f"Triton's: gRPC calls to these APIs need metadata {GRPC_HEADER_PREFIX}KEY=VALUE, else "
        "UNAUTHENTICATED/PERMISSION_DENIED (repeatable)")
    add("--token-file", help='JSON {"API[,API...]": "TOKEN", ...}: those APIs need "Authorization: Bearer TOKEN" '
        "over HTTP and gRPC")


def add_serve_flags(parser: argparse.ArgumentParser, defaults: ServerSettings, repository: str) -> None:
    """The flags of `modelhost serve` and `serve`; each sets the ServerSettings field of its name.
    `defaults` and `repository` (the default repository, in words) only fill the help."""
    d = defaults
    add = parser.add_argument
    add("--model-repository", help="model repository directory, or in multi-model mode an s3://bucket/prefix URL "
        f"(default: {repository})")
    add("--host", help=f"address to bind (default {d.host})")
    add("--model-name", dest="default_model_name", help="the name a single model is served under when "
        "--model-repository holds one model (a model file such as model.onnx, or a model directory) rather than a "
        f"repository; a name in its config.pbtxt wins (default {d.default_model_name}, or "
        "SAGEMAKER_TFS_DEFAULT_MODEL_NAME)")
    add("--http-port", type=int, help=f"KServe V2 HTTP port (default {d.http_port})")
    add("--grpc-port", type=int, help=f"KServe V2 / Triton gRPC port; 0: off (default {d.grpc_port})")
    add("--metrics-port", type=int, help=f"Prometheus metrics at /metrics; 0: off (default {d.metrics_port})")
    add("--sagemaker-port", type=int, help=f"SageMaker /ping, /invocations and /models; 0: off "
        f"(default {d.sagemaker_port}, or SAGEMAKER_BIND_TO_PORT)")
    add("--log-level", choices=_LOG_LEVELS, help=f"(default {d.log_level})")
    add("--strict-readiness", action="store_true", help="server ready only when every model loaded (Triton's default)")
    add("--logging-updates", action=argparse.BooleanOptionalAction,
        help="let clients change log settings (POST /v2/logging, gRPC LogSettings; default: off; restrict the "
             "logging API group when on)")
    add("--server-name", help=f"the name V2 server metadata reports (default {d.server_name}; 'triton' for "
        "tools that check they talk to Triton)")
    add("--default-max-batch-size", type=int,
        help=f"max_batch_size given to auto-completed models that can batch (default {d.default_max_batch_size})")
    add("--http-max-body-bytes", type=_byte_size,
        help=f"the largest HTTP request body, e.g. 64MiB (default {d.http_max_body_bytes // 1024**2}MiB)")
    add("--workers", type=int, help="server processes sharing the HTTP port; each loads every model "
        f"(default {d.workers}, or SAGEMAKER_TFS_INSTANCE_COUNT)")
    add("--compute-priority", choices=PRIORITIES, help="CPU priority of model threads below the event loop's: "
        "low (SCHED_IDLE: the loop preempts them at once), nice (nice 10), normal, or auto (low on 2 CPUs "
        "or more; on one, low once a model's executions take milliseconds); see README "
        f"(default {d.compute_priority})")
    add("--lone-request-max-us", type=int, help="a request alone in the server runs on the event loop, without "
        "the two thread wake-ups of a handoff, when its model's executions of its size took at most this long; "
        "a request arriving meanwhile waits for the loop as long; 0: never; see README "
        f"(default {d.lone_request_max_us})")
    add("--graceful-shutdown-seconds", type=float,
        help=f"how long SIGTERM waits for in-flight requests (default {d.graceful_shutdown_seconds})")
    add("--grpc-max-message-bytes", type=_byte_size, help="the largest gRPC message received or sent, e.g. "
        f"64MiB, 1GiB (default {d.grpc_max_message_bytes // 1024**2}MiB)")
    add("--grpc-keepalive-time-seconds", type=float,
        help=f"how often the server pings an idle gRPC connection (default {d.grpc_keepalive_time_seconds:g})")
    add("--grpc-keepalive-timeout-seconds", type=float, help="how long a keepalive ping waits for its answer "
        f"before the connection is closed (default {d.grpc_keepalive_timeout_seconds:g})")
    add("--multi-model", action=argparse.BooleanOptionalAction,
        help="SageMaker multi-model mode: models load and unload through /models (default: SAGEMAKER_MULTI_MODEL)")
    add("--model-cache-bytes", type=_byte_size, help="memory loaded models may take in multi-model mode, "
        "e.g. 512MiB, 2GB, 4GiB (default: half of this machine's or container's memory)")
    add("--max-unpacked-bytes", type=_byte_size,
        help=f"the most one model archive may unpack to (default {d.max_unpacked_bytes // 1024**3}GiB)")
    add("--unpacked-cache-bytes", type=_byte_size, help="model files a multi-model endpoint keeps on disk after "
        "their models leave memory, for reloads (default: a quarter of the free disk where the server works)")
    add("--embedding-cache-bytes", type=_byte_size, help="RAM for embedding tables' cached rows, all tables "
        f"together, e.g. 256MiB, 8GiB (default {d.embedding_cache_bytes // 1024**3}GiB)")
    add("--embedding-io-threads", type=int,
        help=f"threads reading embedding rows from disk at once (default {d.embedding_io_threads})")
    add("--embedding-poll-seconds", type=float, help="how often served embedding tables are checked for a new "
        f"version and for delta files (default {d.embedding_poll_seconds:g}; 0: never)")
    add("--embedding-updates", action=argparse.BooleanOptionalAction,
        help="let clients update embedding rows over HTTP and gRPC (default: off; restrict the model-repository "
             "API group when on)")
    add("--embedding-compact-log-bytes", type=_byte_size, help="compact a table's delta log into a new version "
        f"once it is this large (default {d.embedding_compact_log_bytes // 1024**3}GiB; 0: never)")
    add("--trace-config", dest="trace_config", action="append", metavar="[MODE,]SETTING=VALUE",
        help="Triton's trace settings (repeatable), e.g. triton,file=/var/log/trace.json, level=TIMESTAMPS, "
             "rate=1000, count=-1, triton,log-frequency=100, mode=opentelemetry, opentelemetry,url=URL "
             "(default: no tracing)")
    add("--allow-client-shm", nargs="?", const=True, type=_true_or_false, metavar="true|false",
        help="let clients on this host register system shared memory regions and send inputs and outputs through "
             "them (Triton's extension and flag: also --allow-client-shm=true; default: off; restrict the "
             "shared-memory API group when on)")
    add("--client-shm-max-regions", type=int,
        help=f"shared memory regions registered at once (default {d.client_shm_max_regions})")
    add("--client-shm-max-bytes", type=_byte_size, help="byte sizes of the registered shared memory regions "
        f"together (default {d.client_shm_max_bytes // 1024**3}GiB)")
    add("--embedding-cache-policy", choices=("tinylfu", "clock"),
        help=f"how the embedding cache picks rows to keep (default {d.embedding_cache_policy})")
    add("--max-archive-members", type=int,
        help=f"the most entries one model archive may hold (default {d.max_archive_members})")
    add("--s3-endpoint-url", help="S3 endpoint for s3:// repositories (default: AWS; boto3 also reads "
        "AWS_ENDPOINT_URL itself)")
    add("--model-control-mode", choices=["none", "poll", "explicit"],
        help="none: load every model at start; poll: also apply repository changes every --repository-poll-secs; "
        "explicit: load --load-model models at start, then through the load/unload API "
        f"(default {d.model_control_mode})")
    add("--repository-poll-secs", dest="repository_poll_seconds", type=float,
        help=f"how often poll mode reads the repository (default {d.repository_poll_seconds:g})")
    add("--load-model", dest="load_models", action="append", metavar="NAME",
        help="in explicit mode, a model to load at start (repeatable; '*' loads every model)")
    # model locations and user code (issue 12: code execution from outside the repository)
    add("--allow-model-load-from", dest="allow_model_load_from", action="append", metavar="DIR",
        help="a directory SageMaker's POST /models may load a url from, besides the SageMaker models directory "
        "(<SAGEMAKER_BASE_DIR or /opt/ml>/models) and a local --model-repository (repeatable)")
    add("--user-code", choices=list(USER_CODE_MODES),
        help="which models may run code they bring (Python backend model.py, SageMaker code/inference.py): all; "
        "repository: those from the server's own model locations, not files a load request uploads; none "
        f"(default {d.user_code})")
    add("--gpu-fallback", choices=["none", "cpu"], help="a model whose config.pbtxt asks for KIND_GPU instances on "
        "a host without a usable GPU: none fails its load naming the group; cpu runs it on CPU with a warning "
        f"(default {d.gpu_fallback}; SAGEMAKER_GPU_FALLBACK)")
    add("--invocation-timeout-seconds", type=float, help="how long one SageMaker invocation may take "
        f"(default {d.invocation_timeout_seconds:g}, or SAGEMAKER_MODEL_SERVER_TIMEOUT/SAGEMAKER_TS_RESPONSE_TIMEOUT)")
    add("--handler-threads", type=int, help="threads that run SageMaker inference.py handlers, apart from model "
        "loading (default: min(32, CPUs + 4))")
    # request and log limits (issue 12: codecs)
    add("--json-max-depth", type=int, help="how deeply a tensor's JSON data may nest lists, 1-64 (1-32 with numpy 1) "
        f"(default {d.json_max_depth})")
    add("--max-request-elements", type=int, help="elements one request's input tensors may hold together, "
        f"checked before they are allocated (default {d.max_request_elements})")
    add("--max-output-bytes", type=_byte_size, help="the most data one response's outputs may hold, e.g. 256MiB, "
        f"4GiB (default {d.max_output_bytes // 1024**3}GiB)")
    add("--client-log-lines-per-second", type=float, help="how often warnings caused by client input (bad "
        "requests, undecodable gRPC messages, failed invocations) are logged per kind; the rest are counted "
        f"(default {d.client_log_lines_per_second:g}; 0: none)")
    _add_http_limit_flags(parser, d)
    _add_security_flags(parser, d)


def _add_http_limit_flags(parser: argparse.ArgumentParser, d: ServerSettings) -> None:
    """HTTP edge limits (ServerSettings' docstring says what each bounds)."""
    add = parser.add_argument
    add("--http-max-connections", type=int,
        help=f"open HTTP connections per process; more get 503 (default {d.http_max_connections})")
    add("--http-max-buffered-bytes", type=_byte_size, help="request bytes held across HTTP connections; "
        "connections wait beyond it (default: 1GiB, or 1/8 of memory when less)")
    add("--http-max-head-bytes", type=_byte_size,
        help=f"request line + headers of one request (default {d.http_max_head_bytes // 1024}KiB)")
    add("--http-max-headers", type=int, help=f"header fields of one request (default {d.http_max_headers})")
    add("--http-max-url-bytes", type=_byte_size,
        help=f"request target length (default {d.http_max_url_bytes // 1024}KiB)")
    add("--http-max-pipeline", type=int,
        help=f"pipelined requests read ahead per connection (default {d.http_max_pipeline})")
    add("--http-max-pipeline-bytes", type=_byte_size, help="bytes of pipelined requests read ahead per connection "
        f"(default {d.http_max_pipeline_bytes // 1024**2}MiB)")
    add("--http-idle-timeout-seconds", type=float,
        help=f"close an idle keep-alive connection after this (default {d.http_idle_timeout_seconds:g})")
    add("--http-head-timeout-seconds", type=float,
        help=f"time to send a whole request head; else 408 (default {d.http_head_timeout_seconds:g})")
    add("--http-body-timeout-seconds", type=float, help="window over which a body must keep --http-min-body-rate; "
        f"else 408 (default {d.http_body_timeout_seconds:g})")
    add("--http-min-body-rate", type=_byte_size,
        help=f"bytes/s a request body must keep up (default {d.http_min_body_rate})")
    add("--http-send-timeout-seconds", type=float, help="abort a connection whose response write stays blocked "
        f"this long (default {d.http_send_timeout_seconds:g})")


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
