"""A TorchServe model store: the archives `load_models` names at start, and an archive a registration names."""

from __future__ import annotations

import os
from pathlib import Path

from modelhost.protocols.torchserve.config_properties import TorchServeConfig
from modelhost.protocols.torchserve.errors import TorchServeError

STORE_ARCHIVE_SUFFIXES = (".mar", ".tar.gz", ".model")  # the files of a model store TorchServe takes as archives


def startup_archives(config: TorchServeConfig) -> list[tuple[str | None, str]]:
    """(name or None for the manifest's, archive) of each model `load_models` names: `all` is every archive of the
    model store (`.mar`, `.tar.gz`, `.model` files and directories), in name order."""
    if any(entry.lower() == "all" for entry in config.load_models):
        if config.model_store is None:
            return []
        return [(None, entry.name) for entry in sorted(config.model_store.iterdir())
                if not entry.name.startswith(".") and (
                    entry.is_dir() or entry.name.endswith(STORE_ARCHIVE_SUFFIXES))]
    archives: list[tuple[str | None, str]] = []
    for entry in config.load_models:
        name, separator, url = entry.partition("=")
        archives.append((name, url) if separator else (None, entry))
    return archives


def archive_in_store(store: Path | None, url: str) -> Path:
    """An archive the model store holds (tsfs §A2.1): a `.mar` file or archive directory named directly in it,
    by its name or its full path (optionally `file://`); no subfolders."""
    if store is None:
        raise TorchServeError(400, "ModelException", "no model store is set (--model-store or model_store): archives "
                                                     "are registered from it")
    name = url.removeprefix("file://")
    if os.path.isabs(name):
        if Path(name).parent != store.absolute():
            raise TorchServeError(400, "ModelException", f"{Path(name).name} is not in the model store")
        name = Path(name).name
    if not name or "/" in name or name in (".", ".."):
        raise TorchServeError(400, "ModelException", f"'{url}' is not an archive of the model store (no subfolders)")
    path = store / name
    if not path.exists():
        raise TorchServeError(404, "ModelNotFoundException", f"Model not found in model store: {name}")
    return path
