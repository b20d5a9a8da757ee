"""ServerSettings: every knob of a server, read once from flags and the environment.

The defaults here read os.environ only for where caches go; the SAGEMAKER_* variables and the command line's
flags are applied over them by settings_sources.resolve_settings.
"""

from __future__ import annotations

import os
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from modelhost.access import Restriction, parse_token_file
from modelhost.config.overrides import ModelOverrides
from modelhost.core.compute_threads import Priority
from modelhost.cpus import available_cpus
from modelhost.digits import is_digits
from modelhost.types import MAX_RANK, RequestLimits

GIB = 1024**3
GRPC_MAX_MESSAGE_BYTES = 2**31 - 1  # gRPC's message length options are 32-bit signed
_UNITS = {"": 1, "b": 1, "kb": 1000, "mb": 1000**2, "gb": 1000**3, "tb": 1000**4,
          "kib": 1024, "mib": 1024**2, "gib": GIB, "tib": 1024**4}
_BYTE_SIZE = re.compile(r"\s*(\d+(?:\.\d*)?)\s*([a-zA-Z]*)\s*")
_CGROUP_LIMITS = ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes")


class SettingsError(ValueError):
    """A flag or environment variable has an invalid value; the message names it and the value."""


def _default_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(os.environ.get("MODELHOST_CACHE_DIR") or Path(base) / "modelhost")


def memory_bytes() -> int:
    """The memory this process may use: physical memory (os.sysconf), or the cgroup limit when lower."""
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # not POSIX: assume a small machine
        total = 4 * GIB
    for path in _CGROUP_LIMITS:  # a container's limit ("max" or a huge number when there is none)
        try:
            text = Path(path).read_text().strip()
        except OSError:
            continue
        if is_digits(text) and 0 < int(text) < total:
            total = int(text)
    return total


def _default_model_cache_bytes() -> int:
    return memory_bytes() // 2


