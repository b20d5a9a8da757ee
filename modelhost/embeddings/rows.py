"""How an embedding table stores one vector: its row's bytes, in the table's dtype.

- `float32`: the D values, 4 bytes each.
- `float16`: the D values, 2 bytes each (values beyond float16's range become infinite: the writer refuses them).
- `int8`: the D values quantized symmetrically per row (value = q * scale, q in -127..127), then the row's float32
  scale: D + 4 bytes. A quarter of float32's bytes, so a RAM budget caches four times the rows.

Lookups always answer float32: a row is decoded where it is read out of the cache.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

DTYPES = ("float32", "float16", "int8")
_SCALE = np.dtype("<f4")


@dataclass(frozen=True, slots=True)
class RowCodec:
    dtype: str
    dim: int

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got '{self.dtype}'")
        if self.dim < 1:
            raise ValueError(f"dim must be positive, got {self.dim}")

    @property
    def row_bytes(self) -> int:
        if self.dtype == "int8":
            return self.dim + _SCALE.itemsize
        return self.dim * np.dtype(self.dtype).itemsize

    def encode(self, vectors: np.ndarray) -> np.ndarray:
        """float32 vectors [n, dim] -> their rows, uint8 [n, row_bytes]. Raises ValueError for a wrong shape or a
        value the dtype cannot hold (NaN, infinite, beyond float16's range)."""
        vectors = np.asarray(vectors, dtype=np.float32)
        if vectors.ndim != 2 or vectors.shape[1] != self.dim:
            raise ValueError(f"vectors must have shape [n, {self.dim}], got {list(vectors.shape)}")
        if not np.isfinite(vectors).all():
            raise ValueError("vectors hold NaN or infinite values")
        if self.dtype == "float32":
            return vectors.astype("<f4", copy=False).view(np.uint8).reshape(len(vectors), self.row_bytes)
        if self.dtype == "float16":
            if len(vectors) and np.abs(vectors).max() > np.finfo(np.float16).max:
                raise ValueError(f"vectors hold values beyond float16's range (±{np.finfo(np.float16).max:g})")
            return vectors.astype("<f2").view(np.uint8).reshape(len(vectors), self.row_bytes)
        scales = np.abs(vectors).max(axis=1) / 127.0
        safe = np.where(scales > 0, scales, 1.0).astype(np.float32)
        quantized = np.clip(np.rint(vectors / safe[:, None]), -127, 127).astype(np.int8)
        rows = np.empty((len(vectors), self.row_bytes), dtype=np.uint8)
        rows[:, : self.dim] = quantized.view(np.uint8)
        rows[:, self.dim:] = scales.astype(_SCALE).view(np.uint8).reshape(-1, _SCALE.itemsize)
        return rows

    def decode(self, rows: np.ndarray) -> np.ndarray:
        """uint8 rows [n, row_bytes] -> float32 vectors [n, dim]."""
        count = len(rows)
        if self.dtype == "float32":
            return np.ascontiguousarray(rows).view("<f4").reshape(count, self.dim).astype(np.float32, copy=False)
        if self.dtype == "float16":
            return np.ascontiguousarray(rows).view("<f2").reshape(count, self.dim).astype(np.float32)
        quantized = rows[:, : self.dim].view(np.int8)
        scales = np.ascontiguousarray(rows[:, self.dim:]).view(_SCALE).reshape(count, 1)
        return quantized.astype(np.float32) * scales
