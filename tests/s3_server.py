"""moto's standalone S3 server on 127.0.0.1 for tests: real HTTP, real boto3 clients.

Use the `s3_server` fixture from tests/store/conftest.py, or from any test package:

    server = MotoS3Server().start()      # once per session; server.stop() at the end
    fake_aws_environment(monkeypatch)    # per test: fake credentials and region, no host config
    server.client().create_bucket(Bucket="models")
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import boto3
import pytest
import requests
from moto.server import ThreadedMotoServer

REGION = "us-east-1"
FAKE_ENVIRONMENT = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": REGION,
    "AWS_EC2_METADATA_DISABLED": "true",
    "AWS_CONFIG_FILE": "/nonexistent/aws-config",
    "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent/aws-credentials",
}
_HOST_AWS_VARIABLES = (
    "AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3",
)


def fake_aws_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fake credentials and region for boto3; nothing from the host's AWS setup leaks in."""
    for name in _HOST_AWS_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    for name, value in FAKE_ENVIRONMENT.items():
        monkeypatch.setenv(name, value)


class MotoS3Server:
    """A ThreadedMotoServer bound to 127.0.0.1 on a free port; its state is shared until reset()."""

    def __init__(self) -> None:
        self._server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        self.endpoint_url = ""

    def start(self) -> MotoS3Server:
        self._server.start()
        host, port = self._server.get_host_and_port()
        self.endpoint_url = f"http://{host}:{port}"
        return self

    def stop(self) -> None:
        self._server.stop()

    def reset(self) -> None:
        """Forget every bucket and object."""
        requests.post(f"{self.endpoint_url}/moto-api/reset", timeout=10).raise_for_status()

    def client(self) -> Any:
        """A boto3 S3 client for this server with the fake credentials (set up buckets and objects with it)."""
        return boto3.session.Session(
            aws_access_key_id=FAKE_ENVIRONMENT["AWS_ACCESS_KEY_ID"],
            aws_secret_access_key=FAKE_ENVIRONMENT["AWS_SECRET_ACCESS_KEY"],
            region_name=REGION,
        ).client("s3", endpoint_url=self.endpoint_url)

    @contextmanager
    def checking_credentials(self) -> Iterator[None]:
        """Within the block the server authenticates requests, so unknown access keys are refused (403)."""
        self._set_unauthenticated_requests("0")
        try:
            yield
        finally:
            self._set_unauthenticated_requests("inf")

    def _set_unauthenticated_requests(self, count: str) -> None:
        response = requests.post(f"{self.endpoint_url}/moto-api/reset-auth", data=count, timeout=10)
        response.raise_for_status()
