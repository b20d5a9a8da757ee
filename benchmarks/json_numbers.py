"""JSON numbers to tensors (modelhost/protocols/json_numbers.py), in-process: the working tree against a base revision.

    python benchmarks/json_numbers.py [--base REV] [--repeat 9]

What the V2 and TF Serving JSON codecs spend turning parsed JSON lists into arrays, on the recommender request's
shapes (500 candidates: 26 INT64 feature ids and 13 FP32 features each, as rows and flat) and on a small tensor.
The base's module is loaded from `git show REV:modelhost/protocols/json_numbers.py` beside the working tree's
(the rest of modelhost is the working tree's). Each case: the minimum over --repeat timings of a batch of calls
(the least disturbed reading on a shared machine), and the ratio new / base. Both answers are checked equal.
"""

from __future__ import annotations

import argparse
import importlib.util
import subprocess
import sys
import tempfile
import timeit
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from modelhost.protocols import json_numbers as new  # noqa: E402


def base_module(revision: str) -> ModuleType:
    source = subprocess.run(["git", "-C", str(ROOT), "show", f"{revision}:modelhost/protocols/json_numbers.py"],
                            check=True, capture_output=True, text=True).stdout
    path = Path(tempfile.mkdtemp(prefix="json-numbers-")) / "json_numbers_base.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("json_numbers_base", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def cases() -> dict[str, tuple[Any, str]]:
    rng = np.random.default_rng(0)
    return {
        "INT64 500 rows x 26": (rng.integers(0, 10**6, (500, 26)).tolist(), "INT64"),
        "INT64 13,000 flat": (rng.integers(0, 10**6, 13_000).tolist(), "INT64"),
        "FP32 500 rows x 13": (rng.random((500, 13)).tolist(), "FP32"),
        "FP32 6,500 flat": (rng.random(6_500).tolist(), "FP32"),
        "INT32 1 x 16": ([list(range(16))], "INT32"),
    }


def per_call_us(function: Any, value: Any, datatype: str, repeat: int) -> float:
    calls = 20 if isinstance(value, list) and len(value) >= 500 else 2_000
    timings = timeit.repeat(lambda: function(value, datatype, "x"), number=calls, repeat=repeat)
    return min(timings) / calls * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base", default="HEAD~1", help="the git revision to compare with")
    parser.add_argument("--repeat", type=int, default=9)
    args = parser.parse_args()
    base = base_module(args.base)
    print(f"| case | base ({args.base}) µs | new µs | new / base |\n|---|---|---|---|")
    for name, (value, datatype) in cases().items():
        expected, got = base.json_numbers(value, datatype, "x"), new.json_numbers(value, datatype, "x")
        assert expected.dtype == got.dtype and np.array_equal(expected, got), name
        before = per_call_us(base.json_numbers, value, datatype, args.repeat)
        after = per_call_us(new.json_numbers, value, datatype, args.repeat)
        print(f"| {name} | {before:.1f} | {after:.1f} | {after / before:.2f}x |", flush=True)


if __name__ == "__main__":
    main()
