"""unpack_archive against real archives built with tarfile and zipfile, good and malicious."""

from __future__ import annotations

import gzip
import io
import os
import stat
import tarfile
import warnings
import zipfile
from collections.abc import Callable
from pathlib import Path

import pytest

from modelhost.errors import ErrorKind
from modelhost.store.unpack import ArchiveError, unpack_archive

LIMIT = 1 << 20


def add_file(tar: tarfile.TarFile, name: str, data: bytes, mode: int = 0o644) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mode = mode
    tar.addfile(info, io.BytesIO(data))


def add_entry(tar: tarfile.TarFile, name: str, kind: bytes, linkname: str = "") -> None:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = linkname
    tar.addfile(info)


def build(path: Path, fill: Callable[[tarfile.TarFile], None], compressed: bool = True) -> Path:
    with tarfile.open(path, "w:gz") if compressed else tarfile.open(path, "w") as tar:
        fill(tar)
    return path


def fail(tmp_path: Path, archive: Path, limit: int = LIMIT) -> str:
    """Unpack expecting ArchiveError; check nothing is left beside the archive; return the message."""
    out = tmp_path / "out"
    with pytest.raises(ArchiveError) as caught:
        unpack_archive(archive, out, limit)
    assert caught.value.kind is ErrorKind.INVALID_INPUT
    assert str(archive) in caught.value.message
    assert sorted(os.listdir(tmp_path)) == [archive.name]
    return caught.value.message


def test_unpacks_files_dirs_and_inner_links(tmp_path: Path) -> None:
    def fill(tar: tarfile.TarFile) -> None:
        add_entry(tar, "model", tarfile.DIRTYPE)
        add_file(tar, "model/1/model.onnx", b"onnx-bytes")
        add_file(tar, "./code/inference.py", b"print('hi')\n", mode=0o755)
        add_entry(tar, "model/latest", tarfile.SYMTYPE, "1")
        add_entry(tar, "code/lib/alias.py", tarfile.SYMTYPE, "../inference.py")
        add_entry(tar, "model/2/model.onnx", tarfile.LNKTYPE, "model/1/model.onnx")
        add_file(tar, "model/" + "long" * 40 + "/vocab.txt", b"")  # over 100 characters: a pax/GNU long name

    archive = build(tmp_path / "model.tar.gz", fill)
    out = tmp_path / "out"
    assert unpack_archive(archive, out, LIMIT) == len(b"onnx-bytes") + len(b"print('hi')\n")
    assert (out / "model" / ("long" * 40) / "vocab.txt").is_file()
    assert (out / "model/1/model.onnx").read_bytes() == b"onnx-bytes"
    assert (out / "model/2/model.onnx").read_bytes() == b"onnx-bytes"
    assert (out / "model/latest/model.onnx").read_bytes() == b"onnx-bytes"
    assert (out / "code/lib/alias.py").read_text() == "print('hi')\n"
    assert os.access(out / "code/inference.py", os.X_OK)
    assert sorted(os.listdir(tmp_path)) == ["model.tar.gz", "out"]  # no staging directory left


def test_unpacks_a_plain_tar(tmp_path: Path) -> None:
    archive = build(tmp_path / "model.tar", lambda tar: add_file(tar, "model.onnx", b"x" * 100), compressed=False)
    assert unpack_archive(archive, tmp_path / "out", LIMIT) == 100
    assert (tmp_path / "out/model.onnx").read_bytes() == b"x" * 100


def test_destination_must_not_exist(tmp_path: Path) -> None:
    archive = build(tmp_path / "model.tar.gz", lambda tar: add_file(tar, "a", b"a"))
    (tmp_path / "out").mkdir()
    with pytest.raises(ArchiveError, match="already exists"):
        unpack_archive(archive, tmp_path / "out", LIMIT)
    assert sorted(os.listdir(tmp_path)) == ["model.tar.gz", "out"]
    assert os.listdir(tmp_path / "out") == []


