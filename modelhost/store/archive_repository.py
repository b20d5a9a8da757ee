"""A model repository of archives: `<name>.tar.gz` at the top of an archive store (a directory or an S3
prefix), one model per archive, served as model `<name>` with every model control mode.

An archive holds a model in any layout store/layout.py reads (a Triton model directory, its versions, a
single model file, a SageMaker model.tar.gz). It is fetched (read in place when local, downloaded
otherwise) and unpacked within the limits when the model loads, and fetched again only when the
archive changed: its stamp (size and modification time, or S3's ETag) is the model's fingerprint, so
polling reloads a replaced archive. The unpacked copy a reload replaces is removed at the fetch after
next (a reload's old version may still be finishing its requests from it), and every copy once the model
is unloaded.
"""

from __future__ import annotations

import itertools
import shutil
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from modelhost.errors import ErrorKind, ModelhostError, invalid
from modelhost.store.archive_models import ArchiveModels
from modelhost.store.archive_store import ARCHIVE_SUFFIX, ArchiveStore
from modelhost.store.local import ModelFingerprint, ModelSource, model_versions
from modelhost.store.paths import check_model_name, name_problem


@dataclass(frozen=True, slots=True)
class _Fetched:
    stamp: str
    source: ModelSource
    directory: Path  # the unpacked archive and its layout, this fetch's own


class ArchiveRepository:
    """The ModelStore of an ArchiveStore's top-level archives. Thread-safe; the methods block."""

    def __init__(self, archives: ArchiveStore, work_dir: Path, max_unpacked_bytes: int,
                 max_archive_members: int) -> None:
        self.archives = archives
        self._work_dir = work_dir
        self._max_unpacked_bytes = max_unpacked_bytes
        self._max_archive_members = max_archive_members
        self._lock = threading.Lock()
        self._fetched: dict[str, list[_Fetched]] = {}  # name -> its fetches, newest last (two at most)
        self._slots = itertools.count()

    def list(self) -> list[str]:
        """Model names: the top-level archives' names without the suffix, where they are model names."""
        names = (target[: -len(ARCHIVE_SUFFIX)] for target in self.archives.list() if "/" not in target)
        return sorted(name for name in names if name_problem(name) is None)

    def fetch(self, name: str) -> ModelSource:
        stamp = self._stamp(check_model_name(name))
        if stamp is None:
            raise FileNotFoundError(f"the repository has no model archive '{name}{ARCHIVE_SUFFIX}'")
        with self._lock:
            fetches = self._fetched.get(name, [])
            if fetches and fetches[-1].stamp == stamp and fetches[-1].directory.is_dir():
                return fetches[-1].source
            directory = self._work_dir / "models" / name / str(next(self._slots))
        fetched = _Fetched(stamp, self._unpack(name, directory), directory)
        with self._lock:
            fetches = [*self._fetched.get(name, []), fetched]
            self._fetched[name] = fetches[-2:]
        for stale in fetches[:-2]:
            shutil.rmtree(stale.directory, ignore_errors=True)
        return fetched.source

    def release(self, name: str) -> None:
        """The model is unloaded: its unpacked copies go (a later load fetches it again)."""
        with self._lock:
            fetches = self._fetched.pop(name, [])
        for fetched in fetches:
            shutil.rmtree(fetched.directory, ignore_errors=True)

    def fingerprint(self, name: str) -> ModelFingerprint | None:
        stamp = self._stamp(check_model_name(name))
        return None if stamp is None else ModelFingerprint(stamp, {})

    def fingerprints(self, names: Iterable[str]) -> dict[str, ModelFingerprint | None]:
        """Each model's fingerprint from one listing of the store (one request to S3, not one per archive)."""
        stamps = self.archives.stamps()
        found = {}
        for name in names:
            stamp = stamps.get(check_model_name(name) + ARCHIVE_SUFFIX)
            found[name] = None if stamp is None else ModelFingerprint(stamp, {})
        return found

    def _stamp(self, name: str) -> str | None:
        try:
            return self.archives.stamp(name + ARCHIVE_SUFFIX)
        except ModelhostError as exc:
            if exc.kind is ErrorKind.NOT_FOUND:
                return None
            raise

    def _unpack(self, name: str, directory: Path) -> ModelSource:
        target = name + ARCHIVE_SUFFIX
        models = ArchiveModels(self.archives, self._work_dir / "downloads", self._max_unpacked_bytes,
                               self._max_archive_members, name)
        try:
            layout = models.fetch(target, directory / "files").layout
            if len(layout.models) != 1:
                found = ", ".join(layout.models) or "none"
                raise invalid(f"model archive '{target}' holds {len(layout.models)} models ({found}): a repository "
                              "of archives serves one model per archive (--multi-model serves archives of several)")
        except BaseException:
            shutil.rmtree(directory, ignore_errors=True)
            raise
        path = layout.repository / layout.models[0]
        return ModelSource(name, path, model_versions(path))
