"""Tensors between an ensemble and steps that differ in batching (core/ensemble_batch_dims.py), as Triton's
EnsembleContext::ReshapeTensorDims moves them."""

from __future__ import annotations

import numpy as np
import pytest

from modelhost.core.ensemble_batch_dims import fitted


@pytest.mark.parametrize(("shape", "batched", "dims", "batching", "expected"), [
    ((4,), False, (4,), True, (1, 4)),  # no batch dim, the model's dims: a batch of 1
    ((4,), False, (-1,), True, (1, 4)),
    ((3, 4), False, (4,), True, (3, 4)),  # not the model's dims: taken as already batched
    ((1, 4), True, (4,), False, (4,)),  # a batch of 1 to a place without batching: the batch dim goes
    ((1, 4), True, (-1, -1), False, (1, 4)),  # already the place's dims: kept
    ((2, 4), True, (4,), False, (2, 4)),  # a batch of 2 cannot lose it
    ((1, 4), True, (4,), True, (1, 4)),  # same batching both sides: as it is
    ((4,), False, (4,), False, (4,)),
])
def test_fitted(shape: tuple[int, ...], batched: bool, dims: tuple[int, ...], batching: bool,
                expected: tuple[int, ...]) -> None:
    array = np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape)
    result = fitted(array, batched, dims, batching)
    assert result.shape == expected
    assert np.shares_memory(result, array)  # a view, never a copy
