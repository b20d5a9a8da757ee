"""modelhost started as KServe starts deploy/kserve's ClusterServingRuntime for each InferenceService example.

The container's command and args are taken from the YAML as KServe's controller renders them (`{{.Name}}` is the
InferenceService's name), with what a pod has and a test machine does not swapped: /mnt/models is a directory
holding what the storage initializer would have downloaded from the example's storageUri (KServe mounts it
read-only: modelhost must write nothing there); the ports are free ones; the host is 127.0.0.1. Each server is
probed on the runtime's own probe routes and queried with tritonclient (HTTP, and gRPC on the port the example
names h2c), the answers checked against onnxruntime, torch and numpy. One server per example, started together.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import requests
import torch
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from onnx import TensorProto

from tests.deploy.kserve_manifests import MODEL_DIR, of_kind, port_flags, runtime_container
from tests.onnx_models import ADD_SUB_CONFIG, add_sub_model, identity_model, write_model
from tests.server import ServerProcess, free_port

pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit:DeprecationWarning")

DOUBLE_CONFIG = """backend: "python"
max_batch_size: 8
input [ { name: "x" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "y" data_type: TYPE_FP32 dims: [ -1 ] } ]
"""
DOUBLE_PY = """import numpy as np

class Model:
    def execute(self, inputs):
        return {"y": (inputs["x"] * 2).astype(np.float32)}
"""
SCALED_SUM_CONFIG = """platform: "pytorch_libtorch"
max_batch_size: 8
input [ { name: "INPUT__0" data_type: TYPE_FP32 dims: [ 4 ] }, { name: "INPUT__1" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUTPUT__0" data_type: TYPE_FP32 dims: [ 4 ] } ]
"""


class ScaledSum(torch.nn.Module):
    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return 3 * a + b


def onnx_model_files(models: Path) -> None:
    """s3://my-models/add-sub/: model.onnx."""
    onnx.save_model(add_sub_model(), str(models / "model.onnx"))


def repository_files(models: Path) -> None:
    """s3://my-models/repository/: three models in Triton's layout."""
    write_model(models, "add_sub", add_sub_model(), ADD_SUB_CONFIG)
    write_model(models, "identity", identity_model(TensorProto.FLOAT), None)
    (models / "double" / "1").mkdir(parents=True)
    (models / "double" / "config.pbtxt").write_text(DOUBLE_CONFIG)
    (models / "double" / "1" / "model.py").write_text(DOUBLE_PY)


def torchscript_files(models: Path) -> None:
    """s3://my-models/scaled-sum/: a Triton model directory, config.pbtxt and 1/model.pt."""
    (models / "config.pbtxt").write_text(SCALED_SUM_CONFIG)
    (models / "1").mkdir()
    torch.jit.script(ScaledSum()).save(str(models / "1" / "model.pt"))


# What each example's storageUri holds, by InferenceService name (every example needs one).
STORAGE: dict[str, Callable[[Path], None]] = {
    "add-sub": onnx_model_files, "model-repository": repository_files, "scaled-sum": torchscript_files,
}


def _listing(root: Path) -> dict[str, tuple[int, int]]:
    """Every path under `root` with its size and modification time: what a write would change."""
    return {str(path.relative_to(root)): (path.lstat().st_size, path.lstat().st_mtime_ns) for path in root.rglob("*")}


class RuntimeProcess(ServerProcess):
    """The runtime's container for one InferenceService; `ports` maps the YAML's ports to the free ones used."""

    def __init__(self, isvc_name: str, models: Path, root: Path) -> None:
        container = runtime_container()
        flags = port_flags(container["args"])
        self.ports = {port: free_port() for port in flags.values() if port}
        self.port, self.grpc_port, self.metrics_port = (self.ports[flags[f"{site}-port"]]
                                                        for site in ("http", "grpc", "metrics"))
        self.url, self.grpc_url = f"127.0.0.1:{self.port}", f"127.0.0.1:{self.grpc_port}"
        self.base = f"http://{self.url}"
        self.models, self.files_at_start = models, _listing(models)
        self.cache_dir = None

        def render(text: str) -> str:
            text = text.replace("{{.Name}}", isvc_name).replace(MODEL_DIR, str(models))
            text = text.replace("--host=0.0.0.0", "--host=127.0.0.1")
            text = re.sub(r"(-port=)(\d+)", lambda m: m[1] + str(self.ports.get(int(m[2]), m[2])), text)
            assert "{{" not in text, f"a template KServe does not fill: {text}"
            return text

        assert container["command"] == ["modelhost"]
        args = [sys.executable, "-m", "modelhost", *map(render, container["args"])]
        # Absolute paths in the environment (the work directory) go under this test's directory.
        env = {**os.environ, **{v["name"]: str(root / v["value"].lstrip("/")) if v["value"].startswith("/")
                                else render(v["value"]) for v in container.get("env", [])}}
        self._spawn(args, env)

    def probe_url(self, probe: str) -> str:
        get = runtime_container()[probe]["httpGet"]
        return f"http://127.0.0.1:{self.ports[get['port']]}{get['path']}"


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, RuntimeProcess]]:
    examples = {isvc["metadata"]["name"] for isvc in of_kind("InferenceService")}
    assert examples == set(STORAGE), "each InferenceService example needs what its storageUri holds, here"
    started: dict[str, RuntimeProcess] = {}
    try:
        for name, write_files in STORAGE.items():
            root = tmp_path_factory.mktemp(name)
            models = root / "mnt-models"
            models.mkdir()
            write_files(models)
            started[name] = RuntimeProcess(name, models, root)
        for server in started.values():
            server.wait_ready(path=server.probe_url("readinessProbe"))
        yield started
    finally:
        for server in started.values():
            server.stop()


