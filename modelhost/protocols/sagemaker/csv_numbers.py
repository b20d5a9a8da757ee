"""Numeric CSV bodies read by simdjson: no Python string and number per value.

A CSV body of numbers, one instance per line, is a JSON array of arrays once each line break becomes `],[` and the
whole is bracketed; simdjson parses that and copies the numbers out as one buffer (json_tensors.JsonNumbers). 500
lines of 39 FP32 values (373 KB): 2.1-3.0 ms against 11.8-18.7 ms through csv.reader's strings and their
conversion; one line of 256: 23 against 131 µs.

Only a body that reads the same both ways takes this way. Not one holding a `[` (its values could then make lists
of their own), nor one with an integer negative zero for a float input (`-0`: simdjson reads it as 0, Python's
float as -0.0; found as a `-` that is neither a negative value's sign nor an exponent's), nor one simdjson refuses
(quoted values, `nan`, `+1`, `.5`, blank lines, a byte order mark, unbalanced brackets), nor one whose lines differ
in length or hold anything but numbers of the datatype: csv_payload.py's usual way reads those, with its rules and
its messages.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import simdjson

from modelhost.protocols.byte_counts import count_after, count_byte
from modelhost.protocols.json_tensors import JsonNumbers

# Below this many bytes the usual way is as cheap: 16 FP32 values (313 B) 16 µs this way against 27 µs, 4 values
# 16 against 9-20 µs; 256 values (5 KB) 23 against 131-140 µs (a parser's setup is about 15 µs).
MIN_BODY_BYTES = 256
_MINUS = ord("-")


def read_numbers(body: bytes, dtype: np.dtype) -> np.ndarray | None:
    """The body's lines as the rows of a 2-d array of `dtype` (a numeric numpy type); None where the usual way must
    read it (see above), or where it is too small for this way to pay."""
    if dtype.kind not in "fiu" or len(body) < MIN_BODY_BYTES or b"[" in body:
        return None
    parser = simdjson.Parser()
    try:
        rows: Any = parser.parse(b"".join((b"[[", body.rstrip().replace(b"\n", b"],["), b"]]")))
    except (ValueError, RuntimeError):  # not JSON once bracketed; a number out of simdjson's range
        return None
    width = len(rows[0])
    if not width or any(len(row) != width for row in rows):
        return None
    array = JsonNumbers(parser, rows, (len(rows), width)).to_array(dtype)
    if array is None or (dtype.kind == "f" and not _signs_kept(body, array)):
        return None
    return array


def _signs_kept(body: bytes, array: np.ndarray) -> bool:
    """Whether every `-` of the body is a negative value's sign or an exponent's."""
    minuses = count_byte(body, _MINUS)
    negatives = int(np.count_nonzero(np.signbit(array)))
    return minuses == negatives or minuses == negatives + count_after(body, _MINUS, b"eE")
