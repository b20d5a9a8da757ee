from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.server import ServerProcess


@pytest.fixture(scope="session")
def example_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """The built-in example repository (rank, deepfm, tiny), served once for the session."""
    server = ServerProcess(None, cache_dir=tmp_path_factory.mktemp("cache")).wait_ready()
    yield server
    server.stop()


@pytest.fixture
def start_server() -> Iterator:
    """Factory: start_server(repository, *args) -> a ready ServerProcess, stopped after the test."""
    servers: list[ServerProcess] = []

    def start(repository: Path | str | None, *args: str, ready_path: str = "/v2/health/ready",
              env: dict[str, str] | None = None) -> ServerProcess:
        server = ServerProcess(repository, *args, env=env)
        servers.append(server)
        server.wait_ready(path=ready_path)
        if ready_path == "/v2/health/live" and "--sagemaker-port" not in args:
            # Liveness answers while the models at start load; the SageMaker site binds after them.
            server.wait_listening(server.sagemaker_port)
        return server

    yield start
    for server in servers:
        server.stop()


@pytest.fixture(autouse=True)
def fresh_client_log() -> None:
    """Each test starts with full log-rate buckets: lines an earlier test caused must not silence its own."""
    from modelhost import client_log
    from modelhost.settings import ServerSettings

    client_log.configure(ServerSettings().client_log_lines_per_second)
