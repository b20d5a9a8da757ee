"""JSON request bodies whose tensors go from the parser's view straight into arrays, with no Python number each.

orjson builds a Python object per number (500 candidates x 39 features: 19,500 of them) and the codecs then walk
them into an array. simdjson parses the body into its own tape and copies a homogeneous numeric array out of it as a
buffer; this module hands the codecs such arrays as `JsonNumbers` wherever a tensor's data may be (`TensorPath`s)
and everything else as the plain Python values orjson would give.

The fast way takes only what it can prove is an array of the same shape the codecs' own conversion would make: one
list of numbers, or a list of lists of one length each. Anything else (ragged lists, deeper nesting, strings,
booleans) is converted as a whole to Python lists and takes the codecs' usual way, so their rules and error
messages hold unchanged. The proof of "no list inside the rows": every `[` byte of the body opens a list unless a
string holds it, so when no string of the document holds one, the body's `[` count is the number of lists; the
converted parts' lists plus each `JsonNumbers`' own (1 and 1 + rows) must add up to it.
"""

from __future__ import annotations

from typing import Any, Literal

import numpy as np
import simdjson

from modelhost.protocols.byte_counts import count_byte

# Below this many bytes a body holds too few numbers for the way in to pay (orjson's parse is the cheaper one).
MIN_BODY_BYTES = 8 * 1024
ANY = None  # in a TensorPath: any key of an object, any index of a list
# A tensor of more values than this that is not numbers sends the body orjson's way (500 strings: 1.33x the time
# through simdjson's conversion; 20,000 booleans 1.90x); fewer, beside numeric tensors, are converted here.
_FEW_VALUES = 64
_OPEN_BRACKET = ord("[")

TensorPath = tuple[str | None, ...]
_NUMBERS = (int, float)
_BUFFER_TYPES: dict[str, tuple[Literal["d", "i", "u"], type[np.generic]]] = {
    "f": ("d", np.float64), "i": ("i", np.int64), "u": ("u", np.uint64),
}


class JsonNumbers:
    """A list of JSON numbers (rank 1) or of equal-length lists of them (rank 2), still in the parser's tape."""

    __slots__ = ("_array", "_parser", "shape")

    def __init__(self, parser: simdjson.Parser, array: simdjson.Array, shape: tuple[int, ...]) -> None:
        self._parser = parser  # the tape the array points into lives as long as its parser
        self._array = array
        self.shape = shape

    def __len__(self) -> int:
        return self.shape[0]

    def as_list(self) -> list[Any]:
        """The values as orjson would have parsed them."""
        return self._array.as_list()

    def to_array(self, dtype: np.dtype) -> np.ndarray | None:
        """The values as an array of `dtype` (a numeric numpy type), or None where they are not all numbers of it:
        a non-number, an integer datatype given a fraction, a value out of its range. The caller then converts
        `as_list()` its usual way, which names the problem."""
        if dtype.kind not in _BUFFER_TYPES:
            return None
        of_type, parsed_type = _BUFFER_TYPES[dtype.kind]
        try:
            flat = np.frombuffer(self._array.as_buffer(of_type=of_type), dtype=parsed_type)
        except (TypeError, ValueError):  # simdjson: a value of another type, or out of int64 / uint64's range
            return None
        if dtype.kind != "f" and dtype != parsed_type and flat.size:
            limits = np.iinfo(dtype)
            if flat.min() < limits.min or flat.max() > limits.max:
                return None
        return flat.astype(dtype, copy=False).reshape(self.shape)


def load(body: bytes, tensor_paths: tuple[TensorPath, ...]) -> Any | None:
    """The JSON value of `body` with the numeric arrays at `tensor_paths` as JsonNumbers; None where the caller
    should parse it its usual way: a small body, or one simdjson refuses (the usual way then names the problem, or
    takes what only it accepts, such as TF Serving's bare NaN)."""
    if len(body) < MIN_BODY_BYTES:
        return None
    parser = simdjson.Parser()
    walk = _Walk(parser, tensor_paths)
    try:
        document = walk.value(parser.parse(body), ())
    except (ValueError, RuntimeError, _Unproven):  # simdjson: invalid JSON (ValueError), a big integer (RuntimeError)
        return None
    if walk.tensors and not walk.lists_are(count_byte(body, _OPEN_BRACKET)):
        return None  # a list may hide inside a tensor's rows: no proof, so the usual way
    return document


