"""TF Serving REST predict bodies <-> input and output arrays by name (protocols §5.2, §5.4).

Row format: `{"instances": [...]}` in, `{"predictions": [...]}` out. Columnar format: `{"inputs": ...}` in,
`{"outputs": ...}` out. Pure functions with no I/O; the front-end answers in the format the request used.
"""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Collection, Mapping, Sequence
from operator import itemgetter
from typing import Any

import numpy as np
import orjson

from modelhost.errors import ModelhostError, invalid
from modelhost.protocols import json_tensors
from modelhost.protocols.json_numbers import json_numbers
from modelhost.protocols.json_tensors import JsonNumbers
from modelhost.types import (
    DATATYPE_DTYPES,
    DEFAULT_LIMITS,
    MAX_RANK,
    ElementBudget,
    RequestLimits,
    TensorSpec,
    check_json_depth,
    format_shape,
)

ROW = "row"
COLUMNAR = "columnar"

_JSON_TYPES = {
    dict: "an object", list: "a list", str: "a string", bool: "a boolean", int: "a number", float: "a number",
}
_BYTES_SUFFIX = "_bytes"  # TF Serving always answers string outputs named like this in base64
_TENSOR_PATHS: tuple[json_tensors.TensorPath, ...] = (("inputs",), ("inputs", json_tensors.ANY), ("instances",))
_OBJECT_INSTANCES = re.compile(rb'"instances"\s*:\s*\[\s*\{')
_OBJECT_INSTANCES_WITHIN = 1024  # bytes at the body's start: past them, the search would cost what it saves


def decode_predict(
    body: bytes, inputs: Sequence[TensorSpec], limits: RequestLimits = DEFAULT_LIMITS
) -> tuple[dict[str, np.ndarray], str]:
    """Input arrays by name from a :predict body, and the format it used (ROW or COLUMNAR).

    Each value's nesting is checked against `limits` before it becomes an array, and the arrays' sizes after
    (they hold no more elements than the body has values)."""
    document = parse_predict_json(body)
    if not isinstance(document, dict):
        raise invalid("request body must be a JSON object with 'instances' or 'inputs'")
    return decode_predict_document(document, inputs, limits)


def decode_predict_document(
    document: dict[str, Any], inputs: Sequence[TensorSpec], limits: RequestLimits = DEFAULT_LIMITS
) -> tuple[dict[str, np.ndarray], str]:
    """decode_predict for a body already parsed (by parse_predict_json or parse_json)."""
    signature = document.get("signature_name", "")
    if not isinstance(signature, str):
        raise invalid(f"'signature_name' must be a string, got {_json_type(signature)}")
    if ("instances" in document) == ("inputs" in document):
        raise invalid("request must have exactly one of 'instances' (row format) and 'inputs' (columnar format)")
    specs = {spec.name: spec for spec in inputs}
    budget = limits.budget()
    if "instances" in document:
        return _decode_rows(document["instances"], specs, budget), ROW
    return _decode_columns(document["inputs"], specs, budget), COLUMNAR


def encode_predict(outputs: dict[str, np.ndarray], form: str) -> bytes:
    """The :predict response body for output arrays by name, in the request's format (ROW or COLUMNAR)."""
    if form == ROW:
        document = {"predictions": row_predictions(outputs)}
    elif form == COLUMNAR:
        document = {"outputs": _columns_json(outputs)}
    else:
        raise ValueError(f"unknown predict format {form!r}; expected {ROW!r} or {COLUMNAR!r}")
    # orjson writes NaN and ±Infinity as null where TF Serving writes bare NaN/Infinity tokens,
    # which strict JSON parsers (browsers, orjson itself) reject.
    return orjson.dumps(document, option=orjson.OPT_SERIALIZE_NUMPY)


def parse_json(body: bytes, what: str = "request body") -> Any:
    """The JSON value of a body, TF Serving style: the bare tokens NaN, Infinity and -Infinity are numbers.

    Raises INVALID_INPUT "<what> is not valid JSON: ...".
    """
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError as error:
        # TF Serving also accepts the bare tokens NaN, Infinity and -Infinity, which only the standard library parses.
        try:
            return json.loads(body)
        except (ValueError, RecursionError):
            raise invalid(f"{what} is not valid JSON: {error}") from None


