"""TF Serving REST predict bodies <-> input and output arrays by name (protocols §5.2, §5.4).

Row format: `{"instances": [...]}` in, `{"predictions": [...]}` out. Columnar format: `{"inputs": ...}` in,
`{"outputs": ...}` out. Pure functions with no I/O; the front-end answers in the format the request used.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Collection, Sequence
from typing import Any

import numpy as np
import orjson

from modelhost.errors import invalid
from modelhost.types import DATATYPE_DTYPES, TensorSpec, format_shape

ROW = "row"
COLUMNAR = "columnar"

# JSON value kinds (numpy dtype kinds) each numeric input accepts, and how a message names them.
_ACCEPTED_KINDS = {"b": "b", "i": "iu", "u": "iu", "f": "iuf"}
_KIND_WORDS = {"b": "true/false", "i": "integers", "u": "integers", "f": "numbers"}
_JSON_TYPES = {
    dict: "an object", list: "a list", str: "a string", bool: "a boolean", int: "a number", float: "a number",
}
_MAX_RANK = 64  # numpy's own limit on dimensions
_BYTES_SUFFIX = "_bytes"  # TF Serving always answers string outputs named like this in base64


def decode_predict(body: bytes, inputs: Sequence[TensorSpec]) -> tuple[dict[str, np.ndarray], str]:
    """Input arrays by name from a :predict body, and the format it used (ROW or COLUMNAR)."""
    document = _parse_json(body)
    signature = document.get("signature_name", "")
    if not isinstance(signature, str):
        raise invalid(f"'signature_name' must be a string, got {_json_type(signature)}")
    if ("instances" in document) == ("inputs" in document):
        raise invalid("request must have exactly one of 'instances' (row format) and 'inputs' (columnar format)")
    specs = {spec.name: spec for spec in inputs}
    if "instances" in document:
        return _decode_rows(document["instances"], specs), ROW
    return _decode_columns(document["inputs"], specs), COLUMNAR


def encode_predict(outputs: dict[str, np.ndarray], form: str) -> bytes:
    """The :predict response body for output arrays by name, in the request's format (ROW or COLUMNAR)."""
    if form == ROW:
        document = {"predictions": _rows_json(outputs)}
    elif form == COLUMNAR:
        document = {"outputs": _columns_json(outputs)}
    else:
        raise ValueError(f"unknown predict format {form!r}; expected {ROW!r} or {COLUMNAR!r}")
    # orjson writes NaN and ±Infinity as null where TF Serving writes bare NaN/Infinity tokens,
    # which strict JSON parsers (browsers, orjson itself) reject.
    return orjson.dumps(document, option=orjson.OPT_SERIALIZE_NUMPY)


def _parse_json(body: bytes) -> dict[str, Any]:
    try:
        document = orjson.loads(body)
    except orjson.JSONDecodeError as error:
        # TF Serving also accepts the bare tokens NaN, Infinity and -Infinity, which only the standard library parses.
        try:
            document = json.loads(body)
        except (ValueError, RecursionError):
            raise invalid(f"request body is not valid JSON: {error}") from None
    if not isinstance(document, dict):
        raise invalid("request body must be a JSON object with 'instances' or 'inputs'")
    return document


def _decode_rows(instances: Any, specs: dict[str, TensorSpec]) -> dict[str, np.ndarray]:
    if not isinstance(instances, list):
        raise invalid(f"'instances' must be a list, got {_json_type(instances)}")
    if not instances:
        raise invalid("'instances' is an empty list; send at least one instance")
    if len(specs) == 1 and not _is_named(instances[0]):
        columns = {next(iter(specs)): instances}
    else:
        columns = _split_named_instances(instances, specs)
    return {name: _stack_instances(specs[name], values) for name, values in columns.items()}


