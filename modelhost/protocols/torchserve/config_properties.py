"""TorchServe's `config.properties` (tsfs §A7): the keys a migrating deployment has, read as TorchServe reads them.

The file is Java properties (read by javaproperties); a value may name an environment variable as `$$VAR$$`.
With `enable_envvars_config=true` every key can also come from `TS_<KEY>` (upper case), which wins over the file
and the command line; `models` has no variable, and `TS_ALLOWED_URLS` counts only with `use_env_allowed_urls`.
A key modelhost serves differently or not at all (thread counts of TorchServe's Java frontend, its log files) is
accepted and named once in the log; an unknown key likewise; a value that does not parse is an error naming the key.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

DEFAULT_MAX_MESSAGE_BYTES = 6_553_500


class TorchServeConfigError(Exception):
    """A config.properties value (or TS_ variable, or flag) TorchServe would refuse; names the key."""


@dataclass(frozen=True, slots=True)
class Address:
    """An HTTP listener's address (`http://127.0.0.1:8080`); `tls` for https."""

    host: str
    port: int
    tls: bool = False

    def __str__(self) -> str:
        return f"{'https' if self.tls else 'http'}://{self.host}:{self.port}"


@dataclass(frozen=True, slots=True)
class TorchServeConfig:
    inference_address: Address = Address("127.0.0.1", 8080)
    management_address: Address = Address("127.0.0.1", 8081)
    metrics_address: Address = Address("127.0.0.1", 8082)
    grpc_inference_address: str = "127.0.0.1"
    grpc_inference_port: int = 7070
    grpc_management_address: str = "127.0.0.1"
    grpc_management_port: int = 7071
    model_store: Path | None = None
    load_models: tuple[str, ...] = ()  # "all", or entries "[name=]archive"
    models: Mapping[str, Any] = field(default_factory=dict)  # the `models` JSON: name -> version -> settings
    default_workers_per_model: int = 0  # 0: one per CPU for the models loaded at start
    job_queue_size: int = 100
    max_request_size: int = DEFAULT_MAX_MESSAGE_BYTES
    max_response_size: int = DEFAULT_MAX_MESSAGE_BYTES
    default_response_timeout: int = 120
    default_startup_timeout: int = 120
    unregister_model_timeout: int = 120
    enable_model_api: bool = False
    enable_metrics_api: bool = True
    metrics_mode: str = "log"
    disable_token_authorization: bool = False
    token_expiration_min: float = 60.0
    decode_input_request: bool = True
    service_envelope: str | None = None  # json, body, kserve or kservev2: wraps every handler
    default_service_handler: str | None = None  # the handler of an archive whose manifest names none
    allowed_urls: tuple[str, ...] = (r"file://.*", r"http(s)?://.*")
    private_key_file: Path | None = None
    certificate_file: Path | None = None
    # Keys read and not used (what they tune is modelhost's own), and keys TorchServe does not know: for the log.
    unused: tuple[str, ...] = ()
    unknown: tuple[str, ...] = ()


# Keys TorchServe has whose work modelhost does its own way: accepted, and named in the log.
_UNUSED = frozenset({
    "number_of_netty_threads", "netty_client_threads", "number_of_gpu", "vmargs", "async_logging", "workflow_store",
    "disable_system_metrics", "initial_worker_port", "blacklist_env_vars", "install_py_dep_per_model",
    "limit_max_image_pixels", "model_server_home", "cors_allowed_origin",
    "cors_allowed_methods", "cors_allowed_headers", "metrics_config", "model_metrics_auto_detect",
    "ts_open_inference_protocol", "enable_grpc_ssl", "use_native_io", "io_ratio", "max_workers",
    "keystore", "keystore_pass", "keystore_type", "system_metrics_cmd", "maxRetryTimeoutInSec", "plugins_path",
})
_ADDRESSES = ("inference_address", "management_address", "metrics_address")
_INTEGERS = {
    "grpc_inference_port": 0, "grpc_management_port": 0, "default_workers_per_model": 0, "job_queue_size": 1,
    "max_request_size": 1, "max_response_size": 1, "default_response_timeout": 1, "default_startup_timeout": 1,
    "unregister_model_timeout": 1,
}
_BOOLEANS = ("enable_model_api", "enable_metrics_api", "disable_token_authorization", "decode_input_request",
             "enable_envvars_config", "use_env_allowed_urls")
_TEXTS = ("grpc_inference_address", "grpc_management_address")
_METRICS_MODES = ("log", "prometheus", "legacy")
_ENVELOPES = ("json", "body", "kserve", "kservev2")
_VARIABLE = re.compile(r"\$\$(\w+)\$\$")


def read_properties(path: Path) -> dict[str, str]:
    """The file's keys and values; TorchServeConfigError when it cannot be read."""
    import javaproperties

    try:
        with open(path, encoding="latin-1") as file:
            return dict(javaproperties.load(file))
    except OSError as exc:
        raise TorchServeConfigError(f"--ts-config {path}: {exc.strerror}") from None
    except ValueError as exc:
        raise TorchServeConfigError(f"--ts-config {path}: not a Java properties file: {exc}") from None


