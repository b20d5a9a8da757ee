"""Where a server's settings come from besides their defaults: the container variables of SageMaker's images
(SAGEMAKER_*, and the Triton container's through sagemaker_triton) and the command line's flags.

Precedence: an explicit flag beats an environment variable, which beats the default (`resolve_settings`). Reads
only the mapping it is given, and the paths it names (the token file; whether SageMaker's model directory
exists). The SAGEMAKER_* variables and what they set are listed in docs/sagemaker.md ("Configuration by
environment").
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any, TypeVar

from modelhost.config.overrides import ModelOverrides
from modelhost.sagemaker_triton import triton_values, triton_warnings
from modelhost.settings import ServerSettings, SettingsError, read_token_file
from modelhost.settings_checks import check_settings


def settings_from_environment(base: ServerSettings, environ: Mapping[str, str]) -> ServerSettings:
    """`base` with what the SAGEMAKER_* variables in `environ` set; pure (reads only `environ`).

    Raises SettingsError naming the variable and its value when one is invalid or two disagree.
    An empty variable counts as unset. Model overrides merge over `base.model_overrides`.
    """
    variables = _Variables(environ)
    values = _server_values(variables)
    values.update(_with_triton(variables, values))
    overrides = _model_overrides(variables).merged_over(base.model_overrides)
    return replace(base, **values, model_overrides=overrides)


def resolve_settings(base: ServerSettings, environ: Mapping[str, str], flags: Mapping[str, Any]) -> ServerSettings:
    """Defaults (`base`) < environment < explicit flags (field name -> value), checked as a whole."""
    settings = replace(settings_from_environment(base, environ), **flags)
    if settings.token_file is not None:
        settings = replace(settings, token_restrictions=read_token_file(settings.token_file))
    check_settings(settings)
    return settings


def sagemaker_repository(environ: Mapping[str, str], multi_model: bool) -> str | None:
    """Where SageMaker puts models, if that directory exists: <SAGEMAKER_BASE_DIR or /opt/ml>/model,
    or .../models in multi-model mode (SageMaker unpacks each model to /opt/ml/models/<name>/model)."""
    base = Path(environ.get("SAGEMAKER_BASE_DIR") or "/opt/ml")
    path = base / ("models" if multi_model else "model")
    return str(path) if path.is_dir() else None


# TF Serving's batching defaults (used when SAGEMAKER_TFS_ENABLE_BATCHING=true leaves them out),
# and TorchServe's max_batch_delay (when SAGEMAKER_TS_BATCH_SIZE alone turns batching on).
TFS_DEFAULT_MAX_BATCH_SIZE = 8
TFS_DEFAULT_BATCH_TIMEOUT_MICROS = 1000
TS_DEFAULT_MAX_BATCH_DELAY_MICROS = 100_000
_TRUE, _FALSE = ("true", "1"), ("false", "0")
T = TypeVar("T")


class _Variables:
    """Typed reads of `environ`; an empty variable is unset, a bad one a SettingsError naming it."""

    def __init__(self, environ: Mapping[str, str]) -> None:
        self._environ = environ

    def text(self, name: str) -> str | None:
        value = self._environ.get(name, "").strip()
        return value or None

    def show(self, name: str) -> str:
        return f"{name}={self._environ.get(name, '')!r}"

    def integer(self, name: str, minimum: int = 0, maximum: int | None = None) -> int | None:
        text = self.text(name)
        if text is None:
            return None
        bounds = f"between {minimum} and {maximum}" if maximum is not None else f">= {minimum}"
        try:
            value = int(text)
        except ValueError:
            raise SettingsError(f"{self.show(name)} must be an integer {bounds}") from None
        if value < minimum or (maximum is not None and value > maximum):
            raise SettingsError(f"{self.show(name)} must be an integer {bounds}")
        return value

    def seconds(self, name: str) -> float | None:
        text = self.text(name)
        if text is None:
            return None
        try:
            value = float(text)
        except ValueError:
            value = -1.0
        if not 0 < value < float("inf"):
            raise SettingsError(f"{self.show(name)} must be a positive number of seconds")
        return value

    def boolean(self, name: str) -> bool | None:
        text = self.text(name)
        if text is None:
            return None
        if text.lower() not in _TRUE + _FALSE:
            raise SettingsError(f"{self.show(name)} must be true or false")
        return text.lower() in _TRUE


def _choose(knob: str, *tiers: list[tuple[str, T | None]]) -> T | None:
    """The value of one knob from tiers of (shown variables, value), most specific tier first.

    The first tier that sets the knob wins; two variables of that tier that disagree are an error.
    """
    for tier in tiers:
        given = [(shown, value) for shown, value in tier if value is not None]
        if len({value for _, value in given}) > 1:
            names = " and ".join(shown for shown, _ in given)
            raise SettingsError(f"{names} set {knob} to different values; set only one of them")
        if given:
            return given[0][1]
    return None


def _server_values(env: _Variables) -> dict[str, Any]:
    values: dict[str, Any] = {
        "sagemaker_port": env.integer("SAGEMAKER_BIND_TO_PORT", 1, 65535),
        "multi_model": env.boolean("SAGEMAKER_MULTI_MODEL"),
        "workers": env.integer("SAGEMAKER_TFS_INSTANCE_COUNT", 1),
        "invocation_timeout_seconds": _choose(
            "the invocation timeout",
            [(env.show("SAGEMAKER_TS_RESPONSE_TIMEOUT"), env.seconds("SAGEMAKER_TS_RESPONSE_TIMEOUT"))],
            [(env.show(name), env.seconds(name))
             for name in ("SAGEMAKER_MODEL_SERVER_TIMEOUT", "SAGEMAKER_MODEL_SERVER_TIMEOUT_SECONDS",
                          "SAGEMAKER_GUNICORN_TIMEOUT_SECONDS")],
        ),
        "handler_threads": _gunicorn_threads(env),
        # The TF Serving container serves gRPC on the first port of the range; inference.py reaches it there.
        "grpc_port": _safe_port_range(env),
        "default_accept": env.text("SAGEMAKER_DEFAULT_INVOCATIONS_ACCEPT"),
        "sagemaker_program": env.text("SAGEMAKER_PROGRAM"),
        "gpu_fallback": env.text("SAGEMAKER_GPU_FALLBACK"),
        "default_model_name": env.text("SAGEMAKER_TFS_DEFAULT_MODEL_NAME"),
        "sagemaker_models_dir": str(Path(env.text("SAGEMAKER_BASE_DIR") or "/opt/ml") / "models"),
    }
    accept = values["default_accept"]
    if isinstance(accept, str) and "/" not in accept:
        raise SettingsError(f"{env.show('SAGEMAKER_DEFAULT_INVOCATIONS_ACCEPT')} must be a media type like "
                            "application/json")
    return {name: value for name, value in values.items() if value is not None}


def _with_triton(env: _Variables, values: dict[str, Any]) -> dict[str, Any]:
    """The SageMaker Triton container's settings (sagemaker_triton), over the others'; its port variables beat the
    port SAGEMAKER_SAFE_PORT_RANGE implies, and two default model names that disagree are an error."""
    triton = triton_values(env)
    _choose("default_model_name",
            [(env.show("SAGEMAKER_TFS_DEFAULT_MODEL_NAME"), values.get("default_model_name")),
             (env.show("SAGEMAKER_TRITON_DEFAULT_MODEL_NAME"), triton.get("default_model_name"))])
    return triton


def _gunicorn_threads(env: _Variables) -> int | None:
    """The TF Serving container's Python service runs SAGEMAKER_GUNICORN_WORKERS x _THREADS handlers at once
    (1 x 1 by default); modelhost's handler pool runs as many."""
    workers = env.integer("SAGEMAKER_GUNICORN_WORKERS", 1)
    threads = env.integer("SAGEMAKER_GUNICORN_THREADS", 1)
    if workers is None and threads is None:
        return None
    return (workers or 1) * (threads or 1)


