"""SavedModels served end to end: one server for the module, queried over KServe V2 (tritonclient.http) and
TF Serving REST `:predict`; every answer is checked against the SavedModel run by TF directly.

Repository: `tf_auto` has no config.pbtxt (auto-completed from serving_default); `tf_strings` has one that
names the SavedModel's "upper" signature and declares its string tensors.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import requests

pytest.importorskip("tensorflow")

import tritonclient.http as httpclient  # noqa: E402

from tests.backends.test_tensorflow_backend import run_directly, save_dense_model  # noqa: E402
from tests.server import ServerProcess  # noqa: E402

STRINGS_CONFIG = """
platform: "tensorflow_savedmodel"
max_batch_size: 0
parameters { key: "TF_SIGNATURE_DEF" value: { string_value: "upper" } }
input [ { name: "s" data_type: TYPE_STRING dims: [ -1 ] } ]
output [
  { name: "upper" data_type: TYPE_STRING dims: [ -1 ] },
  { name: "length" data_type: TYPE_INT32 dims: [ -1 ] }
]
"""


@pytest.fixture(scope="module")
def saved_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_dense_model(tmp_path_factory.mktemp("direct") / "model.savedmodel")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, saved_model: Path) -> Iterator[ServerProcess]:
    repository = tmp_path_factory.mktemp("tf-repository")
    for name in ("tf_auto", "tf_strings"):
        (repository / name / "1").mkdir(parents=True)
        save_dense_model(repository / name / "1" / "model.savedmodel")
    (repository / "tf_strings" / "config.pbtxt").write_text(STRINGS_CONFIG)
    # TF Serving's own layout: the version directory is the SavedModel (1/saved_model.pb), no config.
    save_dense_model(repository / "tf_serving_layout" / "1")
    server = ServerProcess(repository).wait_ready(timeout=120)
    yield server
    server.stop()


@pytest.fixture(scope="module")
def client(server: ServerProcess) -> Iterator[httpclient.InferenceServerClient]:
    client = httpclient.InferenceServerClient(server.url)
    yield client
    client.close()


def test_savedmodel_without_config_is_auto_completed(client: httpclient.InferenceServerClient) -> None:
    config = client.get_model_config("tf_auto")
    assert (config["platform"], config["backend"]) == ("tensorflow_savedmodel", "tensorflow")
    assert config["max_batch_size"] == 4
    assert [(t["name"], t["data_type"], t["dims"]) for t in config["input"]] == [("x", "TYPE_FP32", [3])]
    assert [(t["name"], t["data_type"], t["dims"]) for t in config["output"]] == [
        ("total", "TYPE_FP32", [1]), ("y", "TYPE_FP32", [2])]
    metadata = client.get_model_metadata("tf_auto")
    assert metadata["platform"] == "tensorflow_savedmodel"
    assert metadata["inputs"] == [{"name": "x", "datatype": "FP32", "shape": [-1, 3]}]


def test_v2_infer_matches_tensorflow(client: httpclient.InferenceServerClient, saved_model: Path) -> None:
    x = np.random.default_rng(7).normal(size=(3, 3)).astype(np.float32)
    infer_input = httpclient.InferInput("x", list(x.shape), "FP32")
    infer_input.set_data_from_numpy(x, binary_data=True)
    result = client.infer("tf_auto", [infer_input])
    expected = run_directly(saved_model, "serving_default", x=x)
    np.testing.assert_array_equal(result.as_numpy("y"), expected["y"])
    np.testing.assert_array_equal(result.as_numpy("total").reshape(-1), expected["total"])


def test_v2_infer_runs_the_configured_signature_on_strings(
    client: httpclient.InferenceServerClient, saved_model: Path
) -> None:
    s = np.array([b"tf serving", b"", b"\xc3\xa9t\xc3\xa9", b"\xff raw"], dtype=object)
    infer_input = httpclient.InferInput("s", [len(s)], "BYTES")
    infer_input.set_data_from_numpy(s, binary_data=True)
    outputs = [httpclient.InferRequestedOutput("upper"), httpclient.InferRequestedOutput("length")]
    result = client.infer("tf_strings", [infer_input], outputs=outputs)
    expected = run_directly(saved_model, "upper", s=s)
    assert result.as_numpy("upper").tolist() == expected["upper"].tolist()
    np.testing.assert_array_equal(result.as_numpy("length"), expected["length"])


@pytest.mark.parametrize("model", ["tf_auto", "tf_serving_layout"])
def test_tfserving_predict_rows_match_tensorflow(server: ServerProcess, saved_model: Path, model: str) -> None:
    x = np.array([[1.0, 2.0, 3.0], [-0.5, 0.25, 8.0]], np.float32)
    response = requests.post(f"{server.base}/v1/models/{model}:predict", json={"instances": x.tolist()}, timeout=30)
    assert response.status_code == 200, response.text
    expected = run_directly(saved_model, "serving_default", x=x)
    predictions = response.json()["predictions"]
    assert [sorted(row) for row in predictions] == [["total", "y"]] * 2
    np.testing.assert_allclose([row["y"] for row in predictions], expected["y"], rtol=1e-6)
    # Auto-complete gives the [batch] output "total" dims [1] with reshape [] (Triton's way, which V2 shows as
    # [batch, 1]); TF Serving's API shows tensors as the model declares them: one bare number per row.
    np.testing.assert_allclose([row["total"] for row in predictions], expected["total"], rtol=1e-6)


def test_tfserving_predict_columnar_strings_match_tensorflow(server: ServerProcess, saved_model: Path) -> None:
    strings = ["TensorFlow", "serving", "ünï"]
    url = f"{server.base}/v1/models/tf_strings/versions/1:predict"
    # The config serves "upper" over V2; TF Serving's API runs the signature a request names (serving_default
    # when it names none), as TF Serving does.
    response = requests.post(url, json={"signature_name": "upper", "inputs": {"s": strings}}, timeout=30)
    assert response.status_code == 200, response.text
    expected = run_directly(saved_model, "upper", s=np.array([v.encode() for v in strings], dtype=object))
    outputs = response.json()["outputs"]
    assert outputs["upper"] == [v.decode() for v in expected["upper"]]
    assert outputs["length"] == expected["length"].tolist()
