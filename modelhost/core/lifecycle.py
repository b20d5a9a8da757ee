"""Model version states, named as Triton's repository index reports them."""

from __future__ import annotations

import enum


class ModelState(enum.Enum):
    LOADING = "LOADING"
    READY = "READY"
    UNAVAILABLE = "UNAVAILABLE"
    UNLOADING = "UNLOADING"
