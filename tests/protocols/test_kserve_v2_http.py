"""KServe V2 over HTTP, happy paths, spoken by Triton's own client (`tritonclient.http`, unmodified).

Runs against the session's `example_server` (built-in repository: rank, deepfm, tiny). Every inference
result is checked against onnxruntime run in this process on the very model file the server loaded.
Raw `requests` calls check what the client hides: body framing, headers, nested JSON data.
"""

from __future__ import annotations

import gzip
import json
import zlib
from collections.abc import Callable, Iterator

import numpy as np
import onnxruntime as ort
import pytest
import requests
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from modelhost.example_repository import (
    DEEPFM_FIELDS,
    DEEPFM_VOCAB,
    MAX_BATCH_SIZE,
    RANK_FEATURES,
)
from tests.onnx_models import ADD_SUB_CONFIG, add_sub_model, write_model
from tests.server import ServerProcess

RTOL, ATOL = 1e-5, 1e-6
MODELS = ("rank", "deepfm", "tiny")
OUTPUTS = {"rank": "score", "deepfm": "prob", "tiny": "y"}
Reference = Callable[[str, dict[str, np.ndarray]], dict[str, np.ndarray]]


def example_inputs(model: str, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    if model == "rank":
        return {"features": rng.standard_normal((500, RANK_FEATURES)).astype(np.float32)}
    if model == "deepfm":
        return {
            "feat_ids": rng.integers(0, DEEPFM_VOCAB, (64, DEEPFM_FIELDS), dtype=np.int64),
            "feat_vals": rng.random((64, DEEPFM_FIELDS), dtype=np.float32),
        }
    if model == "tiny":
        return {"x": rng.standard_normal((7, 4)).astype(np.float32)}
    raise KeyError(model)


def infer_inputs(feeds: dict[str, np.ndarray], binary: bool = True) -> list[httpclient.InferInput]:
    inputs = []
    for name, array in feeds.items():
        datatype = "INT64" if array.dtype == np.int64 else "FP32"
        inputs.append(httpclient.InferInput(name, list(array.shape), datatype).set_data_from_numpy(array, binary))
    return inputs


@pytest.fixture(scope="module")
def client(example_server: ServerProcess) -> Iterator[httpclient.InferenceServerClient]:
    triton = httpclient.InferenceServerClient(example_server.url, network_timeout=30.0)
    yield triton
    triton.close()


@pytest.fixture(scope="module")
def reference(example_server: ServerProcess, tmp_path_factory: pytest.TempPathFactory) -> Reference:
    """reference(model, feeds) -> every output of onnxruntime run in-process on the served model file."""
    repository = example_server.example_repository
    sessions: dict[str, ort.InferenceSession] = {}

    def run(model: str, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        if model not in sessions:
            path = repository / model / "1" / "model.onnx"
            sessions[model] = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        names = [o.name for o in sessions[model].get_outputs()]
        return dict(zip(names, sessions[model].run(names, feeds)))

    return run


# --- health, metadata, config, repository ---------------------------------------------------------


def test_server_live_and_ready(client: httpclient.InferenceServerClient, example_server: ServerProcess) -> None:
    assert client.is_server_live() is True
    assert client.is_server_ready() is True
    for path in ("/v2/health/live", "/v2/health/ready"):
        response = requests.get(example_server.base + path, timeout=10)
        assert response.status_code == 200
        assert response.content == b""  # Triton: empty body


def test_server_metadata(client: httpclient.InferenceServerClient) -> None:
    metadata = client.get_server_metadata()
    assert metadata["name"] == "modelhost"
    assert isinstance(metadata["version"], str) and metadata["version"]
    extensions = metadata["extensions"]
    assert isinstance(extensions, list) and all(isinstance(e, str) for e in extensions)
    assert {"binary_tensor_data", "model_configuration", "model_repository"} <= set(extensions)
    # What modelhost does of Triton's list (its qa/L0_server_status checks it)
    assert {"sequence", "parameters", "model_repository(unload_dependents)", "classification"} <= set(extensions)
    assert "classification" in extensions


EXPECTED_METADATA = {
    "rank": ([("features", "FP32", [-1, RANK_FEATURES])], [("score", "FP32", [-1, 1])]),
    "deepfm": (
        [("feat_ids", "INT64", [-1, DEEPFM_FIELDS]), ("feat_vals", "FP32", [-1, DEEPFM_FIELDS])],
        [("prob", "FP32", [-1, 1])],
    ),
    "tiny": ([("x", "FP32", [-1, 4])], [("y", "FP32", [-1, 4])]),
}


@pytest.mark.parametrize("model", MODELS)
def test_model_metadata(client: httpclient.InferenceServerClient, model: str) -> None:
    metadata = client.get_model_metadata(model)
    assert metadata == client.get_model_metadata(model, "1")
    assert metadata["name"] == model
    assert metadata["versions"] == ["1"]
    assert metadata["platform"] == "onnxruntime_onnx"
    inputs, outputs = EXPECTED_METADATA[model]
    assert [(t["name"], t["datatype"], t["shape"]) for t in metadata["inputs"]] == inputs
    assert [(t["name"], t["datatype"], t["shape"]) for t in metadata["outputs"]] == outputs


@pytest.mark.parametrize("model", MODELS)
def test_model_ready(client: httpclient.InferenceServerClient, model: str) -> None:
    assert client.is_model_ready(model) is True
    assert client.is_model_ready(model, "1") is True
    assert client.is_model_ready(model, "2") is False


def test_unknown_model_is_not_ready(client: httpclient.InferenceServerClient) -> None:
    assert client.is_model_ready("nope") is False


@pytest.mark.parametrize("model", MODELS)
def test_model_config_uses_triton_field_names(client: httpclient.InferenceServerClient, model: str) -> None:
    config = client.get_model_config(model)
    assert config == client.get_model_config(model, "1")
    assert config["name"] == model
    assert config["platform"] == "onnxruntime_onnx"
    assert config["backend"] == "onnxruntime"
    assert config["max_batch_size"] == MAX_BATCH_SIZE
    inputs, outputs = EXPECTED_METADATA[model]
    for entries, expected in ((config["input"], inputs), (config["output"], outputs)):
        assert [(t["name"], t["data_type"]) for t in entries] == [(n, f"TYPE_{d}") for n, d, _ in expected]
        assert all("dims" in t for t in entries)
    assert config["instance_group"][0]["kind"] == "KIND_CPU"
    assert config["instance_group"][0]["count"] == 1
    assert config["version_policy"] == {"latest": {"num_versions": 1}}


def test_model_config_int64_fields_are_json_numbers(example_server: ServerProcess) -> None:
    """Triton's /config turns protobuf's int64-as-string into JSON numbers (core ModelConfigToJson, FixIntArray)."""
    for model in MODELS:
        config = requests.get(f"{example_server.base}/v2/models/{model}/config", timeout=10).json()
        inputs, outputs = EXPECTED_METADATA[model]
        assert [t["dims"] for t in config["input"]] == [shape[1:] for _, _, shape in inputs], model
        assert [t["dims"] for t in config["output"]] == [shape[1:] for _, _, shape in outputs], model


def test_repository_index(client: httpclient.InferenceServerClient, example_server: ServerProcess) -> None:
    index = client.get_model_repository_index()
    tiered = ("deepfm_tiered", "deepfm_tiered_dense", "deepfm_tiered_embedding")  # DeepFM over the embedding store
    assert index == [{"name": m, "version": "1", "state": "READY"} for m in sorted(MODELS + tiered)]
    ready_only = requests.post(f"{example_server.base}/v2/repository/index", json={"ready": True}, timeout=10)
    assert ready_only.status_code == 200
    assert ready_only.json() == index


# --- inference --------------------------------------------------------------------------------------


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
@pytest.mark.parametrize("model", MODELS)
def test_infer_matches_onnxruntime(
    client: httpclient.InferenceServerClient, reference: Reference, model: str, binary: bool
) -> None:
    feeds = example_inputs(model)
    output = OUTPUTS[model]
    # binary: the client's defaults (binary inputs, no outputs listed -> binary_data_output).
    # json: binary_data=False on every input and output, so the whole body is JSON both ways.
    outputs = None if binary else [httpclient.InferRequestedOutput(output, binary_data=False)]
    result = client.infer(model, infer_inputs(feeds, binary), outputs=outputs)

    response = result.get_response()
    assert response["model_name"] == model
    assert response["model_version"] == "1"
    assert "id" not in response  # Triton omits an empty id
    [entry] = response["outputs"]
    assert entry["name"] == output and entry["datatype"] == "FP32"
    if binary:
        assert "data" not in entry and entry["parameters"]["binary_data_size"] == 4 * np.prod(entry["shape"])
    else:
        assert "binary_data_size" not in entry.get("parameters", {}) and len(entry["data"]) == np.prod(entry["shape"])

    expected = reference(model, feeds)[output]
    actual = result.as_numpy(output)
    assert actual.dtype == np.float32
    assert actual.shape == expected.shape == (len(next(iter(feeds.values()))), 4 if model == "tiny" else 1)
    np.testing.assert_allclose(actual, expected, rtol=RTOL, atol=ATOL)


def test_infer_explicit_version(client: httpclient.InferenceServerClient, reference: Reference) -> None:
    feeds = example_inputs("tiny", seed=1)
    result = client.infer("tiny", infer_inputs(feeds), model_version="1")
    assert result.get_response()["model_version"] == "1"
    np.testing.assert_allclose(result.as_numpy("y"), reference("tiny", feeds)["y"], rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_infer_explicit_output(client: httpclient.InferenceServerClient, reference: Reference, binary: bool) -> None:
    feeds = example_inputs("deepfm", seed=2)
    outputs = [httpclient.InferRequestedOutput("prob", binary_data=binary)]
    result = client.infer("deepfm", infer_inputs(feeds), outputs=outputs)
    [entry] = result.get_response()["outputs"]
    assert ("binary_data_size" in entry.get("parameters", {})) is binary
    np.testing.assert_allclose(result.as_numpy("prob"), reference("deepfm", feeds)["prob"], rtol=RTOL, atol=ATOL)


@pytest.fixture(scope="module")
def add_sub_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """Triton's "simple" model (two outputs), for requested-output subsets."""
    repository = tmp_path_factory.mktemp("add-sub-repository")
    write_model(repository, "add_sub", add_sub_model(), 'name: "add_sub"\n' + ADD_SUB_CONFIG)
    server = ServerProcess(repository).wait_ready()
    yield server
    server.stop()


@pytest.mark.parametrize(
    "requested",
    [
        [("OUTPUT1", True)],
        [("OUTPUT0", False)],
        [("OUTPUT1", False), ("OUTPUT0", True)],
    ],
    ids=["one-binary", "one-json", "both-reversed-mixed"],
)
def test_requested_outputs_subset(add_sub_server: ServerProcess, requested: list[tuple[str, bool]]) -> None:
    rng = np.random.default_rng(3)
    a = rng.standard_normal((3, 16)).astype(np.float32)
    b = rng.standard_normal((3, 16)).astype(np.float32)
    expected = {"OUTPUT0": a + b, "OUTPUT1": a - b}
    with httpclient.InferenceServerClient(add_sub_server.url) as triton:
        outputs = [httpclient.InferRequestedOutput(name, binary_data=binary) for name, binary in requested]
        result = triton.infer("add_sub", infer_inputs({"INPUT0": a, "INPUT1": b}), outputs=outputs)
    entries = result.get_response()["outputs"]
    assert [e["name"] for e in entries] == [name for name, _ in requested]  # only those, in request order
    for entry, (name, binary) in zip(entries, requested):
        assert ("binary_data_size" in entry.get("parameters", {})) is binary
        np.testing.assert_allclose(result.as_numpy(name), expected[name], rtol=RTOL, atol=ATOL)
    for name in set(expected) - {name for name, _ in requested}:
        assert result.as_numpy(name) is None


def test_request_id_echoed(client: httpclient.InferenceServerClient, example_server: ServerProcess) -> None:
    feeds = example_inputs("tiny")
    result = client.infer("tiny", infer_inputs(feeds), request_id="req-42/é")
    assert result.get_response()["id"] == "req-42/é"

    body = {"id": "raw-7", "inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 4], "data": [1, 2, 3, 4]}]}
    response = requests.post(f"{example_server.base}/v2/models/tiny/infer", json=body, timeout=10)
    assert response.status_code == 200
    document = response.json()
    assert document["id"] == "raw-7"
    assert document["model_name"] == "tiny" and document["model_version"] == "1"


@pytest.mark.parametrize("nested", [True, False], ids=["nested", "flat"])
def test_json_data_nested_or_flat(example_server: ServerProcess, reference: Reference, nested: bool) -> None:
    feeds = example_inputs("deepfm", seed=4)
    feeds = {k: v[:3] for k, v in feeds.items()}
    body = {
        "inputs": [
            {
                "name": name,
                "datatype": "INT64" if array.dtype == np.int64 else "FP32",
                "shape": list(array.shape),
                "data": array.tolist() if nested else array.reshape(-1).tolist(),
            }
            for name, array in feeds.items()
        ]
    }
    response = requests.post(f"{example_server.base}/v2/models/deepfm/infer", json=body, timeout=10)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == "application/json"
    assert "inference-header-content-length" not in response.headers
    [entry] = response.json()["outputs"]
    assert entry["name"] == "prob" and entry["shape"] == [3, 1]
    assert all(isinstance(v, float) for v in entry["data"])  # always flat, like Triton
    actual = np.array(entry["data"], dtype=np.float32).reshape(entry["shape"])
    np.testing.assert_allclose(actual, reference("deepfm", feeds)["prob"], rtol=RTOL, atol=ATOL)


def test_binary_framing_on_the_wire(example_server: ServerProcess, reference: Reference) -> None:
    """Raw binary request and response: JSON header, then tensor bytes, located by the header lengths."""
    x = example_inputs("tiny", seed=5)["x"]
    header = json.dumps(
        {
            "inputs": [{"name": "x", "datatype": "FP32", "shape": list(x.shape),
                        "parameters": {"binary_data_size": x.nbytes}}],
            "outputs": [{"name": "y", "parameters": {"binary_data": True}}],
        }
    ).encode()
    response = requests.post(
        f"{example_server.base}/v2/models/tiny/infer",
        data=header + x.tobytes(),
        headers={"Inference-Header-Content-Length": str(len(header)), "Content-Type": "application/octet-stream"},
        timeout=10,
    )
    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == "application/octet-stream"
    json_length = int(response.headers["inference-header-content-length"])
    document = json.loads(response.content[:json_length])
    [entry] = document["outputs"]
    assert entry["parameters"]["binary_data_size"] == len(response.content) - json_length == x.nbytes
    actual = np.frombuffer(response.content[json_length:], dtype=np.float32).reshape(entry["shape"])
    np.testing.assert_allclose(actual, reference("tiny", {"x": x})["y"], rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("model", ["tiny", "rank"])
def test_raw_binary_request(example_server: ServerProcess, reference: Reference, model: str) -> None:
    """Inference-Header-Content-Length: 0: the body is the only input's data, batch 1; outputs come back binary."""
    [(name, array)] = example_inputs(model, seed=7).items()
    row = array[:1]
    response = requests.post(
        f"{example_server.base}/v2/models/{model}/infer",
        data=row.tobytes(),
        headers={"Inference-Header-Content-Length": "0"},
        timeout=10,
    )
    assert response.status_code == 200, response.text
    json_length = int(response.headers["inference-header-content-length"])
    [entry] = json.loads(response.content[:json_length])["outputs"]
    [expected] = reference(model, {name: row}).values()
    assert entry["shape"] == list(expected.shape)
    actual = np.frombuffer(response.content[json_length:], dtype=np.float32).reshape(entry["shape"])
    np.testing.assert_allclose(actual, expected, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize(
    ("model", "size", "fragment"),
    [("deepfm", 39 * 8, "got 2 inputs in 'deepfm' model configuration"), ("tiny", 6, "6 bytes does not fit input 'x'"),
     ("tiny", 32, "32 bytes does not fit input 'x'")],
)
def test_raw_binary_request_that_does_not_fit(example_server: ServerProcess, model: str, size: int,
                                              fragment: str) -> None:
    response = requests.post(
        f"{example_server.base}/v2/models/{model}/infer",
        data=b"\x00" * size,
        headers={"Inference-Header-Content-Length": "0"},
        timeout=10,
    )
    assert response.status_code == 400
    assert fragment in response.json()["error"]


@pytest.mark.parametrize("algorithm", ["gzip", "deflate"])
@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_compressed_request_body(
    client: httpclient.InferenceServerClient, reference: Reference, algorithm: str, binary: bool
) -> None:
    feeds = example_inputs("deepfm", seed=6)
    outputs = None if binary else [httpclient.InferRequestedOutput("prob", binary_data=False)]
    result = client.infer(
        "deepfm", infer_inputs(feeds, binary), outputs=outputs, request_compression_algorithm=algorithm
    )
    np.testing.assert_allclose(result.as_numpy("prob"), reference("deepfm", feeds)["prob"], rtol=RTOL, atol=ATOL)


def test_gzip_request_body_raw(example_server: ServerProcess) -> None:
    body = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 4], "data": [1, 2, 3, 4]}]}
    response = requests.post(
        f"{example_server.base}/v2/models/tiny/infer",
        data=gzip.compress(json.dumps(body).encode()),
        headers={"Content-Encoding": "gzip"},
        timeout=10,
    )
    assert response.status_code == 200, response.text
    assert response.json()["outputs"][0]["data"] == [3.0, 5.0, 7.0, 9.0]


def test_infer_error_reaches_client_as_exception(client: httpclient.InferenceServerClient) -> None:
    """tritonclient raises with the server's {"error": ...} message and status (protocols §0 #3)."""
    x = np.zeros((1, 5), np.float32)
    with pytest.raises(InferenceServerException) as caught:
        client.infer("tiny", [httpclient.InferInput("x", [1, 5], "FP32").set_data_from_numpy(x)])
    assert caught.value.status() == "400"
    assert "'x'" in caught.value.message() and "[1,5]" in caught.value.message()


@pytest.mark.parametrize("algorithm", ["gzip", "deflate"])
@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_compressed_response_body(
    client: httpclient.InferenceServerClient, reference: Reference, algorithm: str, binary: bool
) -> None:
    feeds = example_inputs("rank", seed=7)
    outputs = [httpclient.InferRequestedOutput("score", binary_data=binary)]
    result = client.infer("rank", infer_inputs(feeds, binary), outputs=outputs,
                          response_compression_algorithm=algorithm)
    np.testing.assert_allclose(result.as_numpy("score"), reference("rank", feeds)["score"], rtol=RTOL, atol=ATOL)


def test_compressed_response_through_the_asyncio_client(example_server: ServerProcess, reference: Reference) -> None:
    import asyncio

    import tritonclient.http.aio as aioclient

    feeds = example_inputs("deepfm", seed=8)

    async def infer() -> np.ndarray:
        async with aioclient.InferenceServerClient(example_server.url) as triton:
            inputs = [aioclient.InferInput(name, list(array.shape), "INT64" if array.dtype == np.int64 else "FP32")
                      .set_data_from_numpy(array) for name, array in feeds.items()]
            result = await triton.infer("deepfm", inputs, response_compression_algorithm="gzip")
            return result.as_numpy("prob")

    np.testing.assert_allclose(asyncio.run(infer()), reference("deepfm", feeds)["prob"], rtol=RTOL, atol=ATOL)


def test_compressed_response_raw(example_server: ServerProcess) -> None:
    """The body is compressed whole; Inference-Header-Content-Length is the uncompressed JSON's length."""
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    header = json.dumps({
        "inputs": [{"name": "x", "datatype": "FP32", "shape": [2, 4], "parameters": {"binary_data_size": 32}}],
        "outputs": [{"name": "y", "parameters": {"binary_data": True}}],
    }).encode()
    response = requests.post(
        f"{example_server.base}/v2/models/tiny/infer", data=header + x.tobytes(), stream=True, timeout=10,
        headers={"Inference-Header-Content-Length": str(len(header)), "Accept-Encoding": "gzip;q=0.4, deflate"},
    )
    assert response.status_code == 200
    assert response.headers["Content-Encoding"] == "deflate"
    raw = response.raw.read(decode_content=False)
    assert int(response.headers["Content-Length"]) == len(raw)
    body = zlib.decompress(raw)
    json_length = int(response.headers["Inference-Header-Content-Length"])
    assert json.loads(body[:json_length])["outputs"][0]["parameters"]["binary_data_size"] == 32
    np.testing.assert_array_equal(np.frombuffer(body[json_length:], np.float32), (2 * x + 1).ravel())


@pytest.mark.parametrize("accept", ["identity", "br", "gzip;q=0", "gzip;q=abc", "*"])
def test_response_not_compressed_unless_asked(example_server: ServerProcess, accept: str) -> None:
    body = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 4], "data": [1, 2, 3, 4]}]}
    response = requests.post(f"{example_server.base}/v2/models/tiny/infer", json=body, timeout=10,
                             headers={"Accept-Encoding": accept})
    assert response.status_code == 200
    assert "Content-Encoding" not in response.headers
    assert response.json()["outputs"][0]["data"] == [3.0, 5.0, 7.0, 9.0]
