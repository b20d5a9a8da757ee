"""A Triton-layout model repository on the local file system."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True, slots=True)
class ModelSource:
    """A model directory and the version directories found in it (ascending)."""

    name: str
    path: Path
    versions: tuple[int, ...]


class LocalStore:
    """`<root>/<model>/config.pbtxt` and `<root>/<model>/<version>/...`; read-only."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def list(self) -> list[str]:
        """Model names: the directories under the root, hidden ones excepted, sorted."""
        return sorted(p.name for p in self.root.iterdir() if p.is_dir() and not p.name.startswith("."))

    def fetch(self, name: str) -> ModelSource:
        path = self.root / name
        if not path.is_dir():
            raise FileNotFoundError(f"model directory {path} does not exist")
        # Triton ignores version directories that are not numbers or that start with "0".
        versions = sorted(
            int(p.name) for p in path.iterdir() if p.is_dir() and p.name.isdigit() and not p.name.startswith("0")
        )
        return ModelSource(name, path, tuple(versions))
