"""What the model manager reads models from: a Triton-layout directory (store/local.py) or a repository of
model archives (store/archive_repository.py)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

from modelhost.store.local import ModelFingerprint, ModelSource


class ModelStore(Protocol):
    """The methods block (files, downloads): callers run them in a thread."""

    def list(self) -> list[str]:
        """The names of the models the store holds, sorted."""
        ...

    def fetch(self, name: str) -> ModelSource:
        """The model's directory on the local file system, ready to load. INVALID_INPUT when `name` is not a model
        name (store/paths.py), FileNotFoundError (naming the model, not a server path) when the store lacks it."""
        ...

    def fingerprint(self, name: str) -> ModelFingerprint | None:
        """What the model's files are now (polling compares two), or None when the store no longer has it."""
        ...

    def fingerprints(self, names: Iterable[str]) -> dict[str, ModelFingerprint | None]:
        """`fingerprint` of each of `names`, read together (a poll reads every loaded model's)."""
        ...

    def release(self, name: str) -> None:
        """The model left the server (unloaded, drained): what the store fetched for it may go. Blocking."""
        ...
