"""Unpack a model archive (.tar.gz, plain .tar, or zip: a TorchServe .mar) safely and atomically.

Model archives come from users (SageMaker ModelDataUrl, multi-model TargetModel), so every member is
checked here rather than trusted to `tarfile`'s extraction filters (absent on Python 3.10):

- names must be relative, with no `..` component, at most MAX_DEPTH directories deep (a few hundred bytes of
  archive can hold a chain of thousands, which every recursive walk of the tree, rmtree's included, fails on);
  regular files, directories, symlinks and hard links only (no devices, fifos or sparse files); a link must
  resolve inside the unpacked tree;
- the bytes actually written are counted against the limit, so a lying header or a high-ratio gzip
  stops at the limit instead of filling the disk;
- gzip integrity (CRC, length) is checked by reading the stream to its end;
- a zip may hold files and directories only (a symlink in a zip is refused), each file's CRC is checked as it
  is read, and its bytes are counted as they are written, whatever its header claims.

Regular files and directories are written first and symlinks last, so no write ever goes through a
symlink; each symlink's parent is checked before it is created and every symlink's real target after
all exist (a chain of links that are each harmless alone can still point out of the tree).
Unpacking happens in a hidden temporary directory next to the destination, renamed into place only
when complete; on any error nothing is left behind.
"""

from __future__ import annotations

import gzip
import io
import os
import shutil
import stat
import tarfile
import tempfile
import zipfile
import zlib
from pathlib import Path, PurePosixPath

from modelhost.errors import ErrorKind, ModelhostError

_CHUNK = 1 << 20
MAX_DEPTH = 64  # path components of a member (SavedModels need 3, a code/ directory of installed packages ~15)
_GZIP_MAGIC = b"\x1f\x8b"
_ZIP_MAGIC = (b"PK\x03\x04", b"PK\x05\x06")  # a local file header; an empty zip's end record
# What reading a broken archive raises: tar structure errors, truncated or corrupt gzip.
_READ_ERRORS = (tarfile.TarError, EOFError, zlib.error, gzip.BadGzipFile)


class ArchiveError(ModelhostError):
    """A model archive that is corrupt, unsafe or too large; the message names the archive and member."""

    def __init__(self, archive: Path, message: str) -> None:
        super().__init__(ErrorKind.INVALID_INPUT, f"model archive {archive}: {message}")


def unpack_archive(archive: Path, destination: Path, max_unpacked_bytes: int, max_members: int = 10_000) -> int:
    """Unpack `archive` into `destination` (which must not exist) and return the bytes written.

    Blocking; call it off the event loop. Raises ArchiveError for a bad archive; nothing is left
    behind on any error.
    """
    if os.path.lexists(destination):
        raise ArchiveError(archive, f"cannot unpack into {destination}: it already exists")
    destination.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{destination.name}.", suffix=".unpacking", dir=destination.parent))
    try:
        with open(archive, "rb") as head:
            is_zip = head.read(4) in _ZIP_MAGIC
        unpacker = _ZipUnpacker if is_zip else _Unpacker
        written = unpacker(archive, staging, max_unpacked_bytes, max_members).run()
        try:
            os.rename(staging, destination)
        except OSError as exc:  # created meanwhile by someone else
            raise ArchiveError(archive, f"cannot move the unpacked tree to {destination}: {exc}") from None
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return written


