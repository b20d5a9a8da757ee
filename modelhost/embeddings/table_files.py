"""An embedding table on disk: a directory of versions, each written once, and `CURRENT` naming the one served.

    <table>/CURRENT               the served version's name ("v3"), replaced atomically (write, fsync, rename)
    <table>/v3/meta.json          format, dim, dtype, row count, default vector
    <table>/v3/ids.npy            the feature ids, int64, sorted, unique: row i holds ids[i]
    <table>/v3/rows.bin           the rows (rows.py), in 4096-byte blocks no row straddles (so one row is one read)
    <table>/v3/delta.log          rows updated while serving (delta_log.py), replayed at open

A version is written beside the served one and made current by one rename, so a reader sees the old table or
the new, never a mix; versions the server no longer uses are removed by the next write.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, Protocol

import numpy as np

from modelhost.embeddings.id_index import IdIndex
from modelhost.embeddings.rows import RowCodec

FORMAT = "modelhost-embedding-table"
FORMAT_VERSION = 1
BLOCK = 4096
CURRENT = "CURRENT"
META, IDS, ROWS, DELTA = "meta.json", "ids.npy", "rows.bin", "delta.log"
_VERSION = re.compile(r"v(\d+)")
_WRITE_ROWS = 65536  # rows encoded and written at a time
_READ_IDS = 1 << 18  # ids read at a time into the index (its transient memory: ~50 bytes an id)


class Sink(Protocol):
    """Where rows are written: a file, or a writer that syncs behind itself (write_behind.py)."""

    def write(self, data: bytes | memoryview, /) -> int: ...


class TableError(Exception):
    """A table that cannot be read or written as asked; the message names the table and the problem."""


@dataclass(frozen=True, slots=True)
class TableMeta:
    dim: int
    dtype: str
    rows: int
    default: tuple[float, ...] = field(default=())  # empty: zeros

    @property
    def codec(self) -> RowCodec:
        return RowCodec(self.dtype, self.dim)

    @property
    def rows_per_block(self) -> int:
        """Rows in one 4096-byte block; 0 when a row is larger than a block (each row then starts a block)."""
        return BLOCK // self.codec.row_bytes

    @property
    def row_stride_blocks(self) -> int:
        """Blocks one row takes when rows_per_block is 0."""
        return -(-self.codec.row_bytes // BLOCK)

    def file_bytes(self) -> int:
        """rows.bin's size: whole blocks."""
        if self.rows_per_block == 0:
            return self.rows * self.row_stride_blocks * BLOCK
        return -(-self.rows // self.rows_per_block) * BLOCK

    def default_vector(self) -> np.ndarray:
        if not self.default:
            return np.zeros(self.dim, dtype=np.float32)
        return np.asarray(self.default, dtype=np.float32)

    def to_json(self) -> dict[str, object]:
        return {"format": FORMAT, "format_version": FORMAT_VERSION, "dim": self.dim, "dtype": self.dtype,
                "rows": self.rows, "default": list(self.default)}


def read_meta(version: Path) -> TableMeta:
    try:
        document = json.loads((version / META).read_text())
    except (OSError, ValueError) as exc:
        raise TableError(f"{version}: cannot read {META}: {exc}") from None
    if not isinstance(document, dict) or document.get("format") != FORMAT:
        raise TableError(f"{version}: {META} is not a {FORMAT} description")
    if document.get("format_version") != FORMAT_VERSION:
        raise TableError(f"{version}: format_version {document.get('format_version')!r} is not {FORMAT_VERSION}")
    try:
        meta = TableMeta(int(document["dim"]), str(document["dtype"]), int(document["rows"]),
                         tuple(float(v) for v in document.get("default") or ()))
        meta.codec  # noqa: B018 - checks dim and dtype
    except (KeyError, TypeError, ValueError) as exc:
        raise TableError(f"{version}: {META} is invalid: {exc}") from None
    if meta.default and len(meta.default) != meta.dim:
        raise TableError(f"{version}: the default vector has {len(meta.default)} values, not dim {meta.dim}")
    return meta


def current_version(table: Path) -> Path:
    """The served version's directory; TableError when the table has none."""
    try:
        name = (table / CURRENT).read_text().strip()
    except OSError:
        raise TableError(f"{table}: not an embedding table (no {CURRENT} file)") from None
    if not _VERSION.fullmatch(name) or not (table / name).is_dir():
        raise TableError(f"{table}: {CURRENT} names '{name}', which is not a version of the table")
    return table / name


def read_ids(version: Path, meta: TableMeta) -> IdIndex:
    """The version's ids (sorted, unique), checked against its rows, read into a compressed index a chunk at a
    time (the whole int64 array is never in RAM)."""
    size = (version / ROWS).stat().st_size if (version / ROWS).exists() else -1
    if size < meta.file_bytes():
        raise TableError(f"{version}: {ROWS} holds {max(size, 0)} bytes, {meta.file_bytes()} expected")
    try:
        with open(version / IDS, "rb") as file:
            dtype, count, start = _ids_header(file)
            if dtype != np.dtype("<i8") or count != meta.rows:
                raise TableError(f"{version}: {IDS} must hold {meta.rows} int64 ids, holds {dtype} [{count}]")
            first, last = (_id_at(file, start + 8 * place) if count else 0 for place in (0, count - 1))
            file.seek(start)
            chunks = (np.fromfile(file, "<i8", min(_READ_IDS, count - done)) for done in range(0, count, _READ_IDS))
            return IdIndex.from_chunks(count, first, last, chunks)
    except (OSError, ValueError) as exc:
        raise TableError(f"{version}: cannot read {IDS}: {exc}") from None


def _id_at(file: BinaryIO, offset: int) -> int:
    file.seek(offset)
    return int(np.fromfile(file, "<i8", 1)[0])


def _ids_header(file: BinaryIO) -> tuple[np.dtype[Any], int, int]:
    """An .npy file's dtype, length (a vector's) and where its data starts; ValueError for any other array."""
    major, _ = np.lib.format.read_magic(file)
    header = np.lib.format.read_array_header_1_0 if major == 1 else np.lib.format.read_array_header_2_0
    shape, fortran, dtype = header(file)
    if len(shape) != 1:
        raise ValueError(f"it holds an array of shape {list(shape)}, not a vector")
    return dtype, int(shape[0]), file.tell()


def write_version(table: Path, ids: np.ndarray, vectors: np.ndarray, dtype: str,
                  default: np.ndarray | None = None) -> Path:
    """Write `vectors` [n, dim] (an array or a memory map) keyed by `ids` [n] as a new version of `table` and make
    it current; versions older than the previous one are removed. Raises TableError (duplicate ids, bad values)."""
    ids = np.asarray(ids)
    if ids.ndim != 1 or not np.issubdtype(ids.dtype, np.integer):
        raise TableError(f"{table}: ids must be a vector of integers, got {ids.dtype} {list(ids.shape)}")
    if vectors.ndim != 2 or len(vectors) != len(ids):
        raise TableError(f"{table}: vectors must be [{len(ids)}, dim], got {list(vectors.shape)}")
    ids = ids.astype(np.int64, copy=False)
    order = np.argsort(ids, kind="stable")
    sorted_ids = ids[order]
    repeated = np.flatnonzero(sorted_ids[1:] == sorted_ids[:-1])
    if len(repeated):
        raise TableError(f"{table}: id {int(sorted_ids[repeated[0]])} appears more than once")
    meta = TableMeta(int(vectors.shape[1]), dtype, len(ids),
                     () if default is None else tuple(float(v) for v in np.asarray(default, np.float32)))
    try:
        codec = meta.codec
    except ValueError as exc:
        raise TableError(f"{table}: {exc}") from None
    if meta.default and len(meta.default) != meta.dim:
        raise TableError(f"{table}: the default vector has {len(meta.default)} values, not dim {meta.dim}")
    table.mkdir(parents=True, exist_ok=True)
    version = table / f"v{_next_number(table)}"
    version.mkdir()
    # Chunks of whole blocks, so that each block is written once, whole.
    step = meta.rows_per_block * max(1, _WRITE_ROWS // meta.rows_per_block) if meta.rows_per_block else _WRITE_ROWS
    with open(version / ROWS, "wb") as out:
        for start in range(0, len(ids), step):
            chunk = order[start:start + step]
            try:
                rows = codec.encode(_gather(vectors, chunk))
            except ValueError as exc:
                raise TableError(f"{table}: rows {start}..{start + len(chunk) - 1} (in id order): {exc}") from None
            write_rows(out, meta, start, rows)
        out.truncate(meta.file_bytes())
        out.flush()
        os.fsync(out.fileno())
    np.save(version / IDS, sorted_ids)
    (version / META).write_text(json.dumps(meta.to_json()))
    for name in (IDS, META):
        fsync_path(version / name)
    make_current(table, version)
    return version


def make_current(table: Path, version: Path) -> None:
    """Point CURRENT at `version` atomically, then remove versions before the previous one."""
    previous = point_current(table, version)
    remove_versions(table, keep=(version.name, previous))


def point_current(table: Path, version: Path) -> str | None:
    """Point CURRENT at `version` atomically (durable on return); the name it held before, if any."""
    previous = (table / CURRENT).read_text().strip() if (table / CURRENT).exists() else None
    staged = table / f".{CURRENT}.{os.getpid()}"
    staged.write_text(version.name + "\n")
    fsync_path(staged)
    os.replace(staged, table / CURRENT)
    fsync_path(table)
    return previous


def remove_versions(table: Path, keep: tuple[str | None, ...]) -> None:
    """Remove the table's versions but those named in `keep`."""
    for entry in table.iterdir():
        if _VERSION.fullmatch(entry.name) and entry.name not in keep and entry.is_dir():
            for child in entry.iterdir():
                child.unlink()
            entry.rmdir()


def write_rows(out: Sink, meta: TableMeta, first: int, rows: np.ndarray) -> None:
    """Rows `first`.. at their places in rows.bin (written in order: each block is written whole)."""
    per_block = meta.rows_per_block
    row_bytes = meta.codec.row_bytes
    if per_block == 0:
        padded = np.zeros((len(rows), meta.row_stride_blocks * BLOCK), dtype=np.uint8)
        padded[:, :row_bytes] = rows
        out.write(padded.tobytes())
        return
    assert first % per_block == 0, "a chunk starts a block"
    if per_block * row_bytes == BLOCK and len(rows) % per_block == 0:  # rows fill their blocks: written as they are
        out.write(np.ascontiguousarray(rows).data)
        return
    blocks = -(-len(rows) // per_block)
    padded = np.zeros((blocks * per_block, row_bytes), dtype=np.uint8)
    padded[: len(rows)] = rows
    data = np.zeros((blocks, BLOCK), dtype=np.uint8)
    data[:, : per_block * row_bytes] = padded.reshape(blocks, per_block * row_bytes)
    out.write(data.tobytes())


def _gather(vectors: np.ndarray, indices: np.ndarray) -> np.ndarray:
    """vectors[indices], read in ascending order (a memory-mapped file is read forward)."""
    ascending = np.argsort(indices)
    gathered = np.empty((len(indices), vectors.shape[1]), dtype=np.float32)
    gathered[ascending] = vectors[indices[ascending]]
    return gathered


def next_version_name(table: Path) -> str:
    """The name the table's next version gets."""
    return f"v{_next_number(table)}"


def _next_number(table: Path) -> int:
    numbers = [int(match.group(1)) for entry in table.iterdir() if (match := _VERSION.fullmatch(entry.name))]
    return max(numbers, default=0) + 1


def fsync_path(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
