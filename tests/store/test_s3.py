"""S3ArchiveStore against moto's standalone server over real HTTP."""

from __future__ import annotations

import os
import socket
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from modelhost.errors import ErrorKind, ModelhostError
from modelhost.store.archive_store import open_archive_store
from modelhost.store.s3 import S3ArchiveStore
from tests.s3_server import MotoS3Server

KEYS = {
    "models/a.tar.gz": b"A",
    "models/dir/model-17.tar.gz": os.urandom(300_000),
    "models/dir/sub/c.tar.gz": b"C",
    "models/dir/readme.txt": b"not an archive",
    "models-other/x.tar.gz": b"X",  # shares the prefix string, not the prefix "directory"
    "top.tar.gz": b"T",
}


@pytest.fixture
def bucket(s3: MotoS3Server) -> str:
    client = s3.client()
    client.create_bucket(Bucket="archives")
    for key, body in KEYS.items():
        client.put_object(Bucket="archives", Key=key, Body=body)
    return "archives"


def raises(kind: ErrorKind, call: object, *args: object) -> str:
    with pytest.raises(ModelhostError) as caught:
        call(*args)  # type: ignore[operator]
    assert caught.value.kind is kind, caught.value.message
    return caught.value.message


@pytest.mark.parametrize("prefix", ["models", "models/", "/models/"])
def test_lists_archives_under_the_prefix(s3: MotoS3Server, bucket: str, prefix: str) -> None:
    store = S3ArchiveStore(bucket, prefix, s3.endpoint_url)
    assert store.description == "s3://archives/models"
    assert store.list() == ["a.tar.gz", "dir/model-17.tar.gz", "dir/sub/c.tar.gz"]


def test_lists_the_whole_bucket_without_a_prefix(s3: MotoS3Server, bucket: str) -> None:
    assert S3ArchiveStore(bucket, "", s3.endpoint_url).list() == [
        "models-other/x.tar.gz", "models/a.tar.gz", "models/dir/model-17.tar.gz", "models/dir/sub/c.tar.gz",
        "top.tar.gz",
    ]


def test_downloads_an_archive(s3: MotoS3Server, bucket: str, tmp_path: Path) -> None:
    store = open_archive_store("s3://archives/models/", endpoint_url=s3.endpoint_url)
    path = store.download("dir/model-17.tar.gz", tmp_path / "downloads")
    assert path == tmp_path / "downloads" / "model-17.tar.gz"
    assert path.read_bytes() == KEYS["models/dir/model-17.tar.gz"]
    assert os.listdir(tmp_path / "downloads") == ["model-17.tar.gz"]


def test_one_store_downloads_from_several_threads(s3: MotoS3Server, bucket: str, tmp_path: Path) -> None:
    store = S3ArchiveStore(bucket, "models", s3.endpoint_url)
    targets = ["a.tar.gz", "dir/model-17.tar.gz", "dir/sub/c.tar.gz"] * 3
    with ThreadPoolExecutor(len(targets)) as pool:
        paths = list(pool.map(lambda item: store.download(item[1], tmp_path / str(item[0])), enumerate(targets)))
    assert [path.read_bytes() for path in paths] == [KEYS[f"models/{target}"] for target in targets]


def test_missing_key_is_not_found(s3: MotoS3Server, bucket: str, tmp_path: Path) -> None:
    store = S3ArchiveStore(bucket, "models", s3.endpoint_url)
    message = raises(ErrorKind.NOT_FOUND, store.download, "dir/missing.tar.gz", tmp_path / "downloads")
    assert message == "model archive 'dir/missing.tar.gz' not found in s3://archives/models"
    assert os.listdir(tmp_path / "downloads") == []  # no partial file


def test_missing_bucket_is_not_found(s3: MotoS3Server, tmp_path: Path) -> None:
    store = S3ArchiveStore("no-such-bucket", "models", s3.endpoint_url)
    assert "s3://no-such-bucket/models" in raises(ErrorKind.NOT_FOUND, store.download, "a.tar.gz", tmp_path)
    assert "does not exist" in raises(ErrorKind.NOT_FOUND, store.list)


def test_invalid_target_is_rejected_before_any_request(s3: MotoS3Server, bucket: str, tmp_path: Path) -> None:
    store = S3ArchiveStore(bucket, "models", s3.endpoint_url)
    assert "'..'" in raises(ErrorKind.INVALID_INPUT, store.download, "../top.tar.gz", tmp_path)


def test_refused_credentials_are_unavailable(s3: MotoS3Server, bucket: str, tmp_path: Path) -> None:
    store = S3ArchiveStore(bucket, "models", s3.endpoint_url)
    with s3.checking_credentials():
        message = raises(ErrorKind.UNAVAILABLE, store.download, "a.tar.gz", tmp_path)
        assert "s3://archives/models" in message and "403" in message
        assert "InvalidAccessKeyId" in raises(ErrorKind.UNAVAILABLE, store.list)


def test_missing_credentials_are_unavailable(s3: MotoS3Server, bucket: str, tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    store = S3ArchiveStore(bucket, "models", s3.endpoint_url)
    assert "Unable to locate credentials" in raises(ErrorKind.UNAVAILABLE, store.download, "a.tar.gz", tmp_path)
    assert "Unable to locate credentials" in raises(ErrorKind.UNAVAILABLE, store.list)


def test_unreachable_endpoint_is_unavailable(s3: MotoS3Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")  # boto3 would otherwise retry with backoff
    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    store = S3ArchiveStore("archives", "models", f"http://127.0.0.1:{port}")
    message = raises(ErrorKind.UNAVAILABLE, store.download, "a.tar.gz", tmp_path)
    assert "Could not connect to the endpoint URL" in message
    assert "Could not connect" in raises(ErrorKind.UNAVAILABLE, store.list)


def test_one_listing_stamps_every_archive_as_each_head_does(s3: MotoS3Server, bucket: str) -> None:
    store = S3ArchiveStore(bucket, "models", s3.endpoint_url)
    stamps = store.stamps()
    assert sorted(stamps) == store.list()
    assert stamps == {target: store.stamp(target) for target in store.list()}
    s3.client().put_object(Bucket=bucket, Key="models/a.tar.gz", Body=b"replaced")
    assert store.stamps()["a.tar.gz"] == store.stamp("a.tar.gz") != stamps["a.tar.gz"]
