"""One server for the gRPC tests, on the repository of models.py (package scope), its clients."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.grpc import service_pb2_grpc

from tests.onnx_models import loop_iterations_for
from tests.protocols.grpc.models import (
    BLOCK_SECONDS,
    S,
    Served,
    build_repository,
    infer_slow,
)
from tests.server import ServerProcess


@pytest.fixture(scope="package")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_repository(tmp_path_factory.mktemp("grpc-repository"))


@pytest.fixture(scope="package")
def served(repository: Path) -> Iterator[Served]:
    server = ServerProcess(repository, "--strict-readiness").wait_ready()
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        x = np.zeros((1, S, S), np.float32)
        yield Served(server, client, loop_iterations_for(BLOCK_SECONDS, lambda n: infer_slow(client, x, n)))
    finally:
        client.close()
        server.stop()


@pytest.fixture
def client(served: Served) -> grpcclient.InferenceServerClient:
    return served.client


@pytest.fixture(scope="package")
def stub(served: Served) -> Iterator[service_pb2_grpc.GRPCInferenceServiceStub]:
    channel = grpc.insecure_channel(served.server.grpc_url)
    yield service_pb2_grpc.GRPCInferenceServiceStub(channel)
    channel.close()


