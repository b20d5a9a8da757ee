"""Unpacked archives kept on disk once their models have left memory, as SageMaker's multi-model endpoints keep
them: a later load of the same archive, unchanged (the same stamp: size and modification time, or S3's ETag),
reuses the copy instead of downloading and unpacking it again.

The copies kept take at most `budget_bytes` on disk (`--unpacked-cache-bytes`), every file of their
directories counted as they are when kept (packages an `inference.py`'s requirements installed there
included); the one kept longest ago is deleted first. A copy in use is the loader's, not counted here:
`take` hands it over and `keep` hands it back. Thread-safe; the methods block (they measure and delete
directories).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import threading
from collections import OrderedDict
from pathlib import Path
from typing import Generic, Protocol, TypeVar


class UnpackedCopy(Protocol):
    @property
    def directory(self) -> Path: ...  # everything the copy holds on disk, deleted with it

    @property
    def stamp(self) -> str | None: ...  # the archive's stamp when it was unpacked


Copy = TypeVar("Copy", bound=UnpackedCopy)


class UnpackedCopies(Generic[Copy]):
    def __init__(self, budget_bytes: int) -> None:
        self.budget_bytes = budget_bytes
        self._lock = threading.Lock()
        # target -> its copy and the bytes its directory holds, kept longest ago first
        self._kept: OrderedDict[str, tuple[Copy, int]] = OrderedDict()
        self._bytes = 0

    @property
    def kept_bytes(self) -> int:
        return self._bytes

    def take(self, target: str, stamp: str) -> Copy | None:
        """The kept copy of `target` unpacked from the archive at `stamp`, now the caller's; None when there is
        none (a copy of another stamp is deleted: the archive changed)."""
        with self._lock:
            kept = self._kept.pop(target, None)
            if kept is not None:
                self._bytes -= kept[1]
        if kept is None:
            return None
        copy = kept[0]
        if copy.stamp == stamp and copy.directory.is_dir():
            return copy
        shutil.rmtree(copy.directory, ignore_errors=True)
        return None

    def keep(self, target: str, copy: Copy) -> None:
        """Keep an unpacked copy no load uses any more; copies over the budget are deleted, oldest first."""
        size = _disk_bytes(copy.directory)
        doomed: list[Copy] = []
        with self._lock:
            replaced = self._kept.pop(target, None)
            if replaced is not None:
                self._bytes -= replaced[1]
                doomed.append(replaced[0])
            self._kept[target] = (copy, size)
            self._bytes += size
            while self._bytes > self.budget_bytes:
                _, (oldest, oldest_size) = self._kept.popitem(last=False)
                self._bytes -= oldest_size
                doomed.append(oldest)
        for gone in doomed:
            shutil.rmtree(gone.directory, ignore_errors=True)


def _disk_bytes(directory: Path) -> int:
    """What a directory's files take (links not followed: the layout's links point into the copy itself)."""
    total = 0
    for root, _, files in os.walk(directory):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(root, name)).st_size
    return total