@pytest.mark.parametrize(
    ("fill", "expected"),
    [
        (lambda tar: add_file(tar, "/etc/evil", b"x"), "member '/etc/evil': absolute paths are not allowed"),
        (lambda tar: add_file(tar, "model/../../evil", b"x"), "member 'model/../../evil': '..' components"),
        (lambda tar: add_file(tar, "../evil", b"x"), "member '../evil': '..' components"),
        (lambda tar: add_entry(tar, "escape", tarfile.SYMTYPE, "../outside"),
         "member 'escape': symlink target '../outside' lies outside the archive"),
        (lambda tar: add_entry(tar, "a/b/escape", tarfile.SYMTYPE, "../../.."),
         "member 'a/b/escape': symlink target '../../..' lies outside"),
        (lambda tar: add_entry(tar, "passwd", tarfile.SYMTYPE, "/etc/passwd"),
         "symlink target '/etc/passwd' lies outside"),
        (lambda tar: add_entry(tar, "passwd", tarfile.LNKTYPE, "/etc/passwd"),
         "member 'passwd': hard link target '/etc/passwd' lies outside the archive"),
        (lambda tar: add_entry(tar, "passwd", tarfile.LNKTYPE, "../../etc/passwd"),
         "hard link target '../../etc/passwd' lies outside the archive"),
        (lambda tar: add_entry(tar, "later", tarfile.LNKTYPE, "not_yet"),
         "hard link target 'not_yet' is not a file unpacked before it"),
        (lambda tar: add_entry(tar, "tty", tarfile.CHRTYPE), "member 'tty': character device entries are not allowed"),
        (lambda tar: add_entry(tar, "disk", tarfile.BLKTYPE), "member 'disk': block device entries are not allowed"),
        (lambda tar: add_entry(tar, "pipe", tarfile.FIFOTYPE), "member 'pipe': fifo entries are not allowed"),
        (lambda tar: add_file(tar, "d/" * 1_500 + "x", b"x"), "its path is 1501 names deep (at most 64)"),
    ],
    ids=["absolute", "dotdot-inner", "dotdot", "symlink-up", "symlink-deep-up", "symlink-absolute",
         "hardlink-absolute", "hardlink-up", "hardlink-missing", "chardev", "blockdev", "fifo", "deep"],
)
def test_rejects_unsafe_members(tmp_path: Path, fill: Callable[[tarfile.TarFile], None], expected: str) -> None:
    def with_good_file_first(tar: tarfile.TarFile) -> None:
        add_file(tar, "model/1/model.onnx", b"fine")  # something was already written when the bad member comes
        fill(tar)

    assert expected in fail(tmp_path, build(tmp_path / "model.tar.gz", with_good_file_first))


def test_rejects_a_symlink_chain_that_escapes(tmp_path: Path) -> None:
    # Each link alone stays inside lexically ("here/.." is the root), but "here" is the root itself,
    # so "here/.." is really the parent of the root.
    def fill(tar: tarfile.TarFile) -> None:
        add_entry(tar, "here", tarfile.SYMTYPE, ".")
        add_entry(tar, "up", tarfile.SYMTYPE, "here/..")

    message = fail(tmp_path, build(tmp_path / "model.tar.gz", fill))
    assert "member 'up': symlink target 'here/..' resolves outside the archive" in message


def test_rejects_writing_through_a_symlink(tmp_path: Path) -> None:
    def fill(tar: tarfile.TarFile) -> None:
        add_entry(tar, "dir", tarfile.SYMTYPE, "real")
        add_file(tar, "dir/model.onnx", b"x")

    assert "member 'dir': conflicts with another member" in fail(tmp_path, build(tmp_path / "m.tar.gz", fill))


def test_rejects_duplicate_files(tmp_path: Path) -> None:
    def fill(tar: tarfile.TarFile) -> None:
        add_file(tar, "model.onnx", b"one")
        add_file(tar, "model.onnx", b"two")

    assert "member 'model.onnx': appears twice" in fail(tmp_path, build(tmp_path / "m.tar.gz", fill))


