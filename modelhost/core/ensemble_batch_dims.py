"""Tensors passed between an ensemble and its steps where one batches and the other does not, as Triton passes them.

A tensor made without a batch dim (an input of an ensemble with max_batch_size 0, an output of a step whose model
has none) that reaches a model that batches gets a batch of 1 when its shape is the model's dims; a tensor made
with one (a batch of 1) that reaches a model or ensemble output without one loses it when its shape is not the
dims there. Otherwise it passes as it is. The load-time check (ensemble_plan.py) accepts such a pair when the dims
agree without the batch dim, or the full shapes agree.
"""

from __future__ import annotations

import numpy as np


def fitted(array: np.ndarray, batched: bool, dims: tuple[int, ...], batching: bool) -> np.ndarray:
    """`array` (made with a batch dim when `batched`) for a place of `dims` that `batching` or not (a view)."""
    if batched == batching:
        return array
    if batching:
        return array[np.newaxis] if dims_agree(dims, array.shape) else array
    if array.ndim and array.shape[0] == 1 and not dims_agree(dims, array.shape):
        return array.reshape(array.shape[1:])
    return array


def dims_agree(a: tuple[int, ...], b: tuple[int, ...]) -> bool:
    """Equal but where either is -1 (a variable dim)."""
    return len(a) == len(b) and all(x == y or -1 in (x, y) for x, y in zip(a, b, strict=True))