def _split_named_instances(instances: list[Any], specs: dict[str, TensorSpec]) -> dict[str, list[Any]]:
    """Objects keyed by input name, one per instance -> each input's values in instance order."""
    first = instances[0]
    if not _is_named(first):
        raise invalid(f"instances[0] must be an object keyed by input name; the model's inputs are {_names(specs)}")
    _check_input_names(first.keys(), specs, "instances[0]")
    columns: dict[str, list[Any]] = {name: [] for name in first}
    for index, instance in enumerate(instances):
        if not _is_named(instance):
            raise invalid(f"instances[{index}] must be an object keyed by input name, like instances[0]")
        if instance.keys() != first.keys():
            raise invalid(
                f"instances[{index}] has inputs {_names(instance)}, but instances[0] has {_names(first)}; "
                "every instance needs the same inputs"
            )
        for name, value in instance.items():
            columns[name].append(value)
    return columns


def _stack_instances(spec: TensorSpec, values: list[Any]) -> np.ndarray:
    if not spec.shape:
        raise invalid(f"input '{spec.name}' is a scalar, so it cannot be sent in 'instances'; use 'inputs'")
    if spec.shape[0] not in (-1, len(values)):
        raise invalid(f"input '{spec.name}' takes exactly {spec.shape[0]} instances, got {len(values)}")
    instance_shape = spec.shape[1:]
    arrays: list[np.ndarray] = []
    for index, value in enumerate(values):
        where = f"instances[{index}]: input '{spec.name}'"
        array = _to_array(spec, value, where)
        _check_shape(array, instance_shape, where)
        if arrays and array.shape != arrays[0].shape:
            raise invalid(
                f"{where} has shape {format_shape(array.shape)}, but in instances[0] it has "
                f"{format_shape(arrays[0].shape)}; instances must have the same shape"
            )
        arrays.append(array)
    return np.stack(arrays)


def _decode_columns(value: Any, specs: dict[str, TensorSpec]) -> dict[str, np.ndarray]:
    if _is_named(value):
        _check_input_names(value.keys(), specs, "'inputs'")
        named = value
    elif len(specs) == 1:
        named = {next(iter(specs)): value}
    else:
        raise invalid(f"'inputs' must be an object keyed by input name; the model's inputs are {_names(specs)}")
    arrays = {}
    for name, tensor in named.items():
        spec = specs[name]
        where = f"'inputs': input '{name}'"
        array = _to_array(spec, tensor, where)
        _check_shape(array, spec.shape, where)
        arrays[name] = array
    return arrays


def _check_input_names(given: Collection[str], specs: dict[str, TensorSpec], where: str) -> None:
    unknown = [name for name in given if name not in specs]
    if unknown:
        raise invalid(f"{where} has unknown input(s) {_names(unknown)}; the model's inputs are {_names(specs)}")
    missing = [name for name, spec in specs.items() if name not in given and not spec.optional]
    if missing:
        raise invalid(f"{where} is missing input(s) {_names(missing)}")


def _check_shape(array: np.ndarray, expected: tuple[int, ...], where: str) -> None:
    if len(array.shape) != len(expected) or any(e not in (-1, d) for d, e in zip(array.shape, expected)):
        raise invalid(f"{where} has shape {format_shape(array.shape)}, but the model expects {format_shape(expected)}")


def _to_array(spec: TensorSpec, value: Any, where: str) -> np.ndarray:
    dtype = DATATYPE_DTYPES.get(spec.datatype)
    if dtype is None:
        raise invalid(f"{where} is {spec.datatype}, which cannot be sent as JSON")
    if spec.datatype == "BYTES":
        return _bytes_array(value, where)
    return _numeric_array(value, dtype, spec.datatype, where)


def _numeric_array(value: Any, dtype: np.dtype, datatype: str, where: str) -> np.ndarray:
    try:
        array = np.asarray(value)
    except ValueError:
        raise invalid(f"{where} is a ragged list; lists at the same depth must have the same length") from None
    if array.size == 0:
        return array.astype(dtype)
    if array.dtype.kind not in _ACCEPTED_KINDS[dtype.kind]:
        raise invalid(f"{where} is {datatype}, so its values must be {_KIND_WORDS[dtype.kind]}")
    if dtype.kind in "iu":
        limits = np.iinfo(dtype)
        if array.min() < limits.min or array.max() > limits.max:
            raise invalid(f"{where} has values outside the range of {datatype}")
    return array.astype(dtype)


