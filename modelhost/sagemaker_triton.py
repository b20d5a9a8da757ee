"""The variables of the SageMaker Triton container (SAGEMAKER_TRITON_*, read by its `serve` script) and the
other containers' variables users carry over, as modelhost settings, or as a warning at start saying why a
variable has no effect here: none is ignored silently. Pure: reads only the mapping it is given.

Mapped (settings_sources.settings_from_environment applies them; a command-line flag still wins):
  SAGEMAKER_TRITON_DEFAULT_MODEL_NAME -> default_model_name (the model /invocations runs when several are served)
  SAGEMAKER_TRITON_LOG_VERBOSE, _LOG_INFO, _LOG_WARNING, _LOG_ERROR -> log_level (the lowest level written)
  SAGEMAKER_TRITON_ALLOW_GRPC=false -> grpc_port 0; SAGEMAKER_TRITON_GRPC_PORT -> grpc_port
  SAGEMAKER_TRITON_ALLOW_METRICS=false -> metrics_port 0; SAGEMAKER_TRITON_METRICS_PORT -> metrics_port
Checked at start as the container's script checks it: SAGEMAKER_TRITON_DEFAULT_MODEL_NAME on a single-model
endpoint whose repository is Triton's layout must name one of its model directories (`default_model_error`).
Checked, then warned about when modelhost does otherwise: SAGEMAKER_TRITON_OVERRIDE_PING_MODE (ready | live),
SAGEMAKER_TRITON_INFERENCE_TYPE (infer | generate | generate_stream). Warned about: the rest of `NO_EFFECT`.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

_PREFIX = "SAGEMAKER_TRITON_"
_LOG_FLAGS = (("LOG_INFO", "info"), ("LOG_WARNING", "warning"), ("LOG_ERROR", "error"))
PING_MODES = ("ready", "live")
INFERENCE_TYPES = ("infer", "generate", "generate_stream")

NO_EFFECT = {
    "SAGEMAKER_TRITON_THREAD_COUNT": "modelhost's SageMaker front-end serves every connection on its event loop; "
                                     "there is no HTTP thread pool to size (a model's instance_group count sets "
                                     "how many requests run at once)",
    "SAGEMAKER_TRITON_BUFFER_MANAGER_THREAD_COUNT": "modelhost has no buffer-manager threads: request tensors are "
                                                    "decoded in place from the request body",
    "SAGEMAKER_TRITON_SHM_DEFAULT_BYTE_SIZE": "modelhost's Python backend has no shared-memory pool to size: "
                                              "tensors reach model.py processes over a socket, sized per message",
    "SAGEMAKER_TRITON_SHM_GROWTH_BYTE_SIZE": "modelhost's Python backend has no shared-memory pool to grow: "
                                             "tensors reach model.py processes over a socket, sized per message",
    "SAGEMAKER_TRITON_TENSORFLOW_VERSION": "SavedModels run on the TensorFlow 2 installed beside modelhost; there "
                                           "is no TensorFlow 1 backend to choose",
    "SAGEMAKER_TRITON_MODEL_LOAD_GPU_LIMIT": "modelhost does not cap the GPU memory a model load may take; the "
                                             "model cache's byte budget (--model-cache-bytes) bounds what stays "
                                             "loaded",
    "SAGEMAKER_TRITON_ADDITIONAL_ARGS": "tritonserver flags are not read from a variable; give modelhost's own "
                                        "flags on its command line (docs/sagemaker.md lists the equivalents)",
    "SAGEMAKER_TRITON_DISABLE_MODEL_NAMESPACING": "modelhost keeps each multi-model archive's models under its own "
                                                  "target name, so models of different archives never collide; "
                                                  "there is no namespacing to turn off",
    "TS_CONFIG_FILE": "a TorchServe config.properties is read by `modelhost torchserve` (TorchServe's command "
                      "line); this server takes the SAGEMAKER_TS_* and SAGEMAKER_MODEL_SERVER_* variables",
    "SAGEMAKER_MODEL_SERVER_VMARGS": "modelhost runs no Java VM (TorchServe's frontend); nothing takes JVM "
                                     "arguments",
}


class Variables(Protocol):
    """settings._Variables: typed reads of the environment that raise SettingsError naming a bad variable."""

    def text(self, name: str) -> str | None: ...

    def show(self, name: str) -> str: ...

    def integer(self, name: str, minimum: int = 0, maximum: int | None = None) -> int | None: ...

    def boolean(self, name: str) -> bool | None: ...


def triton_values(env: Variables) -> dict[str, Any]:
    """The settings the container's variables set (only those set); raises SettingsError for a bad value."""
    _choice(env, "OVERRIDE_PING_MODE", PING_MODES)
    _choice(env, "INFERENCE_TYPE", INFERENCE_TYPES)
    values: dict[str, Any] = {
        "default_model_name": env.text(_PREFIX + "DEFAULT_MODEL_NAME"),
        "log_level": _log_level(env),
        "grpc_port": _port(env, "GRPC"),
        "metrics_port": _port(env, "METRICS"),
    }
    return {name: value for name, value in values.items() if value is not None}


