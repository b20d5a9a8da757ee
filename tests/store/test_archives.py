"""check_target, LocalArchiveStore and open_archive_store on real directories."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from modelhost.errors import ErrorKind, ModelhostError
from modelhost.store.archive_store import LocalArchiveStore, check_target, open_archive_store
from modelhost.store.s3 import S3ArchiveStore
from tests.s3_server import fake_aws_environment


@pytest.mark.parametrize(
    ("target", "normalized"),
    [("model.tar.gz", "model.tar.gz"), ("dir/model-17.tar.gz", "dir/model-17.tar.gz"),
     ("./dir/./m.tar.gz", "dir/m.tar.gz"), ("a" * 1024, "a" * 1024), ("名前/モデル.tar.gz", "名前/モデル.tar.gz")],
)
def test_check_target_accepts_relative_paths(target: str, normalized: str) -> None:
    assert check_target(target) == normalized


@pytest.mark.parametrize(
    ("target", "problem"),
    [("", "1 to 1024 characters, got 0"), ("a" * 1025, "1 to 1024 characters, got 1025"),
     ("/etc/passwd", "relative path"), ("../secret.tar.gz", "'..'"), ("dir/../../x.tar.gz", "'..'"),
     ("dir\\..\\x.tar.gz", "backslash"), ("C:\\models\\m.tar.gz", "backslash"), ("dir//m.tar.gz", "empty path"),
     ("dir/", "empty path"), (".", "names no file"), ("m\x00.tar.gz", "control characters"),
     ("m\n.tar.gz", "control characters")],
)
def test_check_target_rejects(target: str, problem: str) -> None:
    with pytest.raises(ModelhostError) as caught:
        check_target(target)
    assert caught.value.kind is ErrorKind.INVALID_INPUT
    assert "target model" in caught.value.message and problem in caught.value.message


@pytest.fixture
def archives(tmp_path: Path) -> Path:
    root = tmp_path / "archives"
    for relative, content in [("a.tar.gz", b"A"), ("dir/b.tar.gz", b"B" * 5000), ("dir/sub/c.tar.gz", b"C"),
                              ("dir/notes.txt", b"-"), (".hidden/d.tar.gz", b"D")]:
        (root / relative).parent.mkdir(parents=True, exist_ok=True)
        (root / relative).write_bytes(content)
    (root / "looks.tar.gz").mkdir()  # a directory is not an archive
    return root


def test_local_store_lists_archives(archives: Path) -> None:
    assert LocalArchiveStore(archives).list() == ["a.tar.gz", "dir/b.tar.gz", "dir/sub/c.tar.gz"]


def test_local_store_downloads_a_copy(archives: Path, tmp_path: Path) -> None:
    into = tmp_path / "downloads"
    path = LocalArchiveStore(archives).download("./dir/b.tar.gz", into)
    assert path == into / "b.tar.gz"
    assert path.read_bytes() == b"B" * 5000
    assert os.listdir(into) == ["b.tar.gz"]  # the temp file was renamed, not left beside it


def test_local_store_reads_archives_in_place(archives: Path) -> None:
    store = LocalArchiveStore(archives)
    assert store.local_path("./dir/b.tar.gz") == archives / "dir" / "b.tar.gz"
    for target, kind in (("missing.tar.gz", ErrorKind.NOT_FOUND), ("../a.tar.gz", ErrorKind.INVALID_INPUT)):
        with pytest.raises(ModelhostError) as caught:
            store.local_path(target)
        assert caught.value.kind is kind


def test_local_store_downloads_concurrently(archives: Path, tmp_path: Path) -> None:
    store = LocalArchiveStore(archives)
    results: list[Path] = []
    threads = [threading.Thread(target=lambda i=i: results.append(store.download("dir/b.tar.gz", tmp_path / str(i))))
               for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(path.read_bytes() for path in results) == [b"B" * 5000] * 8


@pytest.mark.parametrize("target", ["missing.tar.gz", "dir/notes.tar.gz", "looks.tar.gz"])
def test_local_store_missing_archive_is_not_found(archives: Path, tmp_path: Path, target: str) -> None:
    with pytest.raises(ModelhostError) as caught:
        LocalArchiveStore(archives).download(target, tmp_path / "downloads")
    assert caught.value.kind is ErrorKind.NOT_FOUND
    assert caught.value.message == f"model archive '{target}' not found in {archives}"
    assert not (tmp_path / "downloads").exists() or os.listdir(tmp_path / "downloads") == []


def test_local_store_rejects_traversal(archives: Path, tmp_path: Path) -> None:
    (tmp_path / "secret.tar.gz").write_bytes(b"secret")
    with pytest.raises(ModelhostError) as caught:
        LocalArchiveStore(archives).download("../secret.tar.gz", tmp_path / "downloads")
    assert caught.value.kind is ErrorKind.INVALID_INPUT


def test_open_archive_store_local(archives: Path) -> None:
    store = open_archive_store(str(archives))
    assert isinstance(store, LocalArchiveStore)
    assert store.description == str(archives)


def test_open_archive_store_missing_directory(tmp_path: Path) -> None:
    with pytest.raises(ModelhostError) as caught:
        open_archive_store(str(tmp_path / "nope"))
    assert caught.value.kind is ErrorKind.INVALID_INPUT
    assert "does not exist" in caught.value.message


@pytest.mark.parametrize(
    ("location", "bucket", "prefix"),
    [("s3://bucket/some/prefix/", "bucket", "some/prefix"), ("s3://bucket", "bucket", ""), ("s3://b/p", "b", "p")],
)
def test_open_archive_store_s3(location: str, bucket: str, prefix: str, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_aws_environment(monkeypatch)
    store = open_archive_store(location, endpoint_url="http://127.0.0.1:9")
    assert isinstance(store, S3ArchiveStore)
    assert (store.bucket, store.prefix, store.description) == (bucket, prefix, f"s3://{bucket}/{prefix}")


def test_open_archive_store_s3_needs_a_bucket() -> None:
    with pytest.raises(ModelhostError, match="names no bucket"):
        open_archive_store("s3:///prefix")
