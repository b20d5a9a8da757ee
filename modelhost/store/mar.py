"""TorchServe model archives (tsfs §A5.1), opened as TorchServe opens them: a `.mar` (zip), a `.tar.gz` holding
`<model_name>/...` (torch-model-archiver's `tgz` format) or a directory (its `no-archive` format), each with
`MAR-INF/MANIFEST.json` (config/mar_manifest.py reads it, and the model-config YAML it names).

An archive is unpacked by unpack_archive (its limits and checks) into a directory of the caller's.
"""

from __future__ import annotations

import gzip
import tarfile
import zipfile
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from modelhost.config.mar_manifest import (
    MANIFEST,
    MarConfig,
    MarManifest,
    parse_manifest,
    parse_model_config,
    read_manifest,
    read_model_config,
)
from modelhost.errors import invalid
from modelhost.store.paths import check_relative, inside
from modelhost.store.unpack import unpack_archive

MAX_SETTINGS_BYTES = 1 << 20  # a manifest or model-config YAML larger than this is no TorchServe archive's
MAX_KEPT_BYTES = 32 << 20  # of a tgz archive's small files, read while looking for those two


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




def read_mar_settings(archive: Path) -> tuple[MarManifest, MarConfig]:
    """The manifest and model-config YAML of `archive` (any format open_mar opens), read in place: nothing is
    unpacked to disk. Blocking; INVALID_INPUT naming the archive for what open_mar would refuse in them."""
    if archive.is_dir():
        manifest = read_manifest(archive, archive.name)
        if manifest.config_file is None:
            return manifest, MarConfig()
        return manifest, read_model_config(inside(archive, manifest.config_file, "the manifest's configFile"),
                                           archive.name)
    try:
        members = _zip_members if zipfile.is_zipfile(archive) else _tar_members
        return members(archive)
    except (zipfile.BadZipFile, tarfile.TarError, zlib.error, EOFError, OSError) as exc:
        raise invalid(f"model archive {archive.name}: corrupt, truncated or not a zip or tar.gz file "
                      f"({str(exc) or type(exc).__name__})") from None


def _zip_members(archive: Path) -> tuple[MarManifest, MarConfig]:
    with zipfile.ZipFile(archive) as zip_file:
        def read(name: str) -> bytes | None:
            try:
                info = zip_file.getinfo(name)
            except KeyError:
                return None
            if info.file_size > MAX_SETTINGS_BYTES:
                raise invalid(f"model archive {archive.name}: {name} is larger than {MAX_SETTINGS_BYTES} bytes")
            return zip_file.read(info)

        return _settings(archive, "", read)


def _tar_members(archive: Path) -> tuple[MarManifest, MarConfig]:
    """torch-model-archiver's tgz format: everything under `<model_name>/`; the stream is read once."""
    wanted: dict[str, bytes] = {}  # the small files, one of which the manifest may name as its configFile
    kept = 0
    with open(archive, "rb") as raw:
        stream = gzip.GzipFile(fileobj=raw, mode="rb") if raw.read(2) == b"\x1f\x8b" else raw
        raw.seek(0)
        with tarfile.open(fileobj=stream, mode="r|") as tar:
            for member in tar:
                parts = PurePosixPath(member.name).parts
                if member.isreg() and len(parts) >= 2 and member.size <= MAX_SETTINGS_BYTES and (
                        kept + member.size <= MAX_KEPT_BYTES or parts[1:] == MANIFEST.parts):
                    file = tar.extractfile(member)
                    if file is not None:
                        wanted[member.name] = file.read()
                        kept += member.size
    top = next((name[: -len(MANIFEST.as_posix()) - 1] for name in wanted if name.endswith(MANIFEST.as_posix())
                and PurePosixPath(name).parts[1:] == MANIFEST.parts), None)
    if top is None:
        return _settings(archive, "", lambda name: None)
    return _settings(archive, f"{top}/", lambda name: wanted.get(name))


def _settings(archive: Path, prefix: str, read: Callable[[str], bytes | None]) -> tuple[MarManifest, MarConfig]:
    data = read(prefix + MANIFEST.as_posix())
    if data is None:
        raise invalid(f"model archive {archive.name}: it has no {MANIFEST.as_posix()}; torch-model-archiver "
                      "writes one into every archive")
    manifest = parse_manifest(data, archive.name)
    if manifest.config_file is None:
        return manifest, MarConfig()
    name = check_relative(manifest.config_file, f"model archive {archive.name}: model.configFile").as_posix()
    text = read(prefix + name)
    if text is None:
        raise invalid(f"model archive {archive.name}: {MANIFEST.as_posix()}: model.configFile names "
                      f"'{manifest.config_file}', which the archive does not hold")
    return manifest, parse_model_config(text, PurePosixPath(name).name, archive.name)
