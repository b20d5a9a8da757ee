"""Model directories for a multi-model endpoint: an archive fetched into a directory of its own, or a local
directory used in place, each read as a Triton layout (store/layout.py).

An archive is a TargetModel of an ArchiveStore (store/archive_store.py): read in place when the store is
local, downloaded otherwise, and unpacked within the limits (store/unpack.py). Everything here blocks;
callers run it in a thread.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from modelhost.errors import not_found
from modelhost.store.archive_store import ArchiveStore
from modelhost.store.layout import ModelLayout, find_layout
from modelhost.store.unpack import unpack_archive


@dataclass(frozen=True, slots=True)
class FetchedModels:
    root: Path  # the models' directory (the unpacked archive, or the directory used in place)
    layout: ModelLayout
    disk_bytes: int  # what its files take on disk
    fetch_seconds: float | None  # downloading and unpacking an archive; None for a directory used in place


class ArchiveModels:
    def __init__(self, archives: ArchiveStore | None, downloads: Path, max_unpacked_bytes: int,
                 max_archive_members: int, single_model_name: str) -> None:
        self._archives = archives
        self._downloads = downloads
        self._max_unpacked_bytes = max_unpacked_bytes
        self._max_archive_members = max_archive_members
        self._single_model_name = single_model_name

    def fetch(self, target: str, work: Path) -> FetchedModels:
        """The archive `target` unpacked as `work`: read in place when local, else downloaded first."""
        if self._archives is None:
            raise not_found(f"no model store is configured to find target model '{target}' in")
        started = time.monotonic()
        archive = self._archives.local_path(target)
        downloaded = archive is None
        if archive is None:
            archive = self._archives.download(target, self._downloads)
        try:
            unpack_archive(archive, work, self._max_unpacked_bytes, self._max_archive_members)
        finally:
            if downloaded:
                archive.unlink(missing_ok=True)
        return self._read(work, work, time.monotonic() - started)

    def in_place(self, directory: Path, work: Path) -> FetchedModels:
        """A local directory of models, read where it is; `work` holds only its generated layout."""
        return self._read(directory, work, None)

    def _read(self, root: Path, work: Path, fetch_seconds: float | None) -> FetchedModels:
        disk_bytes = sum(p.stat().st_size for p in root.rglob("*") if p.is_file())
        work.mkdir(parents=True, exist_ok=True)
        layout = find_layout(root, self._single_model_name, work / ".layout")
        return FetchedModels(root, layout, disk_bytes, fetch_seconds)
