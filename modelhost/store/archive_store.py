"""Where multi-model archives live: a local directory or an S3 prefix, addressed by TargetModel paths.

A target is the relative path SageMaker passes as TargetModel (e.g. "dir/model-17.tar.gz"); a store
lists the targets it holds and downloads one to a local file, which archive.unpack_archive then unpacks.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Protocol

from modelhost.errors import invalid, not_found
from modelhost.store.paths import check_relative

ARCHIVE_SUFFIX = ".tar.gz"
MAX_TARGET_LENGTH = 1024


class ArchiveStore(Protocol):
    """A place holding model archives; the methods block and are safe to call from several threads."""

    description: str  # where it is, for messages: "/models" or "s3://bucket/prefix"

    def local_path(self, target: str) -> Path | None:
        """The archive's own file when it is on a local file system (read it in place), else None."""
        ...

    def download(self, target: str, into: Path) -> Path:
        """Copy the archive `target` to a new file under `into` (temp name, then rename); return its path."""
        ...

    def list(self) -> list[str]:
        """The targets (relative paths of *.tar.gz archives) the store holds, sorted."""
        ...

    def stamp(self, target: str) -> str:
        """What identifies the archive's current content (a local file's size and modification time, an S3
        object's ETag): it changes when the archive is replaced. NOT_FOUND when it is missing."""
        ...

    def stamps(self) -> dict[str, str]:
        """Every archive `list` finds, with its `stamp`, read in one listing."""
        ...


def check_target(target: str) -> str:
    """A TargetModel checked and normalized ("./a/b.tar.gz" -> "a/b.tar.gz"); raises INVALID_INPUT otherwise.

    Rejected: empty or over 1024 characters, control characters, backslashes, a leading "/",
    empty ("a//b") or ".." components.
    """
    if not 1 <= len(target) <= MAX_TARGET_LENGTH:
        raise invalid(f"target model must be 1 to {MAX_TARGET_LENGTH} characters, got {len(target)}")
    return check_relative(target, "target model").as_posix()


class LocalArchiveStore:
    """Archives under a local directory (a mounted volume, or a test's tmp dir)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.description = str(root)

    def local_path(self, target: str) -> Path:
        source = self.root / check_target(target)
        if not source.is_file():
            raise not_found(f"model archive '{target}' not found in {self.description}")
        return source

    def download(self, target: str, into: Path) -> Path:
        source = self.local_path(target)
        return write_atomically(into, source.name, lambda path: shutil.copyfile(source, path))

    def stamp(self, target: str) -> str:
        return _stamp(self.local_path(target))

    def list(self) -> list[str]:
        return sorted(target for target, _ in self._archives())

    def stamps(self) -> dict[str, str]:
        found = {}
        for target, path in self._archives():
            with contextlib.suppress(FileNotFoundError):  # removed since it was listed
                found[target] = _stamp(path)
        return found

    def _archives(self) -> Iterator[tuple[str, Path]]:
        for path in self.root.rglob(f"*{ARCHIVE_SUFFIX}"):
            relative = path.relative_to(self.root)
            if path.is_file() and not any(part.startswith(".") for part in relative.parts):
                yield relative.as_posix(), path


def _stamp(path: Path) -> str:
    stat = path.stat()
    return f"{stat.st_size}-{stat.st_mtime_ns}"


def holds_only_archives(root: Path) -> bool:
    """A directory whose entries, hidden ones aside, are all `*.tar.gz` files (one at least): a repository of
    archives rather than a Triton layout."""
    if not root.is_dir():
        return False
    entries = [entry for entry in root.iterdir() if not entry.name.startswith(".")]
    return bool(entries) and all(entry.is_file() and entry.name.endswith(ARCHIVE_SUFFIX) for entry in entries)


def open_archive_store(location: str, endpoint_url: str | None = None) -> ArchiveStore:
    """"s3://bucket/prefix" -> S3ArchiveStore (endpoint_url for S3-compatible servers); else an existing directory."""
    if location.startswith("s3://"):
        from modelhost.store.s3 import S3ArchiveStore

        bucket, _, prefix = location[len("s3://"):].partition("/")
        if not bucket:
            raise invalid(f"archive store '{location}' names no bucket (expected s3://bucket/prefix)")
        return S3ArchiveStore(bucket, prefix, endpoint_url)
    root = Path(location)
    if not root.is_dir():
        raise invalid(f"archive store directory '{location}' does not exist")
    return LocalArchiveStore(root)


def write_atomically(into: Path, filename: str, write: Callable[[Path], object]) -> Path:
    """Run `write(temp_path)` on a hidden temp file in `into`, then rename it to `into/filename`."""
    into.mkdir(parents=True, exist_ok=True)
    fd, temp_name = tempfile.mkstemp(prefix=f".{filename}.", suffix=".part", dir=into)
    os.close(fd)
    temp = Path(temp_name)
    try:
        write(temp)
        final = into / filename
        os.replace(temp, final)
    except BaseException:
        temp.unlink(missing_ok=True)
        raise
    return final
