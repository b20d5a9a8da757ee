"""Cutting a request of many rows into parts that run concurrently, and merging their answers in order.

The part count comes from the model's config (a part may not exceed max_batch_size; more parts than the
model has instances gain nothing) or from the caller.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from modelhost.client.errors import ClientError

DEFAULT_SPLIT_ROWS = 256  # requests of more rows are split across a model's instances


@dataclass(frozen=True, slots=True)
class BatchShape:
    """What the client reads from a model's config to split its requests."""

    max_batch_size: int  # 0: the model has no batch dimension, and its requests are never split
    instances: int

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> BatchShape:
        """From the V2 model configuration (Triton's JSON: max_batch_size, instance_group[].count)."""
        groups = config.get("instance_group") or []
        instances = sum(max(int(group.get("count", 1) or 1), 1) for group in groups) or 1
        return cls(int(config.get("max_batch_size", 0) or 0), instances)


def part_count(rows: int, shape: BatchShape, split: int | None, split_rows: int) -> int:
    """How many parts a request of `rows` rows goes in: `split` if given, else as many as the model's
    instances once the request has more than `split_rows` rows, and never parts of more than max_batch_size."""
    if shape.max_batch_size == 0 or rows <= 1:
        return 1
    needed = math.ceil(rows / shape.max_batch_size)
    if split is not None:
        wanted = split
    else:
        wanted = shape.instances if rows > split_rows else 1
    return max(1, min(rows, max(wanted, needed)))


def rows_of(inputs: Mapping[str, np.ndarray]) -> int:
    """The request's batch size: the first dimension its inputs share."""
    sizes = {array.shape[0] if array.ndim else 0 for array in inputs.values()}
    if len(sizes) != 1:
        raise ClientError(0, f"cannot split a request whose inputs have different first dimensions {sorted(sizes)}")
    return sizes.pop()


def cut(inputs: Mapping[str, np.ndarray], parts: int) -> list[dict[str, np.ndarray]]:
    """`parts` requests of near-equal row counts, in order; views, not copies."""
    rows = rows_of(inputs)
    bounds = [rows * index // parts for index in range(parts + 1)]
    return [{name: array[bounds[i] : bounds[i + 1]] for name, array in inputs.items()} for i in range(parts)]


def merge(answers: Sequence[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """The parts' outputs joined along the batch dimension, in the parts' order."""
    if len(answers) == 1:
        return answers[0]
    return {name: np.concatenate([answer[name] for answer in answers]) for name in answers[0]}
