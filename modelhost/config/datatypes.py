"""config.pbtxt data types (TYPE_*) <-> KServe V2 datatype names."""

from __future__ import annotations

from modelhost.config.model_config_pb2 import DataType

# Triton's API name is the enum name without TYPE_, except TYPE_STRING which is BYTES.
_CONFIG_TO_V2 = {
    value: ("BYTES" if name == "TYPE_STRING" else name.removeprefix("TYPE_"))
    for name, value in DataType.items()
    if name != "TYPE_INVALID"
}
_V2_TO_CONFIG = {v2: value for value, v2 in _CONFIG_TO_V2.items()}


def v2_datatype(config_type: int) -> str:
    """The V2 name of a config data type; raises KeyError for TYPE_INVALID."""
    return _CONFIG_TO_V2[config_type]


def config_datatype(v2_name: str) -> int:
    return _V2_TO_CONFIG[v2_name]


def config_type_name(config_type: int) -> str:
    return DataType.Name(config_type)