class _Unpacker:
    """One unpacking run into an empty staging directory; not reusable."""

    def __init__(self, archive: Path, root: Path, limit: int, max_members: int) -> None:
        self.archive = archive
        self.root = root
        self.real_root = os.path.realpath(root)
        self.limit = limit
        self.max_members = max_members
        self.written = 0
        self.files: set[PurePosixPath] = set()
        self.symlinks: list[tuple[PurePosixPath, str]] = []

    def run(self) -> int:
        try:
            with open(self.archive, "rb") as raw:
                compressed = raw.read(2) == _GZIP_MAGIC
                raw.seek(0)
                stream: io.BufferedIOBase = gzip.GzipFile(fileobj=raw, mode="rb") if compressed else raw
                with tarfile.open(fileobj=stream, mode="r|") as tar:
                    for count, member in enumerate(tar, 1):
                        if count > self.max_members:
                            raise ArchiveError(self.archive, f"it has more than {self.max_members} members "
                                                             "(--max-archive-members)")
                        self._unpack(tar, member, self._checked_name(member))
                self._drain(stream)
        except _READ_ERRORS as exc:
            reason = str(exc) or type(exc).__name__
            raise ArchiveError(self.archive, f"corrupt, truncated or not a tar/tar.gz file ({reason})") from None
        self._make_symlinks()
        return self.written

    def _checked_name(self, member: tarfile.TarInfo) -> PurePosixPath:
        name = member.name
        if "\x00" in name:
            raise self._error(member, "its name contains a NUL byte")
        path = PurePosixPath(name)
        if path.is_absolute():
            raise self._error(member, "absolute paths are not allowed")
        if ".." in path.parts:
            raise self._error(member, "'..' components are not allowed")
        if len(path.parts) > MAX_DEPTH:
            raise self._error(member, f"its path is {len(path.parts)} names deep (at most {MAX_DEPTH})")
        return path

    def _unpack(self, tar: tarfile.TarFile, member: tarfile.TarInfo, name: PurePosixPath) -> None:
        target = self.root / name
        if member.isdir():
            self._mkdir(member, target)
        elif member.issparse():
            raise self._error(member, "sparse files are not supported")
        elif member.isreg():
            self._write_file(tar, member, name, target)
        elif member.issym():
            self._check_symlink(member, name)
            self.symlinks.append((name, member.linkname))
        elif member.islnk():
            self._hard_link(member, name, target)
        else:
            raise self._error(member, f"{_kind(member)} entries are not allowed (only files, directories and links)")

    def _mkdir(self, member: tarfile.TarInfo, target: Path) -> None:
        try:
            target.mkdir(parents=True, exist_ok=True)
        except (FileExistsError, NotADirectoryError):
            raise self._error(member, "conflicts with a file unpacked earlier at that path") from None

    def _write_file(self, tar: tarfile.TarFile, member: tarfile.TarInfo, name: PurePosixPath, target: Path) -> None:
        if not name.parts:
            raise self._error(member, "a file cannot be the archive root")
        if self.written + member.size > self.limit:
            raise self._too_large(member)
        self._mkdir(member, target.parent)
        source = tar.extractfile(member)
        assert source is not None  # a regular member always has data
        mode = 0o755 if member.mode & 0o100 else 0o644
        try:
            fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode)
        except (FileExistsError, IsADirectoryError, NotADirectoryError):
            raise self._error(member, "appears twice or conflicts with another member") from None
        with os.fdopen(fd, "wb") as out:
            while chunk := source.read(_CHUNK):
                self.written += len(chunk)
                if self.written > self.limit:
                    raise self._too_large(member)
                out.write(chunk)
        self.files.add(name)

    def _hard_link(self, member: tarfile.TarInfo, name: PurePosixPath, target: Path) -> None:
        link = PurePosixPath(member.linkname)
        if link.is_absolute() or ".." in link.parts:
            raise self._error(member, f"hard link target '{member.linkname}' lies outside the archive")
        if link not in self.files:
            raise self._error(member, f"hard link target '{member.linkname}' is not a file unpacked before it")
        self._mkdir(member, target.parent)
        try:
            os.link(self.root / link, target, follow_symlinks=False)
        except (FileExistsError, NotADirectoryError):
            raise self._error(member, "appears twice or conflicts with another member") from None
        self.files.add(name)

    def _check_symlink(self, member: tarfile.TarInfo, name: PurePosixPath) -> None:
        """The lexical check: catches absolute targets and `..` that climbs out, before anything is written."""
        linkname = member.linkname
        if not linkname or "\x00" in linkname:
            raise self._error(member, "symlink has an empty or invalid target")
        resolved = os.path.normpath(name.parent / linkname)
        if PurePosixPath(linkname).is_absolute() or resolved == ".." or resolved.startswith("../"):
            raise self._error(member, f"symlink target '{linkname}' lies outside the archive")

    def _make_symlinks(self) -> None:
        for name, linkname in self.symlinks:
            path = self.root / name
            parent = self.root / name.parent
            if not name.parts or not self._inside(parent):
                raise ArchiveError(self.archive, f"member '{name}': symlink lies outside the archive")
            try:
                parent.mkdir(parents=True, exist_ok=True)
                os.symlink(linkname, path)
            except (FileExistsError, NotADirectoryError):
                raise ArchiveError(self.archive, f"member '{name}': conflicts with another member") from None
        for name, linkname in self.symlinks:
            if not self._inside(self.root / name):
                raise ArchiveError(
                    self.archive, f"member '{name}': symlink target '{linkname}' resolves outside the archive"
                )

    def _drain(self, stream: io.BufferedIOBase) -> None:
        """Read past the end-of-archive marker to the end, so gzip checks its CRC and length."""
        trailing = 0
        while chunk := stream.read(_CHUNK):
            trailing += len(chunk)
            if self.written + trailing > self.limit:
                raise ArchiveError(self.archive, f"more than {self.limit} bytes of data after the last member")

    def _inside(self, path: Path) -> bool:
        real = os.path.realpath(path)
        return real == self.real_root or real.startswith(self.real_root + os.sep)

    def _error(self, member: tarfile.TarInfo, problem: str) -> ArchiveError:
        return ArchiveError(self.archive, f"member '{member.name}': {problem}")

    def _too_large(self, member: tarfile.TarInfo) -> ArchiveError:
        return self._error(member, f"unpacked size exceeds the limit of {self.limit} bytes")


