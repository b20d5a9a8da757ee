"""Fixtures of the HTTP server tests: the `rank` model's in-process reference, its 2 MB input, and a server
with a small body limit (http_wire.LIMIT)."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import onnxruntime as ort
import pytest

from modelhost.example_repository import RANK_FEATURES
from tests.protocols.http_wire import LIMIT, Reference
from tests.server import ServerProcess


@pytest.fixture(scope="session")
def rank_reference(example_server: ServerProcess) -> Reference:
    model = example_server.example_repository / "rank" / "1" / "model.onnx"
    session = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])

    def run(features: np.ndarray) -> np.ndarray:
        return session.run(["score"], {"features": features})[0]

    return run


@pytest.fixture(scope="session")
def body_limited(example_server: ServerProcess) -> Iterator[ServerProcess]:
    """The example models, with --http-max-body-bytes 4096."""
    server = ServerProcess(example_server.example_repository, "--http-max-body-bytes", str(LIMIT)).wait_ready()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def rank_features() -> np.ndarray:
    # 500 x 1000 float32 = 2,000,000 bytes of tensor data
    return np.random.default_rng(11).standard_normal((500, RANK_FEATURES)).astype(np.float32)