def parse_predict_json(body: bytes, also: tuple[json_tensors.TensorPath, ...] = ()) -> Any:
    """parse_json for a :predict body, its tensors' numbers left as JsonNumbers where that pays, and those at the
    paths `also` names (SageMaker's bodies: a bare list of rows, a V2 request's data).

    Instances that are objects have no list of numbers for the fast way to take, and simdjson's conversion of
    them costs more than orjson's (1.15x for 500): a body whose start shows them is parsed by orjson."""
    if _OBJECT_INSTANCES.search(body, 0, _OBJECT_INSTANCES_WITHIN):
        return parse_json(body)
    document = json_tensors.load(body, _TENSOR_PATHS + also)
    return parse_json(body) if document is None else document


def _decode_rows(instances: Any, specs: dict[str, TensorSpec], budget: ElementBudget) -> dict[str, np.ndarray]:
    if isinstance(instances, JsonNumbers) and len(specs) != 1:
        instances = instances.as_list()  # refused below, by the usual way's words
    if not isinstance(instances, (list, JsonNumbers)):
        raise invalid(f"'instances' must be a list, got {_json_type(instances)}")
    if not instances:
        raise invalid("'instances' is an empty list; send at least one instance")
    columns: dict[str, list[Any] | JsonNumbers]
    if len(specs) == 1 and (isinstance(instances, JsonNumbers) or not _is_named(instances[0])):
        columns = {next(iter(specs)): instances}
    else:
        columns = dict(_split_named_instances(json_tensors.plain(instances), specs))
    arrays = {name: _stack_instances(specs[name], values, budget.limits.max_json_depth)
              for name, values in columns.items()}
    for name, array in arrays.items():
        budget.take(f"'instances': input '{name}'", array.shape)
    return arrays


def _split_named_instances(instances: list[Any], specs: dict[str, TensorSpec]) -> dict[str, list[Any]]:
    """Objects keyed by input name, one per instance -> each input's values in instance order."""
    first = instances[0]
    if not _is_named(first):
        raise invalid(f"instances[0] must be an object keyed by input name; the model's inputs are {_names(specs)}")
    check_input_names(first.keys(), specs, "instances[0]")
    names = first.keys()
    # Objects with instances[0]'s keys are named as it is (none can be {"b64": ...}); the checks below name the
    # instance that is not.
    if all(type(instance) is dict and instance.keys() == names for instance in instances):
        return {name: list(map(itemgetter(name), instances)) for name in names}
    for index, instance in enumerate(instances):
        if not _is_named(instance):
            raise invalid(f"instances[{index}] must be an object keyed by input name, like instances[0]")
        if instance.keys() != names:
            raise invalid(
                f"instances[{index}] has inputs {_names(instance)}, but instances[0] has {_names(first)}; "
                "every instance needs the same inputs"
            )
    return {name: [instance[name] for instance in instances] for name in names}


def _stack_instances(spec: TensorSpec, values: list[Any] | JsonNumbers, max_depth: int) -> np.ndarray:
    if not spec.shape:
        raise invalid(f"input '{spec.name}' is a scalar, so it cannot be sent in 'instances'; use 'inputs'")
    if spec.shape[0] not in (-1, len(values)):
        raise invalid(f"input '{spec.name}' takes exactly {spec.shape[0]} instances, got {len(values)}")
    if len(spec.shape) > MAX_RANK:  # numpy cannot stack the instances into one array
        raise invalid(f"input '{spec.name}' has {len(spec.shape)} dimensions; at most {MAX_RANK} are supported")
    instance_shape = spec.shape[1:]
    if spec.datatype != "BYTES":
        # Every instance at once (one conversion of the whole nested list, 4x faster for 500 rows); a batch that
        # does not convert or fit is converted instance by instance below, for the message naming the instance.
        try:
            whole = _to_array(spec, values, f"'instances': input '{spec.name}'", max_depth + 1)
        except ModelhostError:
            pass
        else:
            if len(whole.shape) == len(spec.shape) and all(e in (-1, d) for d, e in zip(whole.shape[1:],
                                                                                       instance_shape)):
                return whole
    arrays: list[np.ndarray] = []
    for index, value in enumerate(json_tensors.plain(values)):
        where = f"instances[{index}]: input '{spec.name}'"
        array = _to_array(spec, value, where, max_depth)
        _check_shape(array, instance_shape, where)
        if arrays and array.shape != arrays[0].shape:
            raise invalid(
                f"{where} has shape {format_shape(array.shape)}, but in instances[0] it has "
                f"{format_shape(arrays[0].shape)}; instances must have the same shape"
            )
        arrays.append(array)
    return np.stack(arrays)