def torchserve_config(properties: Mapping[str, str], environ: Mapping[str, str],
                      overrides: Mapping[str, str] | None = None) -> TorchServeConfig:
    """The configuration of a file's `properties`, the command line's `overrides` (keys of the same names) over
    it, and with `enable_envvars_config` the TS_ variables of `environ` over both."""
    values = {key: _expand(key, value, environ) for key, value in properties.items()}
    values.update(overrides or {})
    if _boolean("enable_envvars_config", values.get("enable_envvars_config", "false")):
        use_env_urls = _boolean("use_env_allowed_urls", values.get("use_env_allowed_urls", "false"))
        for name, value in environ.items():
            if not name.startswith("TS_") or name in ("TS_CONFIG_FILE", "TS_MODELS"):
                continue
            key = name[3:].lower()
            if key == "allowed_urls" and not use_env_urls:
                continue
            values[key] = value
    settings: dict[str, Any] = {}
    unused, unknown = [], []
    for key, value in values.items():
        if key in _ADDRESSES:
            settings[key] = _address(key, value)
        elif key in _INTEGERS:
            settings[key] = _integer(key, value, _INTEGERS[key])
        elif key in _BOOLEANS:
            flag = _boolean(key, value)
            if key in TorchServeConfig.__dataclass_fields__:
                settings[key] = flag
        elif key in _TEXTS:
            settings[key] = value.strip()
        elif key == "model_store":
            settings[key] = Path(value.strip()) if value.strip() else None
        elif key == "load_models":
            settings[key] = tuple(entry.strip() for entry in value.split(",") if entry.strip())
        elif key == "models":
            settings[key] = _models(value)
        elif key == "metrics_mode":
            mode = value.strip().lower()
            if mode not in _METRICS_MODES:
                raise TorchServeConfigError(f"metrics_mode must be one of {', '.join(_METRICS_MODES)}, got '{value}'")
            settings[key] = mode
        elif key == "service_envelope":
            envelope = value.strip().lower() or None
            if envelope is not None and envelope not in _ENVELOPES:
                raise TorchServeConfigError(f"service_envelope must be one of {', '.join(_ENVELOPES)}, got '{value}'")
            settings[key] = envelope
        elif key == "default_service_handler":
            settings[key] = value.strip() or None
        elif key == "token_expiration_min":
            settings[key] = _number(key, value)
        elif key == "allowed_urls":
            settings[key] = _patterns(key, value)
        elif key in ("private_key_file", "certificate_file"):
            settings[key] = Path(value.strip())
        elif key in _UNUSED:
            unused.append(key)
        else:
            unknown.append(key)
    config = TorchServeConfig(**settings, unused=tuple(sorted(unused)), unknown=tuple(sorted(unknown)))
    _check_tls(config)
    return config


def _expand(key: str, value: str, environ: Mapping[str, str]) -> str:
    def variable(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in environ:
            raise TorchServeConfigError(f"{key}: environment variable {name} (named as $${name}$$) is not set")
        return environ[name]

    return _VARIABLE.sub(variable, value)


def _address(key: str, value: str) -> Address:
    text = value.strip()
    if text.startswith("unix:"):
        raise TorchServeConfigError(f"{key}: unix socket addresses are not supported, got '{value}'")
    parts = urlsplit(text)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise TorchServeConfigError(f"{key} must be http(s)://host:port, got '{value}'")
    try:
        port = parts.port
    except ValueError:
        raise TorchServeConfigError(f"{key} has an invalid port: '{value}'") from None
    if port is None:
        port = 443 if parts.scheme == "https" else 80
    return Address(parts.hostname, port, parts.scheme == "https")


def _integer(key: str, value: str, smallest: int) -> int:
    try:
        number = int(value.strip())
    except ValueError:
        raise TorchServeConfigError(f"{key} must be an integer, got '{value}'") from None
    if number < smallest:
        raise TorchServeConfigError(f"{key} must be >= {smallest}, got '{value}'")
    return number


def _number(key: str, value: str) -> float:
    try:
        number = float(value.strip())
    except ValueError:
        raise TorchServeConfigError(f"{key} must be a number, got '{value}'") from None
    if not number > 0:
        raise TorchServeConfigError(f"{key} must be > 0, got '{value}'")
    return number


def _boolean(key: str, value: str) -> bool:
    lowered = value.strip().lower()
    if lowered not in ("true", "false"):
        raise TorchServeConfigError(f"{key} must be true or false, got '{value}'")
    return lowered == "true"


def _patterns(key: str, value: str) -> tuple[str, ...]:
    patterns = tuple(part.strip() for part in value.split(",") if part.strip())
    for pattern in patterns:
        try:
            re.compile(pattern)
        except re.error as exc:
            raise TorchServeConfigError(f"{key}: '{pattern}' is not a regular expression: {exc}") from None
    return patterns


def _models(value: str) -> dict[str, Any]:
    try:
        models = json.loads(value)
    except ValueError as exc:
        raise TorchServeConfigError(f"models must be JSON: {exc}") from None
    if not isinstance(models, dict) or not all(
            isinstance(versions, dict) and all(isinstance(v, dict) for v in versions.values())
            for versions in models.values()):
        raise TorchServeConfigError('models must be a JSON object {"<name>": {"<version>": {...settings}}}')
    return models


def _check_tls(config: TorchServeConfig) -> None:
    https = [key for key in _ADDRESSES if getattr(config, key).tls]
    if https and (config.private_key_file is None or config.certificate_file is None):
        raise TorchServeConfigError(f"{', '.join(https)} use https: set private_key_file and certificate_file (a "
                                    "PEM key and certificate; modelhost does not read Java keystores)")


def environment_config_file(environ: Mapping[str, str]) -> Path | None:
    """TS_CONFIG_FILE, which TorchServe reads before --ts-config."""
    value = environ.get("TS_CONFIG_FILE", "").strip()
    return Path(value) if value else None


def default_config_file() -> Path | None:
    """./config.properties when it exists: TorchServe's last place to look."""
    path = Path(os.getcwd()) / "config.properties"
    return path if path.is_file() else None