class _Unproven(Exception):
    """The document is not what the fast way can take as the usual way would."""


class _Walk:
    """simdjson's document -> Python values, tensors left as JsonNumbers; counts the lists it makes."""

    def __init__(self, parser: simdjson.Parser, tensor_paths: tuple[TensorPath, ...]) -> None:
        self._parser = parser
        self._paths = tensor_paths
        self.tensors = 0
        self._lists = 0
        self._converted: list[Any] = []  # counted only where a tensor needs the proof

    def value(self, value: Any, path: tuple[str | int, ...]) -> Any:
        if isinstance(value, simdjson.Object):
            if self._leads_to_tensor(path):
                keys = list(value)  # items() would convert the values
                walked = {key: self.value(value[key], (*path, key)) for key in keys}
                if len(walked) != len(keys):
                    raise _Unproven  # a key given twice: simdjson's lookup finds the first, orjson keeps the last
                self._converted.extend(keys)
                return walked
            return self._keep(value.as_dict())
        if isinstance(value, simdjson.Array):
            if self._is_tensor(path):
                numbers = self._numbers(value)
                if numbers is not None:
                    self.tensors += 1
                    self._lists += 1 + (numbers.shape[0] if len(numbers.shape) == 2 else 0)
                    return numbers
                if not (len(value) and isinstance(value[0], simdjson.Object)):
                    if len(value) > _FEW_VALUES:
                        raise _Unproven  # strings or booleans: orjson makes their Python objects faster
                    return self._keep(value.as_list())  # a tensor's own lists: JsonNumbers only at its top
            if self._leads_to_tensor(path):  # objects at a tensor's path may hold tensors (V2 "inputs")
                self._lists += 1
                return [self.value(item, (*path, index)) for index, item in enumerate(value)]
            return self._keep(value.as_list())
        return self._keep(value)

    def _numbers(self, array: simdjson.Array) -> JsonNumbers | None:
        if not len(array):
            return None
        first: Any = array[0]
        if type(first) in _NUMBERS:
            return JsonNumbers(self._parser, array, (len(array),))
        if not isinstance(first, simdjson.Array) or not len(first):
            return None
        corner: Any = first[0]
        if type(corner) not in _NUMBERS:
            return None
        rows: Any = array
        try:
            widths = {len(row) for row in rows}
        except TypeError:  # a number beside the rows
            return None
        if len(widths) != 1:
            return None
        return JsonNumbers(self._parser, array, (len(array), widths.pop()))

    def _keep(self, value: Any) -> Any:
        self._converted.append(value)
        return value

    def lists_are(self, brackets: int) -> bool:
        """Whether the document holds `brackets` lists, every one of them counted: no string holds a `[`."""
        lists = self._lists
        pending = self._converted
        while pending:
            item = pending.pop()
            if isinstance(item, str):
                if "[" in item:
                    return False
            elif isinstance(item, list):
                lists += 1
                pending.extend(item)
            elif isinstance(item, dict):
                pending.extend(item)
                pending.extend(item.values())
        return lists == brackets

    def _is_tensor(self, path: tuple[str | int, ...]) -> bool:
        return any(_matches(pattern, path) for pattern in self._paths if len(pattern) == len(path))

    def _leads_to_tensor(self, path: tuple[str | int, ...]) -> bool:
        return any(_matches(pattern[: len(path)], path) for pattern in self._paths if len(pattern) > len(path))


def _matches(pattern: TensorPath, path: tuple[str | int, ...]) -> bool:
    return all(want is ANY or want == step for want, step in zip(pattern, path))


def plain(value: Any) -> Any:
    """`value` with a JsonNumbers at its top as the Python lists it stands for."""
    return value.as_list() if isinstance(value, JsonNumbers) else value
