"""Read and check a model's config.pbtxt (protobuf text format of ModelConfig)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

from google.protobuf import json_format, text_format
from google.protobuf.descriptor import Descriptor, FieldDescriptor

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
    """The JSON form Triton serves at /config: proto field names, every field present,
    and 64-bit integers as JSON numbers (protobuf's JSON mapping would quote them)."""
    document = json_format.MessageToDict(
        config, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
    )
    _unquote_int64(document, cast(Descriptor, ModelConfig.DESCRIPTOR))
    return document


_INT64_TYPES = {
    FieldDescriptor.TYPE_INT64,
    FieldDescriptor.TYPE_UINT64,
    FieldDescriptor.TYPE_SINT64,
    FieldDescriptor.TYPE_FIXED64,
    FieldDescriptor.TYPE_SFIXED64,
}


def _unquote_int64(document: dict[str, Any], descriptor: Descriptor) -> None:
    for field in descriptor.fields:
        value = document.get(field.name)
        if value is None:
            continue
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            # JSON object keys stay strings, whatever the map's key type.
            value_field = field.message_type.fields_by_name["value"]
            document[field.name] = {key: _convert(item, value_field) for key, item in value.items()}
        elif isinstance(value, list):
            document[field.name] = [_convert(item, field) for item in value]
        else:
            document[field.name] = _convert(value, field)


def _convert(value: Any, field: FieldDescriptor) -> Any:
    if field.type in _INT64_TYPES:
        return int(value)
    if field.message_type is not None and isinstance(value, dict):
        _unquote_int64(value, field.message_type)
    return value