def _http_infer(server: RuntimeProcess, model: str, inputs: dict[str, np.ndarray]) -> httpclient.InferResult:
    tensors = []
    for name, value in inputs.items():
        tensor = httpclient.InferInput(name, list(value.shape), "FP32")
        tensor.set_data_from_numpy(value, binary_data=True)
        tensors.append(tensor)
    with httpclient.InferenceServerClient(server.url) as client:
        return client.infer(model, tensors)


def _onnx_answer(model: onnx.ModelProto, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    names = [output.name for output in session.get_outputs()]
    return dict(zip(names, session.run(names, inputs)))


ROWS = np.arange(32, dtype=np.float32).reshape(2, 16)
ADD_SUB_INPUTS = {"INPUT0": ROWS, "INPUT1": np.full_like(ROWS, 0.5)}


def test_probes_and_metrics_answer_on_the_runtimes_ports(servers: dict[str, RuntimeProcess]) -> None:
    server = servers["add-sub"]
    assert requests.get(server.probe_url("livenessProbe"), timeout=5).status_code == 200
    assert requests.get(server.probe_url("readinessProbe"), timeout=5).status_code == 200
    metrics = requests.get(f"http://127.0.0.1:{server.metrics_port}/metrics", timeout=5)
    assert metrics.status_code == 200 and 'model="add-sub"' in metrics.text


def test_a_single_onnx_model_is_served_as_the_inference_services_name(servers: dict[str, RuntimeProcess]) -> None:
    result = _http_infer(servers["add-sub"], "add-sub", ADD_SUB_INPUTS)
    expected = _onnx_answer(add_sub_model(), ADD_SUB_INPUTS)
    for name, value in expected.items():
        np.testing.assert_array_equal(result.as_numpy(name), value)


def test_kserve_v1_predict_is_served_on_the_same_port(servers: dict[str, RuntimeProcess]) -> None:
    """protocolVersions lists v1: KServe's v1 `:predict` takes instances and answers predictions."""
    instances = [{"INPUT0": row.tolist(), "INPUT1": [0.5] * 16} for row in ROWS]
    answer = requests.post(f"{servers['add-sub'].base}/v1/models/add-sub:predict", json={"instances": instances},
                           timeout=10)
    assert answer.status_code == 200, answer.text
    expected = _onnx_answer(add_sub_model(), ADD_SUB_INPUTS)
    predictions = answer.json()["predictions"]
    for name, value in expected.items():
        np.testing.assert_array_equal(np.array([p[name] for p in predictions], dtype=np.float32), value)


def test_a_repositorys_models_keep_their_names_over_http_and_grpc(servers: dict[str, RuntimeProcess]) -> None:
    server = servers["model-repository"]
    with httpclient.InferenceServerClient(server.url) as client:
        index = {entry["name"]: entry["state"] for entry in client.get_model_repository_index()}
    assert index == {"add_sub": "READY", "identity": "READY", "double": "READY"}
    x = np.linspace(-1, 1, 6, dtype=np.float32).reshape(2, 3)
    np.testing.assert_array_equal(_http_infer(server, "identity", {"INPUT0": x}).as_numpy("OUTPUT0"),
                                  _onnx_answer(identity_model(TensorProto.FLOAT), {"INPUT0": x})["OUTPUT0"])
    np.testing.assert_array_equal(_http_infer(server, "double", {"x": x}).as_numpy("y"), x * 2)
    tensors = []
    for name, value in ADD_SUB_INPUTS.items():
        tensor = grpcclient.InferInput(name, list(value.shape), "FP32")
        tensor.set_data_from_numpy(value)
        tensors.append(tensor)
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        result = client.infer("add_sub", tensors)
    for name, value in _onnx_answer(add_sub_model(), ADD_SUB_INPUTS).items():
        np.testing.assert_array_equal(result.as_numpy(name), value)


def test_a_torchscript_model_directory_is_served_as_the_inference_services_name(
        servers: dict[str, RuntimeProcess]) -> None:
    a = np.arange(8, dtype=np.float32).reshape(2, 4)
    b = np.full_like(a, -1.5)
    result = _http_infer(servers["scaled-sum"], "scaled-sum", {"INPUT__0": a, "INPUT__1": b})
    expected = ScaledSum()(torch.from_numpy(a), torch.from_numpy(b)).numpy()
    np.testing.assert_array_equal(result.as_numpy("OUTPUT__0"), expected)


def test_nothing_is_written_to_the_model_directory(servers: dict[str, RuntimeProcess]) -> None:
    """KServe mounts /mnt/models read-only (and a root test run could write there anyway): checked after the
    other tests, with the servers still up."""
    for server in servers.values():
        assert _listing(server.models) == server.files_at_start
