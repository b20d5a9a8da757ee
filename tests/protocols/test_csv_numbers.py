"""SageMaker CSV bodies of numbers read by simdjson (csv_numbers.py) against csv.reader's usual way.

Each generated body is decoded both ways, the fast way enabled for any size and the usual way alone: the arrays
must be equal bit for bit (-0.0 apart from 0.0), or the errors the same. Bodies mix what reads the same both ways
with what must not take the fast way: integer negative zeros, exponents, quoted values, `nan`, `+1`, `.5`, blank
lines, `\\r\\n`, a byte order mark, brackets, ragged lines, values out of an integer type's range.
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from modelhost.errors import ModelhostError
from modelhost.protocols.sagemaker import csv_numbers, csv_payload
from modelhost.protocols.sagemaker.csv_payload import decode_csv
from modelhost.types import TensorSpec

DATATYPES = ["FP32", "FP64", "FP16", "INT8", "INT32", "INT64", "UINT8", "UINT64"]
ODD = ["-0", "0", "-0.0", "1e-05", "-2.5E-3", "3e+2", '"1.5"', "nan", "inf", "+1", ".5", "1.", "[1", "]", "1e400",
       "300", "-129", "18446744073709551615", "  7 ", "\t-4"]


def value(rng: random.Random, datatype: str) -> str:
    roll = rng.random()
    if roll < 0.01:
        return rng.choice(ODD)
    if datatype.startswith("FP") and roll < 0.7:
        return repr(rng.uniform(-3, 3)) if roll < 0.5 else repr(float(np.float32(rng.gauss(0, 1e-4))))
    return str(rng.randint(-3, 120) if not datatype.startswith("UINT") else rng.randint(0, 200))


def body_of(seed: int, datatype: str) -> tuple[bytes, int]:
    rng = random.Random(seed)
    rows, width = rng.randint(1, 40), rng.randint(1, 6)
    lines = []
    for _ in range(rows):
        count = width + (rng.choice([-1, 1]) if rng.random() < 0.02 else 0)
        lines.append(",".join(value(rng, datatype) for _ in range(max(count, 1))))
        if rng.random() < 0.02:
            lines.append("")
    ending = "\r\n" if rng.random() < 0.2 else "\n"
    text = ending.join(lines) + (ending if rng.random() < 0.5 else "")
    prefix = rng.choice(["\ufeff", "\n", " \n", ""]) if rng.random() < 0.05 else ""  # a BOM, a blank first line
    return (prefix + text).encode(), width


def outcome(body: bytes, spec: TensorSpec) -> Any:
    try:
        array = decode_csv(body, spec)
    except ModelhostError as error:
        return ("error", error.kind, str(error))
    return array.dtype.str, array.shape, array.tobytes()


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1), datatype=st.sampled_from(DATATYPES))
def test_a_csv_body_decodes_the_same_both_ways(seed: int, datatype: str) -> None:
    body, width = body_of(seed, datatype)
    spec = TensorSpec("x", datatype, (-1, width))
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(csv_numbers, "MIN_BODY_BYTES", 0)
        fast = outcome(body, spec)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(csv_payload, "read_numbers", lambda body, dtype: None)
        usual = outcome(body, spec)
    assert fast == usual


def test_a_recommender_batch_takes_the_fast_way_with_its_signs() -> None:
    rng = np.random.default_rng(5)
    rows = rng.standard_normal((500, 39)).astype(np.float32) * np.float32(1e-3)  # negatives, and exponents like 1e-05
    text = "\n".join(",".join(repr(float(v)) for v in row) for row in rows) + "\n"
    assert "e-" in text and "-" in text
    array = csv_numbers.read_numbers(text.encode(), np.dtype(np.float32))
    assert array is not None and array.tobytes() == rows.tobytes()
    assert decode_csv(text.encode(), TensorSpec("x", "FP32", (-1, 39))).tobytes() == rows.tobytes()


def test_an_integer_negative_zero_takes_the_usual_way() -> None:
    lines = ["1.5,2.5,3.5"] * 1000 + ["-1e-05,-0,4.5"]
    body = "\n".join(lines).encode()
    assert csv_numbers.read_numbers(body, np.dtype(np.float32)) is None
    array = decode_csv(body, TensorSpec("x", "FP32", (-1, 3)))
    assert np.signbit(array[-1, 1]) and array[-1, 1] == 0
    assert csv_numbers.read_numbers(body, np.dtype(np.int64)) is None  # 1.5 is no integer: the usual way's error


def test_brackets_in_values_take_the_usual_way() -> None:
    """Balanced brackets would read as lists of their own (1 and [2,3] flattened to three numbers); the usual way
    refuses the value."""
    body = "\n".join(["1,[2,3]"] * 2000).encode()
    assert csv_numbers.read_numbers(body, np.dtype(np.float32)) is None
    with pytest.raises(ModelhostError, match=r"\[2"):
        decode_csv(body, TensorSpec("x", "FP32", (-1, -1)))


def test_an_error_after_a_blank_first_line_names_the_line_the_usual_way_does() -> None:
    body = ("\n" + "1.5,2.5,3.5\n" * 200).encode()
    with pytest.raises(ModelhostError, match="line 2 has 3 values"):
        decode_csv(body, TensorSpec("x", "FP32", (-1, 4)))
