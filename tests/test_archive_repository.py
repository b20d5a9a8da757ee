"""A model repository of archives end to end: every model control mode over a directory and an S3 prefix of
`<name>.tar.gz` files, with tritonclient."""

from __future__ import annotations

from pathlib import Path

import pytest
import requests
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.s3_server import FAKE_ENVIRONMENT, MotoS3Server
from tests.server import wait_for
from tests.store.test_archive_repository import model_archive, replace
from tests.test_model_control import factor, index

BUCKET = "archive-repository-live"


@pytest.fixture
def archives(tmp_path: Path) -> Path:
    root = tmp_path / "archives"
    root.mkdir()
    model_archive(root / "a.tar.gz", 2.0)
    model_archive(root / "b.tar.gz", 3.0)
    return root


def test_explicit_mode_loads_reloads_and_unloads_archives(start_server, archives: Path) -> None:  # type: ignore[no-untyped-def]
    server = start_server(archives, "--model-control-mode", "explicit", "--load-model", "a")
    with httpclient.InferenceServerClient(server.url) as client:
        assert factor(client, "a") == 2.0
        assert index(server)["b"] == [{"name": "b"}]  # listed from the store, not loaded
        client.load_model("b")
        assert factor(client, "b") == 3.0

        replace(archives / "b.tar.gz", 5.0)
        client.load_model("b")  # a load of a loaded model reloads it: the new archive
        assert factor(client, "b") == 5.0

        client.unload_model("a")
        assert index(server)["a"] == [{"name": "a", "version": "1", "state": "UNAVAILABLE", "reason": "unloaded"}]
        response = requests.post(server.base + "/v2/repository/models/absent/load", timeout=30)
        assert response.status_code == 404 and "absent.tar.gz" in response.json()["error"]
        assert str(archives) not in response.text
        response = requests.post(server.base + "/v2/repository/models/..%2Fa/load", timeout=30)
        assert response.status_code == 400 and "model name" in response.json()["error"]
        assert factor(client, "b") == 5.0


def test_poll_mode_follows_the_archives(start_server, archives: Path) -> None:  # type: ignore[no-untyped-def]
    server = start_server(archives, "--model-control-mode", "poll", "--repository-poll-secs", "0.2")
    with httpclient.InferenceServerClient(server.url) as client:
        assert factor(client, "a") == 2.0 and factor(client, "b") == 3.0
        replace(archives / "a.tar.gz", 7.0)
        wait_for(lambda: factor(client, "a") == 7.0, timeout=15, what="the replaced archive serving")
        model_archive(archives / "c.tar.gz", 11.0)
        wait_for(lambda: client.is_model_ready("c"), timeout=15, what="new archive c")
        assert factor(client, "c") == 11.0
        (archives / "b.tar.gz").unlink()
        wait_for(lambda: "b" not in index(server), timeout=15, what="archive b removed")
        with pytest.raises(InferenceServerException):
            factor(client, "b")
        assert factor(client, "a") == 7.0


def test_a_broken_replacement_archive_keeps_the_loaded_model_serving(start_server, archives: Path) -> None:  # type: ignore[no-untyped-def]
    server = start_server(archives, "--model-control-mode", "poll", "--repository-poll-secs", "0.2")
    with httpclient.InferenceServerClient(server.url) as client:
        assert factor(client, "a") == 2.0
        (archives / "a.tar.gz").write_bytes(b"not a gzip stream at all")
        wait_for(lambda: "a.tar.gz" in server.printed, timeout=15, what="the failed reload in the log")
        assert factor(client, "a") == 2.0  # the loaded version keeps serving
        assert index(server)["a"][0]["state"] == "READY"
        replace(archives / "a.tar.gz", 9.0)
        wait_for(lambda: factor(client, "a") == 9.0, timeout=15, what="the mended archive serving")


def test_an_s3_prefix_of_archives_is_a_model_repository(start_server, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    s3 = MotoS3Server().start()
    try:
        bucket = s3.client()
        bucket.create_bucket(Bucket=BUCKET)  # moto's state is the process's: a name no other test uses
        for name, value in (("a", 2.0), ("b", 3.0)):
            bucket.upload_file(str(model_archive(tmp_path / f"{name}.tar.gz", value)), BUCKET, f"prod/{name}.tar.gz")
        server = start_server(f"s3://{BUCKET}/prod", "--s3-endpoint-url", s3.endpoint_url, env=FAKE_ENVIRONMENT)
        with httpclient.InferenceServerClient(server.url) as client:
            assert factor(client, "a") == 2.0 and factor(client, "b") == 3.0
            assert sorted(index(server)) == ["a", "b"]
    finally:
        s3.stop()