def test_rejects_more_bytes_than_the_limit(tmp_path: Path) -> None:
    archive = build(tmp_path / "m.tar.gz", lambda tar: add_file(tar, "big.bin", os.urandom(LIMIT + 1)))
    assert "member 'big.bin': unpacked size exceeds the limit of 1048576 bytes" in fail(tmp_path, archive)


def test_the_limit_counts_all_members(tmp_path: Path) -> None:
    def fill(tar: tarfile.TarFile) -> None:
        for index in range(5):
            add_file(tar, f"part{index}.bin", b"\0" * (LIMIT // 4))

    assert "member 'part4.bin': unpacked size exceeds the limit" in fail(tmp_path, build(tmp_path / "m.tar.gz", fill))
    assert unpack_archive(tmp_path / "m.tar.gz", tmp_path / "out", 5 * (LIMIT // 4)) == 5 * (LIMIT // 4)


def test_rejects_a_high_ratio_gzip(tmp_path: Path) -> None:
    # 64 MiB of zeros compress to ~64 KiB: the limit, not the archive size, must stop it.
    archive = tmp_path / "bomb.tar.gz"
    with gzip.open(archive, "wb", compresslevel=9) as out, tarfile.open(fileobj=out, mode="w|") as tar:
        info = tarfile.TarInfo("zeros.bin")
        info.size = 64 << 20
        tar.addfile(info, io.BytesIO(bytes(info.size)))
    assert archive.stat().st_size < 1 << 20
    assert "member 'zeros.bin': unpacked size exceeds the limit" in fail(tmp_path, archive, limit=8 << 20)


def test_rejects_a_bomb_after_the_last_member(tmp_path: Path) -> None:
    tar_bytes = io.BytesIO()
    with tarfile.open(fileobj=tar_bytes, mode="w") as tar:
        add_file(tar, "model.onnx", b"x")
    archive = tmp_path / "trailing.tar.gz"
    archive.write_bytes(gzip.compress(tar_bytes.getvalue() + bytes(4 << 20)))
    assert "bytes of data after the last member" in fail(tmp_path, archive)


def test_rejects_a_truncated_gzip(tmp_path: Path) -> None:
    archive = build(tmp_path / "m.tar.gz", lambda tar: add_file(tar, "model.onnx", os.urandom(200_000)))
    archive.write_bytes(archive.read_bytes()[:100_000])
    assert "corrupt, truncated or not a tar/tar.gz file" in fail(tmp_path, archive)


def test_rejects_a_gzip_without_its_trailer(tmp_path: Path) -> None:
    # All tar data is present but the CRC and length are cut: only reading to the end notices.
    archive = build(tmp_path / "m.tar.gz", lambda tar: add_file(tar, "model.onnx", os.urandom(1000)))
    archive.write_bytes(archive.read_bytes()[:-8])
    assert "corrupt, truncated" in fail(tmp_path, archive)


def test_rejects_a_corrupt_gzip(tmp_path: Path) -> None:
    archive = build(tmp_path / "m.tar.gz", lambda tar: add_file(tar, "model.onnx", os.urandom(10_000)))
    data = bytearray(archive.read_bytes())
    data[len(data) // 2] ^= 0xFF
    archive.write_bytes(bytes(data))
    assert "corrupt, truncated" in fail(tmp_path, archive)


def test_rejects_a_truncated_plain_tar(tmp_path: Path) -> None:
    archive = build(tmp_path / "m.tar", lambda tar: add_file(tar, "model.onnx", os.urandom(100_000)), compressed=False)
    archive.write_bytes(archive.read_bytes()[:50_000])
    assert "corrupt, truncated" in fail(tmp_path, archive)


@pytest.mark.parametrize("content", [b"", b"this is not an archive\n" * 100, gzip.compress(b"plain text\n" * 100)],
                         ids=["empty", "text", "gzipped-text"])
def test_rejects_a_non_tar_file(tmp_path: Path, content: bytes) -> None:
    archive = tmp_path / "model.tar.gz"
    archive.write_bytes(content)
    assert "not a tar/tar.gz file" in fail(tmp_path, archive)


def test_rejects_an_archive_of_too_many_members(tmp_path: Path) -> None:
    """Each entry costs a file to unpack: an archive of 100,000 tiny members must not be unpacked whole."""
    def fill(tar: tarfile.TarFile) -> None:
        for i in range(101):
            add_file(tar, f"m/{i}.txt", b"x")

    archive = build(tmp_path / "many.tar.gz", fill)
    out = tmp_path / "out"
    with pytest.raises(ArchiveError, match=r"more than 100 members \(--max-archive-members\)"):
        unpack_archive(archive, out, LIMIT, max_members=100)
    assert sorted(os.listdir(tmp_path)) == [archive.name]
    assert unpack_archive(archive, out, LIMIT, max_members=101) == 101


# zip archives (TorchServe's .mar)


def build_zip(path: Path, members: list[tuple[str, bytes]], symlink: tuple[str, str] | None = None) -> Path:
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, data in members:
            archive.writestr(name, data)
        if symlink is not None:
            info = zipfile.ZipInfo(symlink[0])
            info.external_attr = (stat.S_IFLNK | 0o777) << 16
            archive.writestr(info, symlink[1])
    return path


def test_unpacks_a_zip(tmp_path: Path) -> None:
    archive = build_zip(tmp_path / "m.mar", [("MAR-INF/MANIFEST.json", b"{}"), ("handler.py", b"x = 1\n"),
                                               ("extra/vocab.txt", b"a\nb\n")])
    assert unpack_archive(archive, tmp_path / "out", LIMIT) == 2 + 6 + 4
    assert (tmp_path / "out" / "extra" / "vocab.txt").read_bytes() == b"a\nb\n"
    assert (tmp_path / "out" / "MAR-INF" / "MANIFEST.json").read_bytes() == b"{}"


@pytest.mark.parametrize("members, symlink, expected", [
    ([("../evil.py", b"x")], None, "'..' components are not allowed"),
    ([("/etc/evil", b"x")], None, "absolute paths"),
    ([("a\\..\\evil", b"x")], None, "backslash"),
    ([("ok.txt", b"x")], ("link", "/etc/passwd"), "symlinks are not allowed in a zip archive"),
    ([("dup.txt", b"x"), ("dup.txt", b"y")], None, "appears twice"),
    ([("d/" * 1_500 + "x", b"x")], None, "its path is 1501 names deep (at most 64)"),
], ids=["dotdot", "absolute", "backslash", "symlink", "duplicate", "deep"])
def test_rejects_unsafe_zip_members(tmp_path: Path, members: list[tuple[str, bytes]],
                                    symlink: tuple[str, str] | None, expected: str) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # zipfile warns about the duplicate name it is asked to write
        archive = build_zip(tmp_path / "bad.mar", members, symlink)
    assert expected in fail(tmp_path, archive)


def test_rejects_a_high_ratio_zip(tmp_path: Path) -> None:
    archive = build_zip(tmp_path / "bomb.mar", [("zeros.bin", bytes(8 * LIMIT))])
    assert archive.stat().st_size < LIMIT // 10
    assert "unpacked size exceeds the limit" in fail(tmp_path, archive)


def test_rejects_a_corrupt_zip(tmp_path: Path) -> None:
    archive = build_zip(tmp_path / "corrupt.mar", [("weights.bin", os.urandom(200_000))])
    data = bytearray(archive.read_bytes())
    data[1000] ^= 0xFF  # inside the stored data: the member's CRC no longer matches
    archive.write_bytes(bytes(data))
    assert "corrupt, truncated or not a zip file" in fail(tmp_path, archive)


def test_rejects_a_zip_of_too_many_members(tmp_path: Path) -> None:
    archive = build_zip(tmp_path / "many.mar", [(f"m/{i}.txt", b"x") for i in range(101)])
    assert "more than 100 members" in fail_members(tmp_path, archive, 100)


def fail_members(tmp_path: Path, archive: Path, max_members: int) -> str:
    with pytest.raises(ArchiveError) as caught:
        unpack_archive(archive, tmp_path / "out", LIMIT, max_members=max_members)
    assert sorted(os.listdir(tmp_path)) == [archive.name]
    return caught.value.message