def _bytes_array(value: Any, where: str) -> np.ndarray:
    elements: list[bytes] = []
    shape = _collect_bytes(value, where, elements, depth=0)
    array = np.empty(len(elements), dtype=object)
    array[:] = elements
    return array.reshape(shape)


def _collect_bytes(value: Any, where: str, elements: list[bytes], depth: int) -> tuple[int, ...]:
    """Append the strings of a nested list to `elements` in row-major order; return the list's shape."""
    if not isinstance(value, list):
        elements.append(_binary_string(value, where))
        return ()
    if depth == _MAX_RANK:
        raise invalid(f"{where} is nested deeper than {_MAX_RANK} lists")
    shapes = {_collect_bytes(item, where, elements, depth + 1) for item in value}
    if len(shapes) > 1:
        raise invalid(f"{where} is a ragged list; lists at the same depth must have the same length")
    return (len(value), *shapes.pop()) if shapes else (0,)


def _binary_string(value: Any, where: str) -> bytes:
    if isinstance(value, str):
        try:
            return value.encode("utf-8")
        except UnicodeEncodeError:
            raise invalid(f"{where} has a string that is not valid Unicode (a lone surrogate)") from None
    if not _is_b64(value):
        raise invalid(f'{where} is BYTES, so its values must be strings or {{"b64": ...}}, got {_json_type(value)}')
    encoded = value["b64"]
    if isinstance(encoded, str):
        try:
            return base64.b64decode(encoded, validate=True)
        except ValueError:  # binascii.Error, or a non-ASCII string
            pass
    raise invalid(f"{where} has a 'b64' value that is not a base64 string")


def _rows_json(outputs: dict[str, np.ndarray]) -> Any:
    for name, array in outputs.items():
        if array.ndim == 0:
            raise invalid(f"output '{name}' is a scalar, so it cannot be returned in row format; send 'inputs'")
    sizes = {name: array.shape[0] for name, array in outputs.items()}
    if len(set(sizes.values())) > 1:
        listed = ", ".join(f"'{name}': {size}" for name, size in sizes.items())
        raise invalid(
            f"outputs differ in their first dimension ({listed}), so they cannot be returned in row format; "
            "send 'inputs'"
        )
    values = {name: _tensor_json(name, array) for name, array in outputs.items()}
    if len(values) == 1:
        return next(iter(values.values()))
    batch_size = next(iter(sizes.values()), 0)
    return [{name: value[row] for name, value in values.items()} for row in range(batch_size)]


def _columns_json(outputs: dict[str, np.ndarray]) -> Any:
    values = {name: _tensor_json(name, array) for name, array in outputs.items()}
    return next(iter(values.values())) if len(values) == 1 else values


def _tensor_json(name: str, array: np.ndarray) -> Any:
    """What orjson (with OPT_SERIALIZE_NUMPY) writes as the tensor's nested lists."""
    if array.dtype.kind not in "OSU":
        return np.ascontiguousarray(array)
    always_b64 = name.endswith(_BYTES_SUFFIX)
    strings = (_string_json(element, always_b64) for element in array.flat)
    return np.fromiter(strings, dtype=object, count=array.size).reshape(array.shape).tolist()


def _string_json(element: Any, always_b64: bool) -> str | dict[str, str]:
    data = element if isinstance(element, bytes) else str(element).encode("utf-8")
    if not always_b64:
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError:
            pass
    return {"b64": base64.b64encode(data).decode("ascii")}


def _is_b64(value: Any) -> bool:
    return isinstance(value, dict) and len(value) == 1 and "b64" in value


def _is_named(value: Any) -> bool:
    """An object keyed by input name, as opposed to a value (which may be a {"b64": ...} object)."""
    return isinstance(value, dict) and not _is_b64(value)


def _names(names: Collection[str]) -> str:
    return ", ".join(f"'{name}'" for name in names) or "(none)"


def _json_type(value: Any) -> str:
    return "null" if value is None else _JSON_TYPES.get(type(value), type(value).__name__)
