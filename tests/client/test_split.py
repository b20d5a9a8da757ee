"""Splitting a request into parts and merging their answers (no server)."""

from __future__ import annotations

import numpy as np
import pytest

from modelhost.client.errors import ClientError
from modelhost.client.split import BatchShape, cut, merge, part_count, rows_of


def test_config_gives_batch_size_and_instances() -> None:
    config = {"max_batch_size": 64, "instance_group": [{"count": 2, "kind": "KIND_CPU"}, {"count": 3}]}
    assert BatchShape.from_config(config) == BatchShape(64, 5)
    assert BatchShape.from_config({"max_batch_size": 8}) == BatchShape(8, 1)
    assert BatchShape.from_config({}) == BatchShape(0, 1)


@pytest.mark.parametrize(("rows", "shape", "split", "expected"), [
    (500, BatchShape(1024, 1), None, 1),       # one instance, fits: one part
    (500, BatchShape(1024, 4), None, 4),       # above the threshold: one part per instance
    (100, BatchShape(1024, 4), None, 1),       # below it: whole
    (2000, BatchShape(1024, 1), None, 2),      # past max_batch_size: as many parts as needed
    (2000, BatchShape(1024, 1), 1, 2),         # fewer parts than the server could take: enough
    (500, BatchShape(1024, 1), 10, 10),        # asked
    (3, BatchShape(1024, 1), 10, 3),           # never more parts than rows
    (500, BatchShape(0, 4), 10, 1),            # no batch dimension: never
    (500, BatchShape(64, 1), 2, 8),            # asked too few for max_batch_size: enough
])
def test_part_count(rows: int, shape: BatchShape, split: int | None, expected: int) -> None:
    assert part_count(rows, shape, split, split_rows=256) == expected


def test_cut_and_merge_restore_the_request_in_order() -> None:
    rows = 503
    inputs = {"a": np.arange(rows * 3, dtype=np.float32).reshape(rows, 3),
              "b": np.arange(rows, dtype=np.int64).reshape(rows, 1)}
    pieces = cut(inputs, 7)
    assert sum(len(p["a"]) for p in pieces) == rows
    assert max(len(p["a"]) for p in pieces) - min(len(p["a"]) for p in pieces) <= 1
    assert all(np.shares_memory(p["a"], inputs["a"]) for p in pieces)  # views, not copies
    merged = merge(pieces)
    for name in inputs:
        np.testing.assert_array_equal(merged[name], inputs[name])


def test_inputs_with_different_batch_sizes_are_not_split() -> None:
    with pytest.raises(ClientError, match="different first dimensions"):
        rows_of({"a": np.zeros((4, 2)), "b": np.zeros((5, 2))})