def default_model_error(environ: Mapping[str, str], repository: str | None, multi_model: bool) -> str | None:
    """Why the server must not start, as the container's `serve` exits when SAGEMAKER_TRITON_DEFAULT_MODEL_NAME names
    no directory of a single-model endpoint's repository; None when it does, or the check does not apply (unset, a
    multi-model endpoint, a remote repository, or a repository in another layout, where the name is the one its
    single model is served under)."""
    name = environ.get(_PREFIX + "DEFAULT_MODEL_NAME", "").strip()
    if not name or multi_model or repository is None or "://" in repository:
        return None
    root = Path(repository)
    try:
        triton_layout = any((entry / "config.pbtxt").is_file() for entry in root.iterdir() if entry.is_dir())
    except OSError:
        return None  # the server's own start names a missing or unreadable repository
    if not triton_layout or (name not in (".", "..") and "/" not in name and (root / name).is_dir()):
        return None
    return (f"SAGEMAKER_TRITON_DEFAULT_MODEL_NAME is '{name}', but the model repository has no model directory of "
            "that name")


def _port(env: Variables, kind: str) -> int | None:
    """0 when ALLOW_<kind> is false (the port is then ignored, as the container ignores it), else <kind>_PORT."""
    port = env.integer(f"{_PREFIX}{kind}_PORT", 1, 65535)
    return 0 if env.boolean(f"{_PREFIX}ALLOW_{kind}") is False else port


def _log_level(env: Variables) -> str | None:
    """Triton's switches as one level: DEBUG with verbose logging, else the lowest of INFO, WARNING, ERROR on."""
    verbose = _verbose(env)
    switches = [(env.boolean(_PREFIX + name), level) for name, level in _LOG_FLAGS]
    if verbose is None and all(on is None for on, _ in switches):
        return None
    if verbose:
        return "debug"
    return next((level for on, level in switches if on is not False), "critical")


def _verbose(env: Variables) -> int | None:
    """--log-verbose takes a level; the container's script passes `true` when the variable is unset."""
    text = env.text(_PREFIX + "LOG_VERBOSE")
    if text is not None and text.lower() in ("true", "false"):
        return int(text.lower() == "true")
    return env.integer(_PREFIX + "LOG_VERBOSE")


def _choice(env: Variables, name: str, allowed: tuple[str, ...]) -> str | None:
    value = env.text(_PREFIX + name)
    if value is not None and value not in allowed:
        from modelhost.settings import SettingsError  # settings imports this module

        raise SettingsError(f"{env.show(_PREFIX + name)} must be one of {', '.join(allowed)}")
    return value


def triton_warnings(environ: Mapping[str, str]) -> list[str]:
    """One line for each set variable that has no effect here, saying why (settings_sources.unused_variables adds
    them)."""
    def value(name: str) -> str:
        return environ.get(name, "").strip()

    lines = [f"{name} is set but not used: {why}" for name, why in NO_EFFECT.items() if value(name)]
    ping = value(_PREFIX + "OVERRIDE_PING_MODE")
    ours = "live" if value("SAGEMAKER_MULTI_MODEL").lower() in ("true", "1") else "ready"
    if ping and ping != ours:
        lines.append(f"{_PREFIX}OVERRIDE_PING_MODE={ping} is set but not used: /ping answers '{ours}' here (200 "
                     "while every model of a single-model endpoint serves; while the server runs, for a multi-model "
                     "one)")
    kind = value(_PREFIX + "INFERENCE_TYPE")
    if kind in ("generate", "generate_stream"):
        lines.append(f"{_PREFIX}INFERENCE_TYPE={kind} is set but not used: /invocations runs V2 inference; "
                     f"the generate extension is served on the HTTP port at /v2/models/<name>/{kind}")
    return lines