class _ZipUnpacker:
    """One zip's unpacking into an empty staging directory: files and directories only."""

    def __init__(self, archive: Path, root: Path, limit: int, max_members: int) -> None:
        self.archive = archive
        self.root = root
        self.limit = limit
        self.max_members = max_members
        self.written = 0

    def run(self) -> int:
        try:
            with zipfile.ZipFile(self.archive) as archive:
                members = archive.infolist()
                if len(members) > self.max_members:
                    raise ArchiveError(self.archive, f"it has more than {self.max_members} members "
                                                     "(--max-archive-members)")
                for member in members:
                    self._unpack(archive, member)
        except (zipfile.BadZipFile, zlib.error, EOFError, NotImplementedError) as exc:
            reason = str(exc) or type(exc).__name__
            raise ArchiveError(self.archive, f"corrupt, truncated or not a zip file ({reason})") from None
        return self.written

    def _unpack(self, archive: zipfile.ZipFile, member: zipfile.ZipInfo) -> None:
        name = member.filename
        path = PurePosixPath(name)
        if "\x00" in name or "\\" in name:
            raise self._error(name, "its name contains a NUL byte or a backslash")
        if path.is_absolute() or ".." in path.parts or not path.parts:
            raise self._error(name, "absolute paths and '..' components are not allowed")
        if len(path.parts) > MAX_DEPTH:
            raise self._error(name, f"its path is {len(path.parts)} names deep (at most {MAX_DEPTH})")
        if stat.S_ISLNK(member.external_attr >> 16):
            raise self._error(name, "symlinks are not allowed in a zip archive")
        target = self.root / path
        try:
            if member.is_dir():
                target.mkdir(parents=True, exist_ok=True)
                return
            target.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
        except (FileExistsError, IsADirectoryError, NotADirectoryError):
            raise self._error(name, "appears twice or conflicts with another member") from None
        with archive.open(member) as source, os.fdopen(fd, "wb") as out:
            while chunk := source.read(_CHUNK):
                self.written += len(chunk)
                if self.written > self.limit:
                    raise self._error(name, f"unpacked size exceeds the limit of {self.limit} bytes")
                out.write(chunk)

    def _error(self, name: str, problem: str) -> ArchiveError:
        return ArchiveError(self.archive, f"member '{name}': {problem}")


def _kind(member: tarfile.TarInfo) -> str:
    if member.ischr():
        return "character device"
    if member.isblk():
        return "block device"
    if member.isfifo():
        return "fifo"
    return f"type {member.type!r}"
