"""request_split_size end to end: a 500-row request split into chunks answers exactly what one run does."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
import tritonclient.http as httpclient

from modelhost.example_repository import RANK_FEATURES, write_example_repository
from tests.server import ServerProcess

SPLIT = 'parameters { key: "request_split_size" value: { string_value: "125" } }'


@pytest.fixture(scope="module")
def split_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServerProcess, Path]]:
    repository = write_example_repository(tmp_path_factory.mktemp("split-repository"))
    config = repository / "rank" / "config.pbtxt"
    config.write_text(config.read_text().replace("count: 1", "count: 2") + SPLIT + "\n")
    server = ServerProcess(repository).wait_ready()
    yield server, repository
    server.stop()


@pytest.mark.parametrize("rows", [500, 126, 125, 3])
def test_split_request_matches_one_run(split_server: tuple[ServerProcess, Path], rows: int) -> None:
    server, repository = split_server
    client = httpclient.InferenceServerClient(server.url)
    before = client.get_inference_statistics("rank")["model_stats"][0]
    features = np.random.default_rng(rows).standard_normal((rows, RANK_FEATURES)).astype(np.float32)
    inputs = [httpclient.InferInput("features", list(features.shape), "FP32")]
    inputs[0].set_data_from_numpy(features)
    scores = client.infer("rank", inputs).as_numpy("score")
    session = ort.InferenceSession(str(repository / "rank" / "1" / "model.onnx"), providers=["CPUExecutionProvider"])
    [expected] = session.run(["score"], {"features": features})
    np.testing.assert_allclose(scores, expected, rtol=1e-5, atol=1e-6)
    after = client.get_inference_statistics("rank")["model_stats"][0]
    chunks = -(-rows // 125)
    assert after["execution_count"] - before["execution_count"] == chunks
    assert after["inference_count"] - before["inference_count"] == rows
    success = after["inference_stats"]["success"]["count"] - before["inference_stats"]["success"]["count"]
    assert success == 1  # one request, however many chunks