def _default_http_buffered_bytes() -> int:
    # 1 GiB, or an eighth of memory on a smaller machine (the default model cache takes half), but never
    # below the default body limit, so that a default-sized body can always be received.
    return min(GIB, max(memory_bytes() // 8, 64 * 1024**2))


def parse_byte_size(text: str) -> int:
    """Bytes from `123`, `512MiB`, `2GB`, `4GiB` (KB/MB/GB/TB are powers of 1000, KiB/MiB/GiB/TiB of 1024)."""
    match = _BYTE_SIZE.fullmatch(text)
    unit = match.group(2).lower() if match else ""
    if match is None or unit not in _UNITS:
        raise SettingsError(f"'{text}' is not a size in bytes (e.g. 123, 512MiB, 2GB, 4GiB)")
    return int(float(match.group(1)) * _UNITS[unit])


CONTROL_MODES = ("none", "poll", "explicit")
GPU_FALLBACKS = ("none", "cpu")
TLS_SITES = ("http", "grpc", "sagemaker", "metrics")


@dataclass(frozen=True, slots=True)
class ServerSettings:
    """Every server knob. `model_repository` None serves the built-in example repository (under `cache_dir`).

    model_repository: a local directory, or in multi-model mode also an `s3://bucket/prefix` URL.
    sagemaker_port: the SageMaker site (/ping, /invocations, /models); 0 turns it off.
    model_cache_bytes: memory the loaded models may take in multi-model mode; by default half of
    `memory_bytes()` (physical memory from os.sysconf, or the container's cgroup limit when lower).
    model_cache_policy: which idle models leave first when a multi-model endpoint needs room: `lfu` (the least
    used lately, core/eviction_policy.py: 28 % fewer misses than `lru` under Zipf traffic, simulated and
    measured) or `lru`.
    max_unpacked_bytes: the most one model archive may unpack to.
    unpacked_cache_bytes: model files a multi-model endpoint keeps on disk once their models leave memory, so that
    reloading an unchanged archive skips its download and unpacking; 0: a quarter of the disk space free where
    the server's work directory is, at start.
    embedding_cache_bytes: RAM for the embedding tables' cached rows, all tables together (1 GiB); 0: none.
    embedding_io_threads: threads reading embedding rows from disk at once (16: an SSD answers many reads at a
    time; each waits with the GIL released).
    embedding_cache_policy: `tinylfu` (CLOCK replacement with a frequency filter on admission: 9 % fewer disk
    reads than CLOCK alone under Zipf 1.0 traffic, benchmarks/embedding_cache_policy.py) or `clock`.
    embedding_poll_seconds: how often served tables are checked for a new current version and for delta files
    in their `deltas/` directory (2 s); 0: never.
    embedding_updates: whether clients may update embedding rows over HTTP and gRPC (off: a client that can write
    rows can change every answer; delta files and new versions, the operator's files, are taken either way).
    embedding_compact_log_bytes: a table's delta log this large is compacted into a new version of the table, off
    the serving path (1 GiB); 0: never; else at least 1 MiB (each compaction rewrites the whole table).
    trace_config: Triton's `--trace-config [MODE,]SETTING=VALUE` entries (docs/tracing.md): tracing is off unless
    they give it somewhere to go (a file, or an OpenTelemetry receiver); clients change only how much is traced.
    http_header_forward_pattern, grpc_header_forward_pattern: Triton's flags: request headers (gRPC metadata) whose
    names match the regular expression become the inference request's string parameters, for the model (empty:
    none; case-insensitive unless the pattern starts with `(?-i)`).
    allow_client_shm: whether clients may register system shared memory regions and send inputs and receive
    outputs through them (Triton's --allow-client-shm; off: a client that can register a region can read and write
    any /dev/shm object the server's user can open). client_shm_max_regions and client_shm_max_bytes bound the
    regions registered at once and their byte sizes together (64 and 16 GiB: mapped, not copied; the memory is
    the client's shared memory object, the server's cost is address space and page tables).
    max_archive_members: the most entries (files, directories, links) one model archive may hold (10,000: a
    model with its code and variable shards has tens to hundreds; each entry costs a file and inode to unpack).
    invocation_timeout_seconds: how long one SageMaker invocation may take.
    handler_threads: threads for SageMaker inference.py handlers, apart from model loading; 0: min(32, CPUs + 4).
    default_accept: the Accept used when a SageMaker request sends none or `*/*`.
    sagemaker_program: the handler module in a model's code/ directory.
    default_model_name: the name a single model (not a repository) is served under.
    logging_updates: whether clients may change log settings (Triton's logging extension, POST /v2/logging,
    gRPC LogSettings; off: a client could hide its errors from the log or make every line a debug line).
    server_name: the `name` of V2 server metadata ("modelhost"; "triton" for tools that check they talk to Triton).
    grpc_port: the KServe V2 / Triton gRPC front-end; 0 turns it off.
    grpc_max_message_bytes: the largest gRPC message received or sent (tritonclient allows 2^31-1).
    grpc_keepalive_time_seconds, grpc_keepalive_timeout_seconds: how often the server pings an idle
    gRPC connection, and how long it waits for the answer before closing it (gRPC's defaults).
    model_control_mode: Triton's: "none" loads every model at start; "poll" also applies repository
    changes every `repository_poll_seconds`; "explicit" loads `load_models` at start ("*": all) and
    then what the load/unload API asks for.

    Request and log limits (what one client can make the server spend; each default is far above what
    legitimate traffic needs, so that only abuse meets it):
    json_max_depth: how deeply a tensor's JSON data may nest lists (64, numpy's limit on dimensions; 32 with
    numpy 1). Models take tensors of rank 1-6, but Triton takes data nested to 100 lists whatever the shape (its
    QA sends 50), and numpy's limit bounds the work a nesting costs as well.
    max_request_elements: elements of one request's input tensors together, checked from the declared
    shapes before anything is allocated (64 Mi = 67,108,864: every element of a 64 MiB body of UINT8, the
    default body limit's worth; a 500 x 1000 FP32 batch is 500,000). What it stops is a small request
    declaring a huge tensor (a .npy header or a TensorProto whose one value fills its shape).
    max_output_bytes: the data of one response's outputs together (1 GiB: 16 times a 64 MB output, which
    some models produce; JSON text of it would be several times more), checked before they are encoded.
    client_log_lines_per_second: warnings and errors that client input causes (bad requests, undecodable
    gRPC messages, failed invocations) are logged at most this often per kind of message, with bursts of
    up to 10; the rest are counted and reported as "suppressed N similar messages" (1.0: a flood of bad
    requests costs a few lines a second, not one per request; 0 logs none of them).
    Model locations and user code (docs/model_management.md "Names and paths", docs/sagemaker.md):
    allow_model_load_from: directories (besides `sagemaker_models_dir` and a local `model_repository`)
    that SageMaker's `POST /models` may load a `url` from; a url outside all of them is refused (400).
    sagemaker_models_dir: where SageMaker places multi-model endpoints' models,
    <SAGEMAKER_BASE_DIR or /opt/ml>/models; only the environment sets it.
    user_code: which models may run code they bring (Python backend model.py, SageMaker code/):
    "all"; "repository" (default: those from the operator's own locations, not files a load request
    uploads); "none".
    gpu_fallback: what a model whose config asks for KIND_GPU instances does where no GPU is usable: "none"
    (default: it fails to load, naming the group) or "cpu" (it runs on CPU, with a warning at load;
    core/devices.py). SAGEMAKER_GPU_FALLBACK sets it too.
    HTTP edge limits (every HTTP port of one process; a client that hits one gets a JSON error naming its flag):
    http_max_connections: open connections; one over it gets 503 + Retry-After to its first request.
    http_max_buffered_bytes: request bytes (bodies, unfinished heads) held across connections until answered;
    by default 1 GiB, or an eighth of `memory_bytes()` when less (at least 64 MiB). A connection that cannot
    get budget is not read (TCP holds the client back) and gets 503 after http_body_timeout_seconds.
    http_max_head_bytes: request line and headers of one request (431). http_max_headers: header fields (431).
    http_max_url_bytes: the request target (414).
    http_max_pipeline, http_max_pipeline_bytes: a connection is not read while this many requests, or bytes,
    wait behind the one being answered.
    http_idle_timeout_seconds: a keep-alive connection with no request open closes after this.
    http_head_timeout_seconds: a request head must be complete this long after its first byte (a new
    connection's: after the accept); else 408 (nginx's client_header_timeout).
    http_body_timeout_seconds, http_min_body_rate: a body must gain http_min_body_rate bytes/s over each
    window of http_body_timeout_seconds (at least a byte); else 408 (nginx's client_body_timeout).
    http_send_timeout_seconds: a response write that stays blocked (the client does not read) this long, or a
    close that cannot flush, aborts the connection (nginx's send_timeout).
    TLS and access control (docs/security.md):
    tls_cert_file, tls_key_file: PEM certificate (chain) and unencrypted key; set, every port speaks TLS
    (but those named in `tls_off`); reloaded on SIGHUP. None (the default): plain HTTP and gRPC.
    tls_ca_file: PEM CA; set, clients must present a certificate it issued (mutual TLS).
    tls_off: sites left plain when TLS is on, of TLS_SITES (e.g. "sagemaker": SageMaker calls it over HTTP).
    tls_handshake_timeout_seconds: how long a client may take over its TLS handshake.
    http_restricted_apis, grpc_restricted_protocols: Triton's --http-restricted-api and
    --grpc-restricted-protocol, parsed (gRPC headers carry the `triton-grpc-protocol-` prefix).
    token_file: a JSON file of API groups -> bearer tokens, read by `settings_sources.resolve_settings` into
    `token_restrictions` (HTTP and gRPC both). Nothing is restricted by default.
    """

    model_repository: str | None = None
    host: str = "127.0.0.1"
    http_port: int = 8000
    grpc_port: int = 8001
    metrics_port: int = 8002
    log_level: str = "info"
    server_name: str = "modelhost"
    logging_updates: bool = False
    strict_readiness: bool = False
    default_max_batch_size: int = 4
    http_max_body_bytes: int = 64 * 1024 * 1024
    graceful_shutdown_seconds: float = 30.0
    grpc_max_message_bytes: int = 256 * 1024 * 1024
    grpc_keepalive_time_seconds: float = 7200.0
    grpc_keepalive_timeout_seconds: float = 20.0
    cpu_count: int = field(default_factory=available_cpus)  # model threads are sized to these
    workers: int = 1
    compute_priority: Priority = "auto"  # of model threads, below the event loop's (core/compute_threads.py)
    # A request alone in the server may run on the event loop for up to this long (core/loop_gate.py); 0: never.
    lone_request_max_us: int = 5_000
    worker_index: int = 0  # set for each process of --workers
    workers_dir: str | None = None  # set for each process of --workers: their statistics sockets' directory
    cache_dir: Path = _default_cache_dir()
    sagemaker_port: int = 8080
    multi_model: bool = False
    # A Ray Serve replica's (`modelhost ray`): a local repository's models load when a request first names one,
    # within model_cache_bytes, as a multi-model endpoint's archives do. No flag sets it.
    models_on_demand: bool = False
    model_cache_bytes: int = field(default_factory=_default_model_cache_bytes)
    model_cache_policy: str = "lfu"
    max_unpacked_bytes: int = 16 * GIB
    unpacked_cache_bytes: int = 0
    max_archive_members: int = 10_000
    embedding_cache_bytes: int = GIB
    embedding_io_threads: int = 16
    embedding_cache_policy: str = "tinylfu"
    embedding_poll_seconds: float = 2.0
    embedding_updates: bool = False
    embedding_compact_log_bytes: int = GIB
    trace_config: tuple[str, ...] = ()
    http_header_forward_pattern: str = ""
    grpc_header_forward_pattern: str = ""
    allow_client_shm: bool = False
    client_shm_max_regions: int = 64
    client_shm_max_bytes: int = 16 * GIB
    s3_endpoint_url: str | None = None
    invocation_timeout_seconds: float = 60.0
    handler_threads: int = 0
    default_accept: str = "application/json"
    sagemaker_program: str = "inference.py"
    default_model_name: str = "model"
    model_overrides: ModelOverrides = ModelOverrides()
    model_control_mode: str = "none"
    repository_poll_seconds: float = 15.0
    load_models: tuple[str, ...] = ()
    # --- TLS and access control (issue 12)
    tls_cert_file: str | None = None
    tls_key_file: str | None = None
    tls_ca_file: str | None = None
    tls_off: tuple[str, ...] = ()
    tls_handshake_timeout_seconds: float = 10.0
    http_restricted_apis: tuple[Restriction, ...] = ()
    grpc_restricted_protocols: tuple[Restriction, ...] = ()
    token_file: str | None = None
    token_restrictions: tuple[Restriction, ...] = ()
    # HTTP edge limits
    http_max_connections: int = 10_000
    http_max_buffered_bytes: int = field(default_factory=_default_http_buffered_bytes)
    http_max_head_bytes: int = 64 * 1024
    http_max_headers: int = 100
    http_max_url_bytes: int = 8 * 1024
    http_max_pipeline: int = 16
    http_max_pipeline_bytes: int = 1024**2
    http_idle_timeout_seconds: float = 75.0
    http_head_timeout_seconds: float = 30.0
    http_body_timeout_seconds: float = 30.0
    http_min_body_rate: int = 1024
    http_send_timeout_seconds: float = 60.0
    # model locations and user code (issue 12: code execution from outside the repository)
    allow_model_load_from: tuple[str, ...] = ()
    sagemaker_models_dir: str = "/opt/ml/models"
    user_code: str = "repository"
    gpu_fallback: str = "none"
    # request and log limits (issue 12: codecs)
    json_max_depth: int = MAX_RANK
    max_request_elements: int = 64 * 1024**2
    max_output_bytes: int = GIB
    client_log_lines_per_second: float = 1.0


def request_limits(settings: ServerSettings) -> RequestLimits:
    """The limits the codecs and the data plane check each request against."""
    return RequestLimits(settings.max_request_elements, settings.json_max_depth, settings.max_output_bytes)


def handler_threads(settings: ServerSettings) -> int:
    """The size of the SageMaker handler pool: as set, or what Python gives its default executor."""
    return settings.handler_threads or min(32, settings.cpu_count + 4)


def unpacked_cache_bytes(settings: ServerSettings, work_dir: Path) -> int:
    """The disk kept for unpacked archives: as set, or a quarter of what is free at `work_dir` now."""
    return settings.unpacked_cache_bytes or shutil.disk_usage(work_dir).free // 4


def read_token_file(path: str) -> tuple[Restriction, ...]:
    """The restrictions of a --token-file; SettingsError naming the file (never a token) when it is unusable."""
    try:
        return parse_token_file(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise SettingsError(f"--token-file {path}: {exc.strerror}") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise SettingsError(f"--token-file {path}: {exc}") from None


def model_load_roots(settings: ServerSettings) -> tuple[Path, ...]:
    """Where SageMaker's `POST /models` may load from: the SageMaker models directory, the model repository
    when it is a local directory, and every --allow-model-load-from directory."""
    roots = [Path(settings.sagemaker_models_dir)]
    if settings.model_repository is not None and "://" not in settings.model_repository:
        roots.append(Path(settings.model_repository))
    return tuple(roots) + tuple(Path(directory) for directory in settings.allow_model_load_from)
