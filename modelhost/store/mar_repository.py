"""TorchServe's registered models as a Triton layout that modelhost writes: `<root>/<name>/config.pbtxt` (backend
torchserve, every version served, and the scheduling the registration chose) and `<root>/<name>/<n>/model.mar`, a
link to the archive (a `.mar` file or an unpacked archive's directory) of version n.

TorchServe's versions are free-form strings ("1.0"); each gets a number at registration that it keeps while it is
registered (protocols/torchserve/ keeps the mapping), so that one version's unregistering renumbers no other.
"""

from __future__ import annotations

import os
import shutil
import threading
from dataclasses import dataclass
from pathlib import Path

from modelhost.config.pbtxt import CONFIG_FILENAME
from modelhost.store.local import LocalStore
from modelhost.store.paths import check_model_name

ARCHIVE_LINK = "model.mar"


@dataclass(frozen=True, slots=True)
class MarVersion:
    number: int  # the version's directory, and modelhost's version of it
    archive: Path


@dataclass(frozen=True, slots=True)
class MarEntry:
    """One registered model: its versions and more of its config.pbtxt (scheduling, instances), as text."""

    name: str
    versions: tuple[MarVersion, ...]
    config: str = ""

    def config_text(self) -> str:
        return f'name: "{self.name}"\nbackend: "torchserve"\nversion_policy {{ all {{ }} }}\n{self.config}'


class MarRepository(LocalStore):
    """A LocalStore over the layout of the registered models under `root` (an empty directory of the server's)."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self._lock = threading.Lock()

    def put(self, entry: MarEntry) -> None:
        """Write (or rewrite) the model's layout; blocking. Its name is checked as a model name."""
        check_model_name(entry.name)
        with self._lock:
            directory = self.root / entry.name
            directory.mkdir(exist_ok=True)
            config = directory / CONFIG_FILENAME
            text = entry.config_text()
            if not config.exists() or config.read_text() != text:
                temporary = directory / f".{CONFIG_FILENAME}.new"
                temporary.write_text(text)
                os.replace(temporary, config)
            wanted = {str(version.number): version.archive.absolute() for version in entry.versions}
            for version_dir in directory.iterdir():
                if version_dir.is_dir() and version_dir.name not in wanted:
                    shutil.rmtree(version_dir)
            for number, archive in wanted.items():
                link = directory / number / ARCHIVE_LINK
                if link.is_symlink() and Path(os.readlink(link)) == archive:
                    continue
                link.parent.mkdir(exist_ok=True)
                if link.is_symlink():
                    link.unlink()
                link.symlink_to(archive, target_is_directory=archive.is_dir())

    def remove(self, name: str) -> None:
        """Remove the model's layout (it is no longer registered); blocking."""
        check_model_name(name)
        with self._lock:
            shutil.rmtree(self.root / name, ignore_errors=True)
