from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.s3_server import MotoS3Server, fake_aws_environment


@pytest.fixture(scope="session")
def s3_server() -> Iterator[MotoS3Server]:
    """One moto S3 server for the session."""
    server = MotoS3Server().start()
    yield server
    server.stop()


@pytest.fixture
def s3(s3_server: MotoS3Server, monkeypatch: pytest.MonkeyPatch) -> MotoS3Server:
    """The session's S3 server, emptied, with fake AWS credentials and region in the environment."""
    fake_aws_environment(monkeypatch)
    s3_server.reset()
    return s3_server