def _safe_port_range(env: _Variables) -> int | None:
    text = env.text("SAGEMAKER_SAFE_PORT_RANGE")
    if text is None:
        return None
    low, _, high = text.partition("-")
    try:
        first, last = int(low), int(high)
    except ValueError:
        first, last = 0, -1
    if not 1 <= first <= last <= 65535:
        raise SettingsError(f"{env.show('SAGEMAKER_SAFE_PORT_RANGE')} must be a port range like 20000-20999")
    return first


# Container variables modelhost has no use for: each is named in the log at start, never silently ignored.
UNUSED_VARIABLES = {
    "SAGEMAKER_GUNICORN_WORKER_CLASS": "inference.py handlers run in modelhost's handler pool, not in gunicorn "
                                       "workers (SAGEMAKER_GUNICORN_WORKERS x _THREADS sizes it)",
    "SAGEMAKER_TFS_FRACTIONAL_GPU_MEM_MARGIN": "modelhost runs models on CPU",
    "SAGEMAKER_TFS_NGINX_LOGLEVEL": "modelhost has no nginx in front; --log-level sets its log",
    "SAGEMAKER_NGINX_PROXY_READ_TIMEOUT_SECONDS": "modelhost has no nginx in front; the invocation timeout is "
                                                 "SAGEMAKER_MODEL_SERVER_TIMEOUT",
}


