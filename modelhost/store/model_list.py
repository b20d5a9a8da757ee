"""A list of models, each a directory of numbered versions anywhere on disk (TF Serving's `base_path`), served as
a Triton layout that modelhost writes and keeps in step with the disk: `<root>/<name>/config.pbtxt` (the version
policy and what else the list says) and `<root>/<name>/<version>` links to the version directories.

`list()` brings the layout up to date first, so a repository poller that lists it every few seconds sees new and
removed versions (TF Serving's --file_system_poll_wait_seconds) and changed entries (a re-read model config file)
as changes of a Triton repository: a version directory appears, a config.pbtxt changes.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from modelhost.config.pbtxt import CONFIG_FILENAME
from modelhost.digits import is_digits
from modelhost.store.local import LocalStore
from modelhost.store.paths import check_model_name

log = logging.getLogger("modelhost.store")

SAVED_MODEL_FILE = "saved_model.pb"


@dataclass(frozen=True, slots=True)
class ListedModel:
    """One model of the list. `policy` is "latest" (the newest `latest_count` versions), "all" or "specific";
    `config` is more of its config.pbtxt (scheduling, parameters), as text; `version_config` reads more of it
    from its newest version's directory (TF Serving's per-model batching_params.pbtxt), raising
    VersionConfigError for a file that cannot be used."""

    name: str
    base_path: Path
    policy: str = "latest"
    latest_count: int = 1
    specific: tuple[int, ...] = ()
    config: str = ""
    version_config: Callable[[Path], str] | None = None

    def config_text(self) -> str:
        if self.policy == "all":
            policy = "all { }"
        elif self.policy == "specific":
            policy = f"specific {{ versions: [ {', '.join(str(v) for v in self.specific)} ] }}"
        else:
            policy = f"latest {{ num_versions: {self.latest_count} }}"
        return (f'name: "{self.name}"\nplatform: "tensorflow_savedmodel"\nversion_policy {{ {policy} }}\n'
                + self.config)


class VersionConfigError(Exception):
    """A version's own configuration file that cannot be used; the message names it."""


class ModelListStore(LocalStore):
    """A LocalStore over the layout of `models` written under `root` (an empty directory of the server's own)."""

    def __init__(self, root: Path, models: Sequence[ListedModel]) -> None:
        super().__init__(root)
        self._lock = threading.Lock()
        self._models: dict[str, ListedModel] = {}
        self._problems: dict[str, str] = {}  # model -> what is wrong with its version's config (logged once)
        self.set_models(models)

    def set_models(self, models: Sequence[ListedModel]) -> None:
        """Serve these models from the next `list()` on; names are checked as model names."""
        for model in models:
            check_model_name(model.name)
        with self._lock:
            self._models = {model.name: model for model in models}

    def models(self) -> list[ListedModel]:
        with self._lock:
            return list(self._models.values())

    def list(self) -> list[str]:
        self.refresh()
        return super().list()

    def refresh(self) -> None:
        """Write the layout as the list and the disk are now (blocking: reads each base path)."""
        with self._lock:
            models = dict(self._models)
            for directory in self.root.iterdir():
                if directory.name not in models:
                    _remove_tree(directory)
            for model in models.values():
                self._write_model(self.root / model.name, model)

    def _write_model(self, directory: Path, model: ListedModel) -> None:
        """The model's layout; none of its versions while its newest version's own config cannot be used (as TF
        Serving refuses to load that version), which is logged when it changes."""
        wanted = _versions(model.base_path)
        text = model.config_text()
        problem = ""
        if model.version_config is not None and wanted:
            try:
                text += model.version_config(wanted[max(wanted, key=int)])
            except VersionConfigError as exc:
                problem, wanted = str(exc), {}
        if problem != self._problems.get(model.name, ""):
            if problem:
                log.error("model %s is not served: %s", model.name, problem)
            else:
                log.info("model %s: its version's configuration is usable again", model.name)
            self._problems[model.name] = problem
        _write_layout(directory, text, wanted)


def _write_layout(directory: Path, text: str, wanted: dict[str, Path]) -> None:
    directory.mkdir(exist_ok=True)
    config = directory / CONFIG_FILENAME
    if not config.exists() or config.read_text() != text:  # rewritten only when it changes: a reload
        temporary = directory / f".{CONFIG_FILENAME}.new"
        temporary.write_text(text)
        os.replace(temporary, config)
    for link in directory.iterdir():
        if link.is_symlink() and (link.name not in wanted or os.readlink(link) != str(wanted[link.name])):
            link.unlink()
    for name, target in wanted.items():
        if not (directory / name).is_symlink():
            (directory / name).symlink_to(target, target_is_directory=True)


def _versions(base_path: Path) -> dict[str, Path]:
    """Version number (as text, without leading zeros) -> its directory, for each that holds a SavedModel."""
    try:
        entries = list(base_path.iterdir())
    except OSError:
        return {}
    versions: dict[str, Path] = {}
    for entry in entries:
        if is_digits(entry.name) and int(entry.name) > 0 and (entry / SAVED_MODEL_FILE).is_file():
            versions[str(int(entry.name))] = entry.resolve()
    return versions


def _remove_tree(directory: Path) -> None:
    for entry in directory.iterdir():
        entry.unlink()
    directory.rmdir()
