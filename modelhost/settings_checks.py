"""Checks across a server's settings, whichever flag or environment variable set them: each failure a
SettingsError naming the flag and what it must be."""

from __future__ import annotations

from pathlib import Path

from modelhost.access import AccessPolicy
from modelhost.core.code_policy import USER_CODE_MODES
from modelhost.core.compute_threads import PRIORITIES
from modelhost.core.trace_config import check_trace_config
from modelhost.protocols.header_forwarding import check_pattern
from modelhost.settings import (
    CONTROL_MODES,
    GPU_FALLBACKS,
    GRPC_MAX_MESSAGE_BYTES,
    TLS_SITES,
    ServerSettings,
    SettingsError,
)
from modelhost.types import MAX_RANK

LONE_REQUEST_MAX_US = 1_000_000  # what a request alone may hold the event loop for, at most, whatever is set


def check_settings(settings: ServerSettings) -> None:
    """Checks across settings, whichever flag or variable set them; raises SettingsError."""
    if settings.compute_priority not in PRIORITIES:
        raise SettingsError(f"--compute-priority must be one of {', '.join(PRIORITIES)}, "
                            f"got {settings.compute_priority!r}")
    if settings.workers < 1:
        raise SettingsError(f"--workers must be at least 1, got {settings.workers}")
    if not 0 <= settings.lone_request_max_us <= LONE_REQUEST_MAX_US:
        raise SettingsError(f"--lone-request-max-us must be 0-{LONE_REQUEST_MAX_US}, "
                            f"got {settings.lone_request_max_us}")
    if settings.workers > 1 and settings.multi_model:
        raise SettingsError(
            f"--workers/SAGEMAKER_TFS_INSTANCE_COUNT {settings.workers} cannot be combined with multi-model mode "
            "(--multi-model/SAGEMAKER_MULTI_MODEL=true): each process would hold its own model cache and the "
            "management API (/models) could reach only one of them"
        )
    for name in ("http_port", "grpc_port", "metrics_port", "sagemaker_port"):
        port = getattr(settings, name)
        if not 0 <= port <= 65535:
            raise SettingsError(f"--{name.replace('_', '-')} must be a port 0-65535, got {port}")
    for name in ("model_cache_bytes", "max_unpacked_bytes", "max_archive_members", "invocation_timeout_seconds",
                 "embedding_io_threads",
                 "http_max_body_bytes", "grpc_max_message_bytes", "grpc_keepalive_time_seconds",
                 "grpc_keepalive_timeout_seconds"):
        if getattr(settings, name) <= 0:
            raise SettingsError(f"--{name.replace('_', '-')} must be positive, got {getattr(settings, name)}")
    if settings.unpacked_cache_bytes < 0:
        raise SettingsError("--unpacked-cache-bytes must be 0 (automatic) or more, "
                            f"got {settings.unpacked_cache_bytes}")
    try:
        check_trace_config(settings.trace_config)
        check_pattern("--http-header-forward-pattern", settings.http_header_forward_pattern)
        check_pattern("--grpc-header-forward-pattern", settings.grpc_header_forward_pattern)
    except ValueError as exc:
        raise SettingsError(str(exc)) from None
    if settings.handler_threads < 0:
        raise SettingsError(f"--handler-threads must be 0 (automatic) or more, got {settings.handler_threads}")
    if settings.embedding_cache_bytes < 0:
        raise SettingsError("--embedding-cache-bytes must be 0 (no cache) or more, "
                            f"got {settings.embedding_cache_bytes}")
    if settings.embedding_poll_seconds < 0:
        raise SettingsError("--embedding-poll-seconds must be 0 (never) or more, "
                            f"got {settings.embedding_poll_seconds}")
    if settings.embedding_compact_log_bytes != 0 and settings.embedding_compact_log_bytes < 1 << 20:
        raise SettingsError("--embedding-compact-log-bytes must be 0 (never) or at least 1MiB, "
                            f"got {settings.embedding_compact_log_bytes}")
    if settings.model_cache_policy not in ("lfu", "lru"):
        raise SettingsError(f"--model-cache-policy must be lfu or lru, got '{settings.model_cache_policy}'")
    if settings.embedding_cache_policy not in ("tinylfu", "clock"):
        raise SettingsError(f"--embedding-cache-policy must be tinylfu or clock, got "
                            f"'{settings.embedding_cache_policy}'")
    if settings.model_control_mode not in CONTROL_MODES:
        raise SettingsError(f"--model-control-mode must be one of {', '.join(CONTROL_MODES)}, "
                            f"got '{settings.model_control_mode}'")
    if settings.load_models and settings.model_control_mode != "explicit":
        raise SettingsError(f"--load-model needs --model-control-mode explicit (the mode is "
                            f"'{settings.model_control_mode}', which loads every model)")
    if settings.allow_client_shm and settings.workers > 1:
        raise SettingsError(f"--allow-client-shm cannot be combined with --workers {settings.workers}: each process "
                            "would hold its own shared memory regions, so a region registered with one would be "
                            "unknown to the others")
    if settings.client_shm_max_regions < 1 or settings.client_shm_max_bytes < 1:
        raise SettingsError("--client-shm-max-regions and --client-shm-max-bytes must be positive")
    if settings.model_control_mode == "poll" and settings.repository_poll_seconds <= 0:
        raise SettingsError(f"--repository-poll-secs must be positive, got {settings.repository_poll_seconds:g}")
    if settings.model_control_mode == "poll" and settings.multi_model:
        raise SettingsError("--model-control-mode poll cannot be combined with multi-model mode, whose models load "
                            "on first use and are evicted within --model-cache-bytes; use explicit (the repository "
                            "API loads and unloads through the cache) or none")
    # request and log limits (issue 12: codecs)
    if not settings.server_name:
        raise SettingsError("--server-name must not be empty")
    if not 1 <= settings.json_max_depth <= MAX_RANK:
        raise SettingsError(f"--json-max-depth must be between 1 and {MAX_RANK}, got {settings.json_max_depth}")
    for name in ("max_request_elements", "max_output_bytes"):
        if getattr(settings, name) <= 0:
            raise SettingsError(f"--{name.replace('_', '-')} must be positive, got {getattr(settings, name)}")
    if not 0 <= settings.client_log_lines_per_second < float("inf"):
        raise SettingsError(f"--client-log-lines-per-second must be a number >= 0, "
                            f"got {settings.client_log_lines_per_second}")
    if settings.gpu_fallback not in GPU_FALLBACKS:
        raise SettingsError(f"--gpu-fallback/SAGEMAKER_GPU_FALLBACK must be one of {', '.join(GPU_FALLBACKS)}, "
                            f"got '{settings.gpu_fallback}'")
    if settings.user_code not in USER_CODE_MODES:
        raise SettingsError(f"--user-code must be one of {', '.join(USER_CODE_MODES)}, got '{settings.user_code}'")
    for directory in settings.allow_model_load_from:
        if not Path(directory).is_absolute():
            raise SettingsError(f"--allow-model-load-from must be an absolute directory, got '{directory}'")
    _check_http_limits(settings)
    if settings.grpc_max_message_bytes > GRPC_MAX_MESSAGE_BYTES:
        raise SettingsError(f"--grpc-max-message-bytes must be at most {GRPC_MAX_MESSAGE_BYTES} (gRPC's limit), "
                            f"got {settings.grpc_max_message_bytes}")
    _check_security(settings)