def _decode_columns(value: Any, specs: dict[str, TensorSpec], budget: ElementBudget) -> dict[str, np.ndarray]:
    if _is_named(value):
        check_input_names(value.keys(), specs, "'inputs'")
        named = value
    elif len(specs) == 1:
        named = {next(iter(specs)): value}
    else:
        raise invalid(f"'inputs' must be an object keyed by input name; the model's inputs are {_names(specs)}")
    arrays = {}
    for name, tensor in named.items():
        spec = specs[name]
        where = f"'inputs': input '{name}'"
        array = _to_array(spec, tensor, where, budget.limits.max_json_depth)
        _check_shape(array, spec.shape, where)
        budget.take(where, array.shape)
        arrays[name] = array
    return arrays


def check_input_names(given: Collection[str], specs: Mapping[str, TensorSpec], where: str) -> None:
    """Raise INVALID_INPUT naming `where` when `given` has a name not in `specs` or lacks a required one."""
    unknown = [name for name in given if name not in specs]
    if unknown:
        raise invalid(f"{where} has unknown input(s) {_names(unknown)}; the model's inputs are {_names(specs)}")
    missing = [name for name, spec in specs.items() if name not in given and not spec.optional]
    if missing:
        raise invalid(f"{where} is missing input(s) {_names(missing)}")


def _check_shape(array: np.ndarray, expected: tuple[int, ...], where: str) -> None:
    if len(array.shape) != len(expected) or any(e not in (-1, d) for d, e in zip(array.shape, expected)):
        raise invalid(f"{where} has shape {format_shape(array.shape)}, but the model expects {format_shape(expected)}")


def _to_array(spec: TensorSpec, value: Any, where: str, max_depth: int) -> np.ndarray:
    if spec.datatype not in DATATYPE_DTYPES:
        raise invalid(f"{where} is {spec.datatype}, which cannot be sent as JSON")
    if spec.datatype == "BYTES":
        value = json_tensors.plain(value)
        check_json_depth(value, where, max_depth)
        return _bytes_array(value, where)
    return json_numbers(value, spec.datatype, where, max_depth)


def _bytes_array(value: Any, where: str) -> np.ndarray:
    elements: list[bytes] = []
    shape = _collect_bytes(value, where, elements, depth=0)
    array = np.empty(len(elements), dtype=object)
    array[:] = elements
    return array.reshape(shape)


def _collect_bytes(value: Any, where: str, elements: list[bytes], depth: int) -> tuple[int, ...]:
    """Append the strings of a nested list to `elements` in row-major order; return the list's shape."""
    if not isinstance(value, list):
        elements.append(binary_string(value, where))
        return ()
    if depth == MAX_RANK:  # deeper elsewhere than along the first items, which check_json_depth measured
        raise invalid(f"{where} is nested deeper than {MAX_RANK} lists")
    shapes = {_collect_bytes(item, where, elements, depth + 1) for item in value}
    if len(shapes) > 1:
        raise invalid(f"{where} is a ragged list; lists at the same depth must have the same length")
    return (len(value), *shapes.pop()) if shapes else (0,)


def binary_string(value: Any, where: str) -> bytes:
    """A JSON string as UTF-8, or a {"b64": ...} object's bytes; INVALID_INPUT naming `where` for anything else."""
    if isinstance(value, str):
        try:
            return value.encode("utf-8")
        except UnicodeEncodeError:
            raise invalid(f"{where} has a string that is not valid Unicode (a lone surrogate)") from None
    if not is_b64(value):
        raise invalid(f'{where} is BYTES, so its values must be strings or {{"b64": ...}}, got {_json_type(value)}')
    encoded = value["b64"]
    if isinstance(encoded, str):
        try:
            return base64.b64decode(encoded, validate=True)
        except ValueError:  # binascii.Error, or a non-ASCII string
            pass
    raise invalid(f"{where} has a 'b64' value that is not a base64 string")


def row_predictions(outputs: dict[str, np.ndarray]) -> Any:
    """The "predictions" of a row-format response: one item per batch row (orjson with OPT_SERIALIZE_NUMPY writes it).

    One output: its array (iterating it yields the rows); several: a list of {output name: row value} objects.
    """
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


def is_b64(value: Any) -> bool:
    return isinstance(value, dict) and len(value) == 1 and "b64" in value


def _is_named(value: Any) -> bool:
    """An object keyed by input name, as opposed to a value (which may be a {"b64": ...} object)."""
    return isinstance(value, dict) and not is_b64(value)


def _names(names: Collection[str]) -> str:
    return ", ".join(f"'{name}'" for name in names) or "(none)"


def _json_type(value: Any) -> str:
    return "null" if value is None else _JSON_TYPES.get(type(value), type(value).__name__)
