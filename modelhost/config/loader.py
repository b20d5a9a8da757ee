"""Read and check a model's config.pbtxt (protobuf text format of ModelConfig)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from google.protobuf import json_format, text_format

from modelhost.config.model_config_pb2 import ModelConfig

CONFIG_FILENAME = "config.pbtxt"


class ConfigError(Exception):
    """A model's configuration is unreadable or inconsistent; the message names the field."""


def read_config(model_dir: Path) -> ModelConfig | None:
    """Parse `<model_dir>/config.pbtxt`, or return None when the file does not exist."""
    path = model_dir / CONFIG_FILENAME
    if not path.is_file():
        return None
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read {path}: {exc}") from exc
    return parse_config(text, str(path))


def parse_config(text: str, origin: str = CONFIG_FILENAME) -> ModelConfig:
    try:
        return text_format.Parse(text, ModelConfig())
    except text_format.ParseError as exc:
        raise ConfigError(f"{origin}: {exc}") from exc


def config_from_json(document: str | dict[str, Any], origin: str = "config") -> ModelConfig:
    """A ModelConfig from its JSON form (Triton's load-override `config` parameter)."""
    try:
        if isinstance(document, str):
            return json_format.Parse(document, ModelConfig())
        return json_format.ParseDict(document, ModelConfig())
    except json_format.ParseError as exc:
        raise ConfigError(f"{origin}: {exc}") from exc


def config_to_json(config: ModelConfig) -> dict[str, Any]:
    """The JSON form Triton serves at /config: proto field names, every field present."""
    return json_format.MessageToDict(
        config, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
    )
