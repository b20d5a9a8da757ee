"""JSON numbers and booleans -> a numpy array of a V2 datatype, shared by the V2 and TF Serving JSON codecs.

Rules, the same for every protocol: BOOL takes true/false only; integer datatypes take JSON integers only
(not 1.0, not true) within the datatype's range, exact up to 64 bits; float datatypes take any JSON number.
"""

from __future__ import annotations

from itertools import chain
from typing import Any

import numpy as np

from modelhost.errors import invalid
from modelhost.protocols.json_tensors import JsonNumbers
from modelhost.types import DATATYPE_DTYPES, DEFAULT_LIMITS, check_json_depth

# numpy kinds of the parsed values each target kind accepts, and how a message names them.
_ACCEPTED_KINDS = {"b": "b", "i": "iu", "u": "iu", "f": "iuf"}  # integer kinds: _integers
_KIND_WORDS = {"b": "true/false", "f": "numbers"}
DIRECT_MIN_ROWS = 16


def json_numbers(value: Any, datatype: str, where: str, max_depth: int = DEFAULT_LIMITS.max_json_depth) -> np.ndarray:
    """`value` (a JSON number, boolean or nested list of them, or JsonNumbers) as an array of `datatype`.

    `datatype` is a V2 name other than BYTES; `where` names the field in error messages ("input 'x'").
    Raises ModelhostError(INVALID_INPUT) for ragged lists, lists nested deeper than `max_depth`, values of the
    wrong JSON type and integers out of range.
    """
    dtype = DATATYPE_DTYPES[datatype]
    if dtype.kind not in _ACCEPTED_KINDS:
        raise ValueError(f"datatype {datatype} is not numeric")
    if isinstance(value, JsonNumbers):
        array = value.to_array(dtype) if len(value.shape) <= max_depth else None
        if array is not None:
            return array
        value = value.as_list()
    check_json_depth(value, where, max_depth)
    if dtype.kind in "iu":
        return _integers(value, dtype, datatype, where)
    try:
        array = np.asarray(value)
    except ValueError:  # numpy refuses inhomogeneous nesting
        raise invalid(f"{where} is a ragged list; lists at the same depth must have the same length") from None
    if array.size == 0:
        return array.astype(dtype)
    if array.dtype.kind not in _ACCEPTED_KINDS[dtype.kind]:
        raise invalid(f"{where} is {datatype}, so its data must be {_KIND_WORDS[dtype.kind]}")
    return array.astype(dtype, copy=False)


def _integers(value: Any, dtype: np.dtype, datatype: str, where: str) -> np.ndarray:
    # As Python ints every 64-bit value stays exact, and the set of the elements' types keeps 1.0 and true out of
    # integer tensors (one C-level pass: 3x faster than checking each element in Python); numpy's conversion from
    # Python ints refuses out-of-range values. A list nested as an array is flattened and converted directly
    # (0.73-0.77x the time of the object array's way below for 13,000 integers, flat or in 500 rows:
    # benchmarks/json_numbers.py); anything else takes that way, which tells ragged lists from wrong types. So do
    # lists of fewer than DIRECT_MIN_ROWS at the top, where the way in costs more than it saves (16 integers in
    # one row: 3.6 against 3.3 µs).
    rectangular = _rectangular(value)
    if rectangular is not None:
        flat, shape = rectangular
        if set(map(type, flat)) == {int}:
            try:
                return np.fromiter(flat, dtype, count=len(flat)).reshape(shape)
            except OverflowError:
                raise invalid(f"{where} has values outside the range of {datatype}") from None
    values = np.asarray(value, dtype=object)
    kinds = set(map(type, values.reshape(-1).tolist()))
    if not kinds <= {int}:
        if list in kinds:  # lists as elements: numpy met inhomogeneous nesting
            raise invalid(f"{where} is a ragged list; lists at the same depth must have the same length")
        raise invalid(f"{where} is {datatype}, so its data must be integers")
    try:
        return values.astype(dtype)
    except OverflowError:
        raise invalid(f"{where} has values outside the range of {datatype}") from None


def _rectangular(value: Any) -> tuple[list[Any], tuple[int, ...]] | None:
    """A list of at least DIRECT_MIN_ROWS nested as an array is (each list at a depth as long as the others),
    flattened, and its shape; None for anything else. Its elements are not checked here: a string or a list among
    them is not an integer, and the caller's type check sends it the general way."""
    if type(value) is not list or len(value) < DIRECT_MIN_ROWS:
        return None
    flat, shape = value, [len(value)]
    while type(flat[0]) is list:
        width = len(flat[0])
        try:
            if not width or set(map(len, flat)) != {width}:
                return None
        except TypeError:  # a number beside the lists
            return None
        shape.append(width)
        flat = list(chain.from_iterable(flat))
    return flat, tuple(shape)