def _check_security(settings: ServerSettings) -> None:
    """TLS and access control settings."""
    if (settings.tls_cert_file is None) != (settings.tls_key_file is None):
        raise SettingsError("--tls-cert-file and --tls-key-file go together: give both, or neither for plain HTTP")
    if settings.tls_ca_file is not None and settings.tls_cert_file is None:
        raise SettingsError("--tls-ca-file (mutual TLS) needs --tls-cert-file and --tls-key-file")
    for site in settings.tls_off:
        if site not in TLS_SITES:
            raise SettingsError(f"--tls-off must name one of {', '.join(TLS_SITES)}, got '{site}'")
    if settings.tls_handshake_timeout_seconds <= 0:
        raise SettingsError(f"--tls-handshake-timeout-seconds must be positive, "
                            f"got {settings.tls_handshake_timeout_seconds:g}")
    for flag, restrictions in (("--http-restricted-api", settings.http_restricted_apis),
                               ("--grpc-restricted-protocol", settings.grpc_restricted_protocols)):
        try:
            AccessPolicy(restrictions + settings.token_restrictions)
        except ValueError as exc:
            raise SettingsError(f"{flag}/--token-file: {exc}") from None


_HTTP_POSITIVE = ("http_max_connections", "http_max_buffered_bytes", "http_max_head_bytes", "http_max_headers",
                  "http_max_url_bytes", "http_max_pipeline", "http_max_pipeline_bytes", "http_idle_timeout_seconds",
                  "http_head_timeout_seconds", "http_body_timeout_seconds", "http_send_timeout_seconds")


def _check_http_limits(settings: ServerSettings) -> None:
    for name in _HTTP_POSITIVE:
        if getattr(settings, name) <= 0:
            raise SettingsError(f"--{name.replace('_', '-')} must be positive, got {getattr(settings, name)}")
    if settings.http_min_body_rate < 0:
        raise SettingsError(f"--http-min-body-rate must be 0 or more, got {settings.http_min_body_rate}")
    if settings.http_max_buffered_bytes < settings.http_max_body_bytes:
        raise SettingsError(f"--http-max-buffered-bytes ({settings.http_max_buffered_bytes}) must be at least "
                            f"--http-max-body-bytes ({settings.http_max_body_bytes}): a body of the limit must fit")
