"""Model directories for a multi-model endpoint: an archive fetched into a directory of its own, or a local
directory used in place, each read as a Triton layout (store/layout.py).

An archive is a TargetModel of an ArchiveStore (store/archive_store.py): read in place when the store is
local, downloaded otherwise, and unpacked within the limits (store/unpack.py), unless a copy unpacked from
it unchanged was kept on disk (store/unpacked_copies.py). Everything here blocks; callers run it in a thread.
"""

from __future__ import annotations

import shutil
import time
from dataclasses import dataclass, replace
from pathlib import Path

from modelhost.errors import not_found
from modelhost.store.archive_store import ArchiveStore, LocalArchiveStore
from modelhost.store.layout import TOOLKIT_PROGRAM, ModelLayout, find_layout
from modelhost.store.unpack import unpack_archive
from modelhost.store.unpacked_copies import UnpackedCopies


@dataclass(frozen=True, slots=True)
class FetchedModels:
    root: Path  # the models' directory (the unpacked archive, or the directory used in place)
    layout: ModelLayout
    disk_bytes: int  # what its files take on disk
    fetch_seconds: float | None  # downloading and unpacking an archive; None when neither was needed
    directory: Path  # this fetch's own files (the unpacked archive, the layout's links): removed by `release`
    stamp: str | None = None  # the archive's stamp when it was fetched; None for a directory used in place


class ArchiveModels:
    def __init__(self, archives: ArchiveStore | None, downloads: Path, max_unpacked_bytes: int,
                 max_archive_members: int, single_model_name: str,
                 copies: UnpackedCopies[FetchedModels] | None = None, program: str = TOOLKIT_PROGRAM,
                 in_place: bool = False) -> None:
        """`in_place`: a lone model file is read where it was unpacked (find_layout's `in_place`)."""
        self._archives = archives
        self._program = program  # the handler program a SageMaker PyTorch model's code/ holds
        self._copies = copies
        self._downloads = downloads
        self._max_unpacked_bytes = max_unpacked_bytes
        self._max_archive_members = max_archive_members
        self._single_model_name = single_model_name
        self._in_place = in_place

    @property
    def local(self) -> bool:
        """Whether its archives are on a local file system (a fetch reads and unpacks; it downloads nothing)."""
        return isinstance(self._archives, LocalArchiveStore)

    def fetch(self, target: str, work: Path) -> FetchedModels:
        """The archive `target` unpacked as `work`: read in place when local, else downloaded first; or the copy
        kept from an earlier fetch while the archive is unchanged."""
        if self._archives is None:
            raise not_found(f"no model store is configured to find target model '{target}' in")
        stamp = None
        if self._copies is not None:
            stamp = self._archives.stamp(target)  # before the download: a change meanwhile shows next time
            kept = self._copies.take(target, stamp)
            if kept is not None:
                return replace(kept, fetch_seconds=None)
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
        return self._read(work, work, time.monotonic() - started, stamp)

    def in_place(self, directory: Path, work: Path) -> FetchedModels:
        """A local directory of models, read where it is; `work` holds only its generated layout."""
        return self._read(directory, work, None, None)

    def release(self, target: str, fetched: FetchedModels) -> None:
        """The fetch's models are unloaded: its files are kept for a later load of the archive, or removed."""
        if self._copies is not None and fetched.stamp is not None:
            self._copies.keep(target, fetched)
        else:
            shutil.rmtree(fetched.directory, ignore_errors=True)

    def _read(self, root: Path, work: Path, fetch_seconds: float | None, stamp: str | None) -> FetchedModels:
        disk_bytes = sum(p.stat().st_size for p in root.rglob("*") if p.is_file())
        work.mkdir(parents=True, exist_ok=True)
        layout = find_layout(root, self._single_model_name, work / ".layout", program=self._program,
                             in_place=self._in_place)
        return FetchedModels(root, layout, disk_bytes, fetch_seconds, work, stamp)
