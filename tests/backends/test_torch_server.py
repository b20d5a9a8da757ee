"""A real server on a repository with TorchScript models, queried with tritonclient.http and checked against torch.

One server for the module (like the start_server fixture, module-scoped): a batching TorchScript model, a
Triton-named one with tuple outputs, sequence models (controls; implicit state) named as Triton's pytorch backend
names them, and a model.pt of garbage bytes that must fail alone.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import requests
import torch
import tritonclient.http as httpclient

from tests.server import ServerProcess

pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit:DeprecationWarning")

AFFINE_CONFIG = """
platform: "pytorch_libtorch"
max_batch_size: 8
dynamic_batching { max_queue_delay_microseconds: 20000 }
input [
  { name: "features" data_type: TYPE_FP32 dims: [ 4 ] },
  { name: "shift" data_type: TYPE_FP32 dims: [ 2 ] }
]
output [ { name: "scores" data_type: TYPE_FP32 dims: [ 2 ] } ]
"""
ADD_SUB_CONFIG = """
backend: "pytorch"
max_batch_size: 4
input [ { name: "INPUT__0" data_type: TYPE_INT64 dims: [ 3 ] }, { name: "INPUT__1" data_type: TYPE_INT64 dims: [ 3 ] } ]
output [
  { name: "OUTPUT__1" data_type: TYPE_INT64 dims: [ 3 ] },
  { name: "OUTPUT__0" data_type: TYPE_INT64 dims: [ 3 ] }
]
"""

CONTROLS_CONFIG = """
backend: "pytorch"
max_batch_size: 4
sequence_batching {
  max_sequence_idle_microseconds: 60000000
  control_input [
    { name: "START__1" control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] } ] },
    { name: "READY__2" control [ { kind: CONTROL_SEQUENCE_READY int32_false_true: [ 0, 1 ] } ] }
  ]
}
input [ { name: "INPUT__0" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUTPUT__0" data_type: TYPE_INT32 dims: [ 1 ] } ]
"""
STATE_CONFIG = """
backend: "pytorch"
max_batch_size: 4
sequence_batching {
  max_sequence_idle_microseconds: 60000000
  control_input [ { name: "START__1" control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] } ] } ]
  state [ { input_name: "SUM_IN__2" output_name: "SUM_OUT__1" data_type: TYPE_INT32 dims: [ 1 ]
            initial_state { name: "zero" data_type: TYPE_INT32 dims: [ 1 ] zero_data: true } } ]
}
input [ { name: "INPUT__0" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUTPUT__0" data_type: TYPE_INT32 dims: [ 1 ] } ]
"""


class Controls(torch.nn.Module):
    def forward(self, value: torch.Tensor, start: torch.Tensor, ready: torch.Tensor) -> torch.Tensor:
        return value + 100 * start + 10 * ready


class RunningSum(torch.nn.Module):
    def forward(self, value: torch.Tensor, start: torch.Tensor,
                total: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        total = torch.where(start == 1, value, total + value)
        return total, total


class Affine(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.linear = torch.nn.Linear(4, 2)

    def forward(self, features: torch.Tensor, shift: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.linear(features)) + shift


class AddSub(torch.nn.Module):
    def forward(self, a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return a + b, a - b


def write(repository: Path, name: str, config: str, module: torch.nn.Module | None) -> Path:
    """repository/name/config.pbtxt and repository/name/1/model.pt (garbage bytes when module is None)."""
    (repository / name / "1").mkdir(parents=True)
    (repository / name / "config.pbtxt").write_text(config)
    path = repository / name / "1" / "model.pt"
    if module is None:
        path.write_bytes(np.random.default_rng(5).bytes(4096))
    else:
        torch.jit.script(module).save(str(path))
    return path


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("torch_repo")
    write(root, "affine", AFFINE_CONFIG, Affine())
    write(root, "add_sub", ADD_SUB_CONFIG, AddSub())
    write(root, "affine_any_width", AFFINE_CONFIG.replace("dims: [ 4 ]", "dims: [ -1 ]"), Affine())
    write(root, "broken", AFFINE_CONFIG, None)
    write(root, "controls", CONTROLS_CONFIG, Controls())
    write(root, "running_sum", STATE_CONFIG, RunningSum())
    return root


@pytest.fixture(scope="module")
def server(repository: Path) -> Iterator[ServerProcess]:
    process = ServerProcess(repository)
    try:
        for attempt in range(3):
            try:
                process.wait_ready()
                break
            except requests.Timeout:  # wait_ready gives up on a 1 s read timeout; a busy box may answer slower
                if attempt == 2:
                    raise
        yield process
    finally:
        process.stop()


@pytest.fixture
def client(server: ServerProcess) -> Iterator[httpclient.InferenceServerClient]:
    client = httpclient.InferenceServerClient(server.url, concurrency=4)
    yield client
    client.close()


def affine_inputs(features: np.ndarray, shift: np.ndarray) -> list[httpclient.InferInput]:
    inputs = [httpclient.InferInput("features", list(features.shape), "FP32"),
              httpclient.InferInput("shift", list(shift.shape), "FP32")]
    inputs[0].set_data_from_numpy(features)
    inputs[1].set_data_from_numpy(shift)
    return inputs


def torch_run(path: Path, *arrays: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        return torch.jit.load(str(path))(*(torch.from_numpy(a) for a in arrays)).numpy()


def test_concurrent_requests_batch_and_match_torch(
    repository: Path, server: ServerProcess, client: httpclient.InferenceServerClient
) -> None:
    rng = np.random.default_rng(0)
    requests_sent = [(rng.random((rows, 4), dtype=np.float32), rng.random((rows, 2), dtype=np.float32))
                     for rows in (1, 3, 2, 1, 4, 1)]
    pending = [client.async_infer("affine", affine_inputs(f, s)) for f, s in requests_sent]
    model = repository / "affine" / "1" / "model.pt"
    for (features, shift), request in zip(requests_sent, pending):
        scores = request.get_result().as_numpy("scores")
        assert scores.dtype == np.float32 and scores.shape == (len(features), 2)
        np.testing.assert_allclose(scores, torch_run(model, features, shift), rtol=1e-6, atol=1e-7)
    statistics = client.get_inference_statistics("affine")["model_stats"][0]
    assert statistics["inference_count"] == 12
    assert statistics["execution_count"] < 6  # the 20 ms window put some requests in one batch


def test_triton_named_tensors_with_tuple_outputs(
    repository: Path, client: httpclient.InferenceServerClient
) -> None:
    a, b = np.arange(6, dtype=np.int64).reshape(2, 3), np.full((2, 3), 10, np.int64)
    inputs = [httpclient.InferInput("INPUT__0", [2, 3], "INT64"), httpclient.InferInput("INPUT__1", [2, 3], "INT64")]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(b)
    result = client.infer("add_sub", inputs)
    with torch.no_grad():
        total, difference = torch.jit.load(str(repository / "add_sub" / "1" / "model.pt"))(
            torch.from_numpy(a), torch.from_numpy(b))
    np.testing.assert_array_equal(result.as_numpy("OUTPUT__0"), total.numpy())
    np.testing.assert_array_equal(result.as_numpy("OUTPUT__1"), difference.numpy())


def test_metadata_is_the_config(client: httpclient.InferenceServerClient) -> None:
    metadata = client.get_model_metadata("affine")
    assert metadata["platform"] == "pytorch_libtorch"
    assert metadata["inputs"] == [
        {"name": "features", "datatype": "FP32", "shape": [-1, 4]},
        {"name": "shift", "datatype": "FP32", "shape": [-1, 2]},
    ]
    assert metadata["outputs"] == [{"name": "scores", "datatype": "FP32", "shape": [-1, 2]}]


def test_input_the_data_plane_rejects_is_400(server: ServerProcess) -> None:
    body = {"inputs": [
        {"name": "features", "datatype": "FP32", "shape": [1, 3], "data": [1, 2, 3]},
        {"name": "shift", "datatype": "FP32", "shape": [1, 2], "data": [0, 0]},
    ]}
    response = requests.post(f"{server.base}/v2/models/affine/infer", json=body, timeout=30)
    assert response.status_code == 400
    assert "input 'features' has shape [1,3]" in response.json()["error"]


def test_input_only_the_model_rejects_is_400(server: ServerProcess) -> None:
    body = {"inputs": [
        {"name": "features", "datatype": "FP32", "shape": [1, 3], "data": [1, 2, 3]},
        {"name": "shift", "datatype": "FP32", "shape": [1, 2], "data": [0, 0]},
    ]}
    response = requests.post(f"{server.base}/v2/models/affine_any_width/infer", json=body, timeout=30)
    assert response.status_code == 400
    assert response.json()["error"] == (
        "pytorch model 'affine_any_width' cannot run inputs features float32 [1,3], shift float32 [1,2]: "
        "mat1 and mat2 shapes cannot be multiplied (1x3 and 4x2)"
    )


def test_broken_model_fails_alone_with_a_reason(
    server: ServerProcess, client: httpclient.InferenceServerClient
) -> None:
    response = requests.post(f"{server.base}/v2/repository/index", json={}, timeout=30)
    assert response.status_code == 200
    entries = {entry["name"]: entry for entry in response.json()}
    assert entries["affine"]["state"] == "READY" and entries["add_sub"]["state"] == "READY"
    assert entries["broken"]["state"] == "UNAVAILABLE"
    reason = entries["broken"]["reason"]
    assert "broken/1/model.pt as TorchScript" in reason and "PytorchStreamReader failed" in reason, reason
    assert client.is_model_ready("affine") and not client.is_model_ready("broken")
    assert client.is_server_ready()


@pytest.mark.parametrize(("model", "expected"), [("controls", [111, 12, 13]), ("running_sum", [1, 3, 6])])
def test_sequence_controls_and_state_reach_forward_by_their_index(
    client: httpclient.InferenceServerClient, model: str, expected: list[int]
) -> None:
    # As Triton's pytorch backend: START__1, READY__2 and the state's SUM_IN__2 / SUM_OUT__1 are forward()'s
    # arguments and results at those positions (Triton's QA sequence models are named so).
    answers = []
    for step, value in enumerate([1, 2, 3]):
        data = httpclient.InferInput("INPUT__0", [1, 1], "INT32")
        data.set_data_from_numpy(np.array([[value]], np.int32))
        result = client.infer(model, [data], sequence_id=7, sequence_start=step == 0, sequence_end=step == 2)
        answers.append(int(result.as_numpy("OUTPUT__0")[0, 0]))
    assert answers == expected
