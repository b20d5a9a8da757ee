"""A load request's override (Triton's load parameters): a config in JSON, and files for a model directory.

Front-ends translate their wire form (base64 strings over HTTP, bytes over gRPC) into `LoadRequest`;
this module checks it and writes the override directory.
"""

from __future__ import annotations

import itertools
import shutil
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from modelhost.config.model_config_pb2 import ModelConfig
from modelhost.config.pbtxt import ConfigError, config_from_json
from modelhost.digits import is_digits
from modelhost.errors import ModelhostError, invalid
from modelhost.store.local import ModelSource, model_versions
from modelhost.store.paths import check_model_name, check_relative, inside

FILE_PREFIX = "file:"


@dataclass(frozen=True, slots=True)
class LoadRequest:
    """What a client asked a load for: `config` is a ModelConfig's JSON text, `files` maps
    "file:<version>/<path>" to the file's content."""

    config: str | None = None
    files: dict[str, bytes] = field(default_factory=dict)
    unknown: tuple[str, ...] = ()  # other parameter names, refused


@dataclass(frozen=True, slots=True)
class LoadOverride:
    config: ModelConfig | None
    files: dict[PurePosixPath, bytes]  # relative to the model directory: "<version>/<path>"


def check_load_request(name: str, request: LoadRequest) -> LoadOverride:
    """Parse the config and check every file name; raises INVALID_INPUT naming the parameter."""
    if request.unknown:
        raise invalid(f"failed to load '{name}': unknown load parameter '{request.unknown[0]}' "
                      "(expected 'config' or 'file:<version>/<path>')")
    config = None
    if request.config is not None:
        try:
            config = config_from_json(request.config, "load parameter 'config'")
        except ConfigError as exc:
            raise invalid(f"failed to load '{name}': {exc}") from None
        if config.default_model_filename:
            check_model_filename(name, config.default_model_filename)
    files = {_file_path(name, key): content for key, content in request.files.items()}
    if files and config is None:
        raise invalid(f"failed to load '{name}': file parameters need a 'config' parameter too")
    return LoadOverride(config, files)


def _file_path(name: str, key: str) -> PurePosixPath:
    expected = (f"failed to load '{name}': load parameter '{key}' must name a file as file:<version>/<path> "
                "inside the model directory")
    try:
        path = check_relative(key[len(FILE_PREFIX):], "the path")
    except ModelhostError as exc:
        raise invalid(f"{expected} ({exc.message})") from None
    if len(path.parts) < 2 or not is_digits(path.parts[0]):
        raise invalid(expected)
    return path


def check_model_filename(name: str, filename: str) -> None:
    """A config's default_model_filename names a file inside the version directory; INVALID_INPUT otherwise."""
    try:
        check_relative(filename, "default_model_filename")
    except ModelhostError as exc:
        raise invalid(f"failed to load '{name}': {exc.message}; it names the model file inside the "
                      "version directory") from None


_sequence = itertools.count(1)


def write_override(name: str, files: dict[PurePosixPath, bytes], root: Path) -> ModelSource:
    """Write the override files into a fresh model directory under `root` (blocking)."""
    directory = root / f"{check_model_name(name)}-{next(_sequence)}"
    shutil.rmtree(directory, ignore_errors=True)
    for relative, content in files.items():
        target = inside(directory, relative.as_posix(), "load file")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(content)
    return ModelSource(name, directory, model_versions(directory))
