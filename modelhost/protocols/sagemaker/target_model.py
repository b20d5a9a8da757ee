"""A multi-model endpoint's model as the SageMaker front-end holds it (target_models.py loads them), and the limits
on the archives it comes from."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

from modelhost.core.cache_entry import CacheEntry
from modelhost.store.archive_models import FetchedModels
from modelhost.store.layout import ModelLayout


@dataclass(frozen=True, slots=True)
class TargetModel:
    key: str  # the TargetModel, or `model_name` of `POST /models`
    url: str  # where it came from, as the management API lists it
    served: dict[str, str]  # model name inside the archive -> the manager's name for it
    entry: CacheEntry
    fetched: FetchedModels | None  # its files; None for a model the manager loaded from its store (repository API)

    @property
    def root(self) -> Path | None:
        """The model's directory (the unpacked archive): what inference.py's model_fn gets."""
        return None if self.fetched is None else self.fetched.root

    @property
    def layout(self) -> ModelLayout | None:
        return None if self.fetched is None else self.fetched.layout

    @property
    def work_dir(self) -> Path | None:
        """Its own files (the unpacked archive, its layout's links)."""
        return None if self.fetched is None else self.fetched.directory


Hook = Callable[[TargetModel], Awaitable[None]]


@dataclass(frozen=True, slots=True)
class ArchiveLimits:
    max_unpacked_bytes: int
    max_archive_members: int
    unpacked_cache_bytes: int = 0  # what the unpacked archives of unloaded models may keep on disk (0: none kept)
