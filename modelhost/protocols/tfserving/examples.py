"""tf.Example inputs of TF Serving's classify, regress and multi-inference (tsfs §B1.4, §B2): JSON -> `Input`,
`Input` -> the batch of serialized Examples a classify or regress signature takes.

Pure functions with no I/O.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from modelhost.errors import invalid
from modelhost.protocols.tfserving import apis_pb2 as pb
from modelhost.protocols.tfserving.json_codec import binary_string, is_b64
from modelhost.types import RequestLimits


def input_from_json(document: dict[str, Any]) -> pb.Input:
    """The `Input` of a REST :classify or :regress body: `examples` (a non-empty list of objects, feature name ->
    value or list of values) and an optional `context` object, which makes it an example list with context."""
    examples = document.get("examples")
    if not isinstance(examples, list):
        raise invalid("request body must have 'examples', a list of objects keyed by feature name")
    result = pb.Input()
    if "context" in document:
        listed = result.example_list_with_context
        _fill_example(listed.context, document["context"], "'context'")
        target = listed.examples
    else:
        target = result.example_list.examples
    for index, example in enumerate(examples):
        _fill_example(target.add(), example, f"examples[{index}]")
    return result


def _fill_example(example: pb.Example, features: Any, where: str) -> None:
    if not isinstance(features, dict):
        raise invalid(f"{where} must be an object keyed by feature name")
    for name, value in features.items():
        _fill_feature(example.features.feature[name], value, f"{where} feature '{name}'")


def _fill_feature(feature: pb.Feature, value: Any, where: str) -> None:
    values = value if isinstance(value, list) else [value]
    if not values:
        raise invalid(f"{where} is an empty list; a feature needs at least one value")
    kinds = {_kind(item, where) for item in values}
    if len(kinds) > 1:
        raise invalid(f"{where} mixes {' and '.join(sorted(kinds))} values; a feature's values have one type")
    kind = kinds.pop()
    if kind == "int":
        if any(not -(2**63) <= item < 2**63 for item in values):
            raise invalid(f"{where} has an integer outside the int64 range")
        feature.int64_list.value.extend(values)
    elif kind == "float":
        feature.float_list.value.extend(values)
    else:
        feature.bytes_list.value.extend(binary_string(item, where) for item in values)


def _kind(item: Any, where: str) -> str:
    if isinstance(item, bool) or item is None:
        raise invalid(f"{where} has {str(item).lower() if item is not None else 'null'}; feature values are "
                      'numbers, strings or {"b64": ...}')
    if isinstance(item, int):
        return "int"
    if isinstance(item, float):
        return "float"
    if isinstance(item, str) or is_b64(item):
        return "string"
    raise invalid(f'{where} has a value that is not a number, a string or {{"b64": ...}}')


def serialized_examples(source: pb.Input, limits: RequestLimits) -> np.ndarray:
    """The Input's examples as a 1-D object array of serialized tf.Example bytes, what a classify or regress
    signature's "inputs" tensor takes. With a context, each is the context's bytes followed by the example's:
    parsed, the example's features are merged over the context's, as TF Serving builds them."""
    kind = source.WhichOneof("kind")
    if kind is None:
        raise invalid("Input is empty: set example_list or example_list_with_context")
    if kind == "example_list":
        examples = source.example_list.examples
        prefix = b""
    else:
        examples = source.example_list_with_context.examples
        prefix = source.example_list_with_context.context.SerializeToString()
    if not examples:
        raise invalid("Input has no examples; send at least one")
    limits.budget().take("Input examples", (len(examples),))
    array = np.empty(len(examples), dtype=object)
    array[:] = [prefix + example.SerializeToString() for example in examples]
    return array


def example_count(source: pb.Input) -> int:
    kind = source.WhichOneof("kind")
    if kind == "example_list":
        return len(source.example_list.examples)
    if kind == "example_list_with_context":
        return len(source.example_list_with_context.examples)
    return 0