def unused_variables(environ: Mapping[str, str]) -> list[str]:
    """One line for each set container variable that modelhost does not use, saying why."""
    return [f"{name} is set but not used: {why}" for name, why in UNUSED_VARIABLES.items()
            if environ.get(name, "").strip()] + triton_warnings(environ)


def _model_overrides(env: _Variables) -> ModelOverrides:
    """See ModelOverrides for the table. Server-specific variables (TFS_, TS_) beat the generic
    SAGEMAKER_MODEL_SERVER_*; two server-specific ones that disagree are an error."""
    tfs_batching = env.boolean("SAGEMAKER_TFS_ENABLE_BATCHING")
    ts_batch_size = env.integer("SAGEMAKER_TS_BATCH_SIZE", 1)
    ts_batches = ts_batch_size if ts_batch_size is not None and ts_batch_size > 1 else None  # 1 = no batching
    ts_delay = env.integer("SAGEMAKER_TS_MAX_BATCH_DELAY")
    ts_batching: bool | None = True if ts_batches else None
    batching = _choose("dynamic_batching", [(env.show("SAGEMAKER_TFS_ENABLE_BATCHING"), tfs_batching),
                                            (env.show("SAGEMAKER_TS_BATCH_SIZE"), ts_batching)])
    max_batch_size = _choose("max_batch_size", [
        (env.show("SAGEMAKER_TFS_MAX_BATCH_SIZE"), env.integer("SAGEMAKER_TFS_MAX_BATCH_SIZE", 1)),
        (env.show("SAGEMAKER_TS_BATCH_SIZE"), ts_batches),
    ])
    delay = _choose("max_queue_delay_microseconds", [
        (env.show("SAGEMAKER_TFS_BATCH_TIMEOUT_MICROS"), env.integer("SAGEMAKER_TFS_BATCH_TIMEOUT_MICROS")),
        (env.show("SAGEMAKER_TS_MAX_BATCH_DELAY"), None if ts_delay is None else ts_delay * 1000),
    ])
    if batching and max_batch_size is None:
        max_batch_size = TFS_DEFAULT_MAX_BATCH_SIZE
    if batching and delay is None:
        delay = TFS_DEFAULT_BATCH_TIMEOUT_MICROS if tfs_batching else TS_DEFAULT_MAX_BATCH_DELAY_MICROS
    enqueued = env.integer("SAGEMAKER_TFS_MAX_ENQUEUED_BATCHES", 1)
    queue_size = None if enqueued is None else enqueued * (max_batch_size or TFS_DEFAULT_MAX_BATCH_SIZE)
    return ModelOverrides(
        dynamic_batching=batching,
        max_batch_size=max_batch_size,
        max_queue_delay_microseconds=delay,
        max_queue_size=queue_size,
        instance_count=_instance_count(env),
        intra_op_threads=env.integer("SAGEMAKER_TFS_INTRA_OP_PARALLELISM") or None,  # 0 = modelhost decides
        inter_op_threads=env.integer("SAGEMAKER_TFS_INTER_OP_PARALLELISM") or None,
    )


def _instance_count(env: _Variables) -> int | None:
    low = env.integer("SAGEMAKER_TS_MIN_WORKERS", 1)
    high = env.integer("SAGEMAKER_TS_MAX_WORKERS", 1)
    if low is not None and high is not None and low > high:
        raise SettingsError(f"{env.show('SAGEMAKER_TS_MIN_WORKERS')} is more than "
                            f"{env.show('SAGEMAKER_TS_MAX_WORKERS')}")
    ts_workers = max(low or 0, high or 0) or None
    shown_ts = ", ".join(env.show(n) for n in ("SAGEMAKER_TS_MIN_WORKERS", "SAGEMAKER_TS_MAX_WORKERS") if env.text(n))
    return _choose(
        "instance_count",
        [(env.show("SAGEMAKER_TFS_NUM_BATCH_THREADS"), env.integer("SAGEMAKER_TFS_NUM_BATCH_THREADS", 1)),
         (shown_ts, ts_workers)],
        [(env.show("SAGEMAKER_MODEL_SERVER_WORKERS"), env.integer("SAGEMAKER_MODEL_SERVER_WORKERS", 1))],
    )
