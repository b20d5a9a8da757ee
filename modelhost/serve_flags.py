"""The flags of `modelhost serve` and of a SageMaker image's `serve`: one argparse flag per ServerSettings field
they set, with no argparse defaults (the parser is built with SUPPRESS), so that only the flags given beat the
environment. Each help text names the field's default in `defaults`.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

from modelhost.access import API_NAMES, GRPC_HEADER_PREFIX, Restriction, parse_restriction
from modelhost.core.code_policy import USER_CODE_MODES
from modelhost.core.compute_threads import PRIORITIES
from modelhost.settings import TLS_SITES, ServerSettings, SettingsError, parse_byte_size

_LOG_LEVELS = ["critical", "error", "warning", "info", "debug"]


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
    add("--model-cache-policy", choices=("lfu", "lru"), help="which idle models leave first when a multi-model "
        f"endpoint needs room: the least used lately, or the least recently used (default {d.model_cache_policy})")
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
    add("--http-header-forward-pattern", metavar="REGEX",
        help="forward HTTP headers whose names match REGEX to the model as request parameters (Triton's flag; "
             "case-insensitive unless REGEX starts with (?-i); default: none)")
    add("--grpc-header-forward-pattern", metavar="REGEX",
        help="forward gRPC metadata whose names match REGEX to the model as request parameters (Triton's flag)")
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
