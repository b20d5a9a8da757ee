"""The JSON bodies of the repository extension's load and unload (Triton's `parameters`), and its repository
names (HTTP's /v2/repository/{repository}/..., gRPC's repository_name), which Triton refuses as this server does."""

from __future__ import annotations

import base64
import binascii
from typing import Any

from modelhost.core.load_request import FILE_PREFIX, LoadRequest
from modelhost.errors import ErrorKind, ModelhostError, client_value, invalid


def no_repository(repository: str, action: str) -> None:
    """UNSUPPORTED, in Triton's words, when a request names a repository (`action`: "index", "load model 'm'")."""
    if repository:
        raise ModelhostError(ErrorKind.UNSUPPORTED, f"'repository_name' specification is not supported: cannot "
                             f"{action} in repository '{repository}'; this server has one repository, which "
                             "requests leave unnamed")


def _parameters(body: dict[str, Any]) -> dict[str, Any]:
    parameters = body.get("parameters", {})
    if not isinstance(parameters, dict):
        raise invalid("'parameters' must be a JSON object")
    return parameters


def decode_load_request(body: dict[str, Any]) -> LoadRequest:
    """`{"parameters": {"config": "<ModelConfig JSON>", "file:<version>/<path>": "<base64>"}}`."""
    config: str | None = None
    files: dict[str, bytes] = {}
    unknown: list[str] = []
    for key, value in _parameters(body).items():
        if key == "config":
            if not isinstance(value, str):
                raise invalid("load parameter 'config' must be a string holding the model configuration in JSON")
            config = value
        elif key.startswith(FILE_PREFIX):
            files[key] = _base64(key, value)
        else:
            unknown.append(key)
    return LoadRequest(config, files, tuple(unknown))


def _base64(key: str, value: Any) -> bytes:
    if not isinstance(value, str):
        raise invalid(f"load parameter '{key}' must be a string holding the file's content in base64")
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise invalid(f"load parameter '{key}' is not valid base64") from None


def decode_unload_dependents(body: dict[str, Any]) -> bool:
    """`{"parameters": {"unload_dependents": true}}`; false when absent."""
    value = _parameters(body).get("unload_dependents", False)
    if not isinstance(value, bool):
        raise invalid(f"unload parameter 'unload_dependents' must be true or false, got {client_value(value)}")
    return value
