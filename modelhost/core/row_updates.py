"""Row updates to a served model's table (an embedding model's), for the front-ends' update calls: the request
checked against the table, then applied off the event loop (it syncs to disk). Requests to the model do not wait
for it: an update goes beside the model's queue, not through it."""

from __future__ import annotations

import asyncio

import numpy as np

from modelhost.backends.base import RowUpdates
from modelhost.errors import ErrorKind, ModelhostError, invalid

IDS, VECTORS = "ids", "vectors"
MAX_UPDATE_ROWS = 1_000_000  # rows one update call may carry (the body limit bounds its bytes first)


def checked_rows(model: str, table: RowUpdates | None, inputs: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """The update's ids [n] and vectors [n, dim], or the INVALID_INPUT / UNSUPPORTED error naming the problem."""
    if table is None:
        raise ModelhostError(ErrorKind.UNSUPPORTED, f"model '{model}' has no table that takes row updates "
                                                    "(only embedding models do)")
    unknown = sorted(set(inputs) - {IDS, VECTORS})
    if unknown or IDS not in inputs or VECTORS not in inputs:
        raise invalid(f"an update has two inputs, '{IDS}' (INT64 [n]) and '{VECTORS}' (FP32 [n, {table.dim}])"
                      + (f"; got unknown input '{unknown[0]}'" if unknown else ""))
    ids, vectors = inputs[IDS], inputs[VECTORS]
    if ids.dtype != np.int64 or ids.ndim != 1:
        raise invalid(f"input '{IDS}' must be INT64 [n], got {ids.dtype} {list(ids.shape)}")
    if vectors.dtype != np.float32 or vectors.ndim != 2 or vectors.shape != (len(ids), table.dim):
        raise invalid(f"input '{VECTORS}' must be FP32 [{len(ids)}, {table.dim}] (one row per id), got "
                      f"{vectors.dtype} {list(vectors.shape)}")
    if len(ids) > MAX_UPDATE_ROWS:
        raise ModelhostError(ErrorKind.TOO_LARGE, f"an update carries at most {MAX_UPDATE_ROWS} rows, got {len(ids)}")
    return ids, vectors


async def apply_rows(table: RowUpdates, ids: np.ndarray, vectors: np.ndarray) -> int:
    """Apply the update on a thread; returns how many rows were new."""
    try:
        return await asyncio.to_thread(table.update, ids, vectors)
    except ValueError as exc:
        raise invalid(f"input '{VECTORS}': {exc}") from None
