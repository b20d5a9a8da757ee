"""TorchServe model archives (tsfs §A5.1), opened as TorchServe opens them: a `.mar` (zip), a `.tar.gz` holding
`<model_name>/...` (torch-model-archiver's `tgz` format) or a directory (its `no-archive` format), each with
`MAR-INF/MANIFEST.json` (config/mar_manifest.py reads it, and the model-config YAML it names).

An archive is unpacked by unpack_archive (its limits and checks) into a directory of the caller's.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from modelhost.config.mar_manifest import MANIFEST, MarConfig, MarManifest, read_manifest, read_model_config
from modelhost.errors import invalid
from modelhost.store.paths import inside
from modelhost.store.unpack import unpack_archive


@dataclass(frozen=True, slots=True)
class MarModel:
    """An archive's model: the directory holding its files (TorchServe's model_dir), its manifest and config."""

    root: Path
    manifest: MarManifest
    config: MarConfig


def open_mar(archive: Path, unpack_to: Path, max_unpacked_bytes: int, max_members: int = 10_000) -> MarModel:
    """The model of `archive`: a directory is read in place; a file is unpacked into `unpack_to` (which must not
    exist). Blocking. Raises INVALID_INPUT (ArchiveError for a bad archive) naming the archive and the problem."""
    if archive.is_dir():
        root = archive
    else:
        unpack_archive(archive, unpack_to, max_unpacked_bytes, max_members)
        root = _model_root(unpack_to, archive)
    if not (root / MANIFEST).is_file():
        raise invalid(f"model archive {archive.name}: it has no {MANIFEST.as_posix()}; torch-model-archiver "
                      "writes one into every archive")
    manifest = read_manifest(root, archive.name)
    where = f"model archive {archive.name}: {MANIFEST.as_posix()}"
    for key, name in (("serializedFile", manifest.serialized_file), ("modelFile", manifest.model_file),
                      ("requirementsFile", manifest.requirements_file), ("configFile", manifest.config_file)):
        if name is not None and not inside(root, name, f"{where}: model.{key}").is_file():
            raise invalid(f"{where}: model.{key} names '{name}', which the archive does not hold")
    config = MarConfig()
    if manifest.config_file is not None:
        config = read_model_config(inside(root, manifest.config_file, "the manifest's configFile"), archive.name)
    return MarModel(root, manifest, config)


def _model_root(unpacked: Path, archive: Path) -> Path:
    """A tgz archive wraps everything in `<model_name>/`; a zip holds it at the top."""
    if (unpacked / MANIFEST).is_file():
        return unpacked
    entries = [entry for entry in unpacked.iterdir() if not entry.name.startswith(".")]
    if len(entries) == 1 and entries[0].is_dir() and (entries[0] / MANIFEST).is_file():
        return entries[0]
    return unpacked


