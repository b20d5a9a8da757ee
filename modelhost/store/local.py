"""A Triton-layout model repository on the local file system."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from modelhost.digits import is_digits
from modelhost.store.paths import check_model_name


@dataclass(frozen=True, slots=True)
class ModelSource:
    """A model directory and the version directories found in it (ascending)."""

    name: str
    path: Path
    versions: tuple[int, ...]
    # Version 1's directory where it is not path/1: a lone model file's directory read in place (store/layout.py).
    version_dir: Path | None = None

    def version_path(self, version: int) -> Path:
        return self.version_dir if self.version_dir is not None else self.path / str(version)


@dataclass(frozen=True, slots=True)
class ModelFingerprint:
    """What a model directory held when it was read: a digest of its top-level files (config.pbtxt, label
    files) and one of each version directory's tree, from names, sizes and modification times."""

    config: str
    versions: dict[int, str]

    def changed_versions(self, newer: ModelFingerprint) -> set[int] | None:
        """Versions whose files differ in `newer` (new ones included); None when the config changed,
        which changes every version."""
        if newer.config != self.config:
            return None
        return {v for v, digest in newer.versions.items() if self.versions.get(v) != digest}


class LocalStore:
    """`<root>/<model>/config.pbtxt` and `<root>/<model>/<version>/...`; read-only."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def list(self) -> list[str]:
        """Model names: the directories under the root, hidden ones excepted, sorted."""
        return sorted(p.name for p in self.root.iterdir() if p.is_dir() and not p.name.startswith("."))

    def fetch(self, name: str) -> ModelSource:
        """The model directory `name`; INVALID_INPUT when `name` is not a model name (store/paths.py),
        FileNotFoundError (naming the model, not the server's path) when the repository has no such model."""
        path = self.path(name)
        if not path.is_dir():
            raise FileNotFoundError(f"the repository has no model directory '{name}'")
        return ModelSource(name, path, model_versions(path))

    def path(self, name: str) -> Path:
        """`<root>/<name>`, for a checked model name only: one entry of the root, never outside it."""
        return self.root / check_model_name(name)

    def fingerprint(self, name: str) -> ModelFingerprint | None:
        """The model directory's fingerprint (blocking: walks its files), or None when it is gone."""
        return fingerprint(self.path(name))

    def fingerprints(self, names: Iterable[str]) -> dict[str, ModelFingerprint | None]:
        """`fingerprint` of each model, in one go; None for one that cannot be read (a poll leaves it as it is)."""
        found: dict[str, ModelFingerprint | None] = {}
        for name in names:
            try:
                found[name] = self.fingerprint(name)
            except OSError:
                found[name] = None
        return found

    def release(self, name: str) -> None:
        """Nothing to do: the repository's files are read in place."""


def model_versions(path: Path) -> tuple[int, ...]:
    # Triton ignores version directories that are not numbers or that start with "0".
    return tuple(sorted(
        int(p.name) for p in path.iterdir() if p.is_dir() and is_digits(p.name) and not p.name.startswith("0")
    ))


def fingerprint(path: Path) -> ModelFingerprint | None:
    """Read with os.scandir, whose entries know their type: a walk through pathlib took 0.12 ms a model."""
    try:
        top = hashlib.blake2b(digest_size=16)
        versions: dict[int, str] = {}
        with os.scandir(path) as scan:
            entries = sorted(scan, key=lambda entry: entry.name)
        for entry in entries:
            if entry.is_dir() and is_digits(entry.name) and not entry.name.startswith("0"):
                versions[int(entry.name)] = _tree_digest(entry.path)
            elif entry.is_dir():
                top.update(f"{entry.name}/{_tree_digest(entry.path)}\0".encode())
            else:
                top.update(_file_key(entry, entry.name))
        return ModelFingerprint(top.hexdigest(), versions)
    except FileNotFoundError:
        return None


def _tree_digest(directory: str) -> str:
    """Every file under `directory` by its relative path, size and modification time; a linked directory is not
    entered (a link to a file counts as that file)."""
    keys: list[tuple[str, bytes]] = []
    _collect(directory, "", keys)
    digest = hashlib.blake2b(digest_size=16)
    for _, key in sorted(keys):
        digest.update(key)
    return digest.hexdigest()


def _collect(directory: str, prefix: str, keys: list[tuple[str, bytes]]) -> None:
    pending = [(directory, prefix)]  # a stack, not recursion: a tree of any depth is walked
    while pending:
        where, under = pending.pop()
        with os.scandir(where) as scan:
            for entry in scan:
                name = under + entry.name
                if not entry.is_dir():
                    keys.append((name, _file_key(entry, name)))
                elif not entry.is_symlink():
                    pending.append((entry.path, name + "/"))


def _file_key(entry: os.DirEntry[str], name: str) -> bytes:
    stat = entry.stat()
    return f"{name}\0{stat.st_size}\0{stat.st_mtime_ns}\0".encode()
