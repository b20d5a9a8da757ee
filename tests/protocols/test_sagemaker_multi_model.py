"""SageMaker multi-model endpoints against a real server: TargetModel archives from a directory and from
S3 (moto's server), boto3 invoke_endpoint, the management API, cache metrics, unsafe archives."""

from __future__ import annotations

import io
import shutil
import tarfile
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import boto3
import numpy as np
import onnx
import orjson
import pytest
import requests
import tritonclient.http as httpclient

from tests.archives import weighted_model, write_archive, write_archives
from tests.protocols.sagemaker_triton import binary_request, expected, parse_answer, predictor, v2_json
from tests.protocols.test_sagemaker_server import runtime_client
from tests.s3_server import FAKE_ENVIRONMENT, MotoS3Server
from tests.server import ServerProcess, wait_for

ROW = b"1,1,1,1\n"


def csv_prediction(response: requests.Response) -> float:
    assert response.status_code == 200, response.text
    return float(orjson.loads(response.content)["predictions"][0][0])


def invoke(server: ServerProcess, target: str, body: bytes = ROW) -> requests.Response:
    headers = {"Content-Type": "text/csv", "X-Amzn-SageMaker-Target-Model": target}
    return requests.post(server.sagemaker + "/invocations", data=body, headers=headers, timeout=60)


def metric(server: ServerProcess, name: str) -> float:
    text = requests.get(f"http://127.0.0.1:{server.metrics_port}/metrics", timeout=5).text
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"{name} not in /metrics")


@pytest.fixture(scope="module")
def archives(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("models")
    write_archives(root, 6, width=4)
    nested = root / "team-a"
    nested.mkdir()
    write_archives(nested, 1, width=4)
    return root


@pytest.fixture(scope="module")
def mme(archives: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    server = ServerProcess(archives, "--multi-model", cache_dir=tmp_path_factory.mktemp("cache"))
    server.wait_ready(path=server.sagemaker + "/ping")
    yield server
    server.stop()


def test_target_model_loads_on_first_use_and_is_cached(mme: ServerProcess) -> None:
    misses = metric(mme, "modelhost_model_cache_misses_total")
    assert csv_prediction(invoke(mme, "model-3.tar.gz")) == 4.0
    assert csv_prediction(invoke(mme, "model-3.tar.gz")) == 4.0
    assert csv_prediction(invoke(mme, "team-a/model-0.tar.gz")) == 1.0
    assert metric(mme, "modelhost_model_cache_misses_total") == misses + 2
    assert metric(mme, "modelhost_model_cache_hits_total") >= 1
    assert metric(mme, "modelhost_loaded_models") >= 2
    assert metric(mme, "modelhost_model_cache_bytes") > 0
    assert metric(mme, "modelhost_model_loading_seconds_count") >= 2
    assert metric(mme, "modelhost_model_downloading_seconds_count") >= 2


def test_concurrent_cold_requests_load_the_model_once(mme: ServerProcess) -> None:
    loads = metric(mme, "modelhost_model_loading_seconds_count")
    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda _: csv_prediction(invoke(mme, "model-5.tar.gz")), range(16)))
    assert answers == [6.0] * 16
    assert metric(mme, "modelhost_model_loading_seconds_count") == loads + 1


def test_boto3_invoke_endpoint_with_target_model(mme: ServerProcess) -> None:
    client = runtime_client(mme)
    for i in (1, 2, 1):
        result = client.invoke_endpoint(EndpointName="mme", TargetModel=f"model-{i}.tar.gz", Body=ROW,
                                        ContentType="text/csv", Accept="text/csv")
        assert result["Body"].read() == f"{i + 1}.0,{i + 1}.0,{i + 1}.0,{i + 1}.0\n".encode()
    with pytest.raises(client.exceptions.ModelError) as missing:
        client.invoke_endpoint(EndpointName="mme", TargetModel="model-99.tar.gz", Body=ROW, ContentType="text/csv")
    assert missing.value.response["OriginalStatusCode"] == 404
    assert "model-99.tar.gz" in missing.value.response["OriginalMessage"]


def test_triton_payloads_with_target_model_through_boto3_and_the_sdk(mme: ServerProcess) -> None:
    """AWS's Triton multi-model examples: octet-stream V2 JSON and binary+json, TargetModel naming the archive."""
    client = runtime_client(mme)
    rows = np.arange(8, dtype=np.float32).reshape(2, 4)
    for i in (1, 2):  # archives the tests before have loaded
        want = expected(weighted_model(float(i), 4), {"INPUT0": rows})["OUTPUT0"]
        answer = client.invoke_endpoint(EndpointName="mme", TargetModel=f"model-{i}.tar.gz", Body=v2_json(
            {"INPUT0": rows}), ContentType="application/octet-stream")
        assert answer["ContentType"] == "application/json"
        np.testing.assert_array_equal(parse_answer(answer["Body"].read(), "application/json").as_numpy("OUTPUT0"),
                                      want)
        body, content_type = binary_request({"INPUT0": rows})
        answer = client.invoke_endpoint(EndpointName="mme", TargetModel=f"model-{i}.tar.gz", Body=body,
                                        ContentType=content_type)
        np.testing.assert_array_equal(parse_answer(answer["Body"].read(), answer["ContentType"]).as_numpy("OUTPUT0"),
                                      want)
    answer = predictor(client, "mme").predict(v2_json({"INPUT0": rows}), target_model="model-3.tar.gz")
    np.testing.assert_array_equal(parse_answer(answer, "application/json").as_numpy("OUTPUT0"), rows + 3)


def test_missing_or_escaping_target_is_a_clear_400(mme: ServerProcess) -> None:
    response = requests.post(mme.sagemaker + "/invocations", data=ROW, headers={"Content-Type": "text/csv"},
                             timeout=10)
    assert response.status_code == 400 and "X-Amzn-SageMaker-Target-Model" in response.json()["error"]
    escaping = invoke(mme, "../models/model-1.tar.gz")
    assert escaping.status_code == 400


def test_unsafe_archive_is_rejected_and_leaves_nothing_behind(tmp_path: Path, start_server: Any) -> None:
    write_archives(tmp_path, 1, width=4)
    write_archive(tmp_path / "evil.tar.gz", {"../../escape.txt": b"x", "model.onnx": b"not a model"})
    server = start_server(tmp_path, "--multi-model", ready_path="/v2/health/live")
    response = invoke(server, "evil.tar.gz")
    assert response.status_code == 400
    assert "evil.tar.gz" in response.json()["error"] and ".." in response.json()["error"]
    assert not (tmp_path.parent / "escape.txt").exists()
    assert csv_prediction(invoke(server, "model-0.tar.gz")) == 1.0


def test_management_api(tmp_path: Path, start_server: Any) -> None:
    # As SageMaker's agent does it: each model unpacked to <SAGEMAKER_BASE_DIR>/models/<name>/model.
    write_archives(tmp_path / "archives", 3, width=4)
    models = tmp_path / "opt-ml" / "models"
    for i in range(3):
        with tarfile.open(tmp_path / "archives" / f"model-{i}.tar.gz") as archive:
            archive.extractall(models / f"h{i}" / "model")
    server = start_server(None, "--multi-model", ready_path="/v2/health/live",
                          env={"SAGEMAKER_BASE_DIR": str(tmp_path / "opt-ml")})
    base = server.sagemaker
    assert requests.get(base + "/ping", timeout=5).status_code == 200
    for i in range(3):
        url = str(models / f"h{i}" / "model")
        load = requests.post(base + "/models", json={"model_name": f"h{i}", "url": url}, timeout=30)
        assert load.status_code == 200, load.text
    again = requests.post(base + "/models", json={"model_name": "h0", "url": str(models / "h0" / "model")},
                          timeout=30)
    assert again.status_code == 409 and "h0" in again.json()["error"]
    page = requests.get(base + "/models", params={"limit": 2}, timeout=5).json()
    assert [m["modelName"] for m in page["models"]] == ["h0", "h1"]
    rest = requests.get(base + "/models", params={"limit": 2, "next_page_token": page["nextPageToken"]},
                        timeout=5).json()
    assert [m["modelName"] for m in rest["models"]] == ["h2"] and "nextPageToken" not in rest
    described = requests.get(base + "/models/h1", timeout=5).json()
    assert described == {"modelName": "h1", "modelUrl": str(models / "h1" / "model")}
    invoked = requests.post(base + "/models/h2/invoke", data=ROW,
                            headers={"Content-Type": "text/csv", "X-Amzn-SageMaker-Target-Model": "m.tar.gz"},
                            timeout=30)
    assert csv_prediction(invoked) == 3.0
    assert requests.delete(base + "/models/h2", timeout=30).status_code == 200
    for gone in (requests.get(base + "/models/h2", timeout=5), requests.delete(base + "/models/h2", timeout=5),
                 requests.post(base + "/models/h2/invoke", data=ROW, headers={"Content-Type": "text/csv"}, timeout=5)):
        assert gone.status_code == 404
    bad = requests.post(base + "/models", json={"model_name": "x"}, timeout=5)
    assert bad.status_code == 400 and "url" in bad.json()["error"]


def model_with_code(directory: Path, marker: Path) -> Path:
    """A model directory (model.onnx at its top) whose code/inference.py writes `marker` when imported."""
    (directory / "code").mkdir(parents=True)
    onnx.save_model(weighted_model(7.0, 4), str(directory / "model.onnx"))
    (directory / "code" / "inference.py").write_text(
        f"open({str(marker)!r}, 'w').write('ran')\n\ndef model_warmup_fn(model_dir, model):\n    pass\n")
    return directory


def test_management_load_is_confined_to_the_allowed_directories(tmp_path: Path, start_server: Any) -> None:
    marker = tmp_path / "marker"
    base, extra, outside = tmp_path / "opt-ml", tmp_path / "extra", tmp_path / "outside"
    model_with_code(outside / "m", marker)
    (base / "models").mkdir(parents=True)
    (base / "models" / "link").symlink_to(outside / "m", target_is_directory=True)
    server = start_server(None, "--multi-model", "--allow-model-load-from", str(extra), ready_path="/v2/health/live",
                          env={"SAGEMAKER_BASE_DIR": str(base)})

    def load(name: str, url: str) -> requests.Response:
        return requests.post(server.sagemaker + "/models", json={"model_name": name, "url": url}, timeout=30)

    for url in (str(outside / "m"), str(base / "models" / "link"), f"{base}/models/../../outside/m", "/",
                str(outside / "missing")):
        refused = load("m", url)
        assert refused.status_code == 400, (url, refused.text)
        message = refused.json()["error"]
        # Error bodies show no server paths, the client's own included: only the url's last part is echoed.
        assert "--allow-model-load-from" in message and url.rstrip("/").rsplit("/", 1)[-1] in message
        assert str(outside) not in message
    for name in ("..", "a/b", "m\x00", ""):
        refused = load(name, str(base / "models"))
        assert refused.status_code == 400 and "model_name" in refused.json()["error"], refused.text
    assert not marker.exists(), "code from outside the allowed directories ran"
    assert requests.get(server.sagemaker + "/models", timeout=5).json()["models"] == []

    # Inside: SageMaker's models directory, and a directory the operator allowed (their code runs).
    loaded = model_with_code(base / "models" / "inside" / "model", tmp_path / "inside-marker")
    assert load("inside", str(loaded)).status_code == 200
    assert (tmp_path / "inside-marker").exists()
    shutil.copytree(outside / "m", extra / "e")
    assert load("e", str(extra / "e")).status_code == 200
    invoked = requests.post(server.sagemaker + "/models/e/invoke", data=ROW, headers={"Content-Type": "text/csv"},
                            timeout=30)
    assert invoked.status_code == 200 and orjson.loads(invoked.content) == [[8.0] * 4]  # the toolkit's default output


def test_a_model_that_cannot_fit_is_507(tmp_path: Path, start_server: Any) -> None:
    write_archives(tmp_path, 1, width=4)
    server = start_server(tmp_path, "--multi-model", "--model-cache-bytes", "100", ready_path="/v2/health/live")
    response = invoke(server, "model-0.tar.gz")
    assert response.status_code == 507 and "--model-cache-bytes" in response.json()["error"]


def test_archives_from_s3(tmp_path: Path, start_server: Any) -> None:
    s3 = MotoS3Server().start()
    try:
        client = boto3.client("s3", endpoint_url=s3.endpoint_url, region_name="us-east-1",
                              aws_access_key_id="testing", aws_secret_access_key="testing")
        client.create_bucket(Bucket="models")
        write_archives(tmp_path, 2, width=4)
        for i in range(2):
            client.upload_fileobj(io.BytesIO((tmp_path / f"model-{i}.tar.gz").read_bytes()), "models",
                                  f"prod/v1/model-{i}.tar.gz")
        server = start_server("s3://models/prod/v1", "--multi-model", "--s3-endpoint-url", s3.endpoint_url,
                              ready_path="/v2/health/live", env=FAKE_ENVIRONMENT)
        runtime = runtime_client(server)
        result = runtime.invoke_endpoint(EndpointName="mme", TargetModel="model-1.tar.gz", Body=ROW,
                                         ContentType="text/csv")
        assert orjson.loads(result["Body"].read()) == {"predictions": [[2.0] * 4]}
        missing = invoke(server, "model-7.tar.gz")
        assert missing.status_code == 404 and "model-7.tar.gz" in missing.json()["error"]
    finally:
        s3.stop()


def test_custom_attributes_pick_a_model_inside_a_multi_model_archive(tmp_path: Path, start_server: Any) -> None:
    members = {}
    for name, offset in (("low", 1.0), ("high", 100.0)):
        path = tmp_path / f"{name}.onnx"
        onnx.save_model(weighted_model(offset, 4), str(path))
        members[f"{name}/1/model.onnx"] = path.read_bytes()
    write_archive(tmp_path / "pair.tar.gz", members)
    server = start_server(tmp_path, "--multi-model", ready_path="/v2/health/live")

    def ask(attributes: str) -> requests.Response:
        headers = {"Content-Type": "text/csv", "X-Amzn-SageMaker-Target-Model": "pair.tar.gz",
                   "X-Amzn-SageMaker-Custom-Attributes": attributes}
        return requests.post(server.sagemaker + "/invocations", data=ROW, headers=headers, timeout=30)

    assert csv_prediction(ask("tfs-model-name=high")) == 101.0
    assert csv_prediction(ask("tfs-model-name=low")) == 2.0
    unnamed = ask("")
    assert unnamed.status_code == 400 and "high, low" in unnamed.json()["error"]


TORCH_CONFIG = b"""platform: "pytorch_libtorch"
max_batch_size: 8
input [ { name: "INPUT__0", data_type: TYPE_FP32, dims: [ 4 ] } ]
output [ { name: "OUTPUT__0", data_type: TYPE_FP32, dims: [ 4 ] } ]
"""


def torch_archive(path: Path) -> Path:
    """An archive holding a TorchScript model that doubles its input: config.pbtxt and 1/model.pt."""
    import torch

    class Double(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x * 2

    buffer = io.BytesIO()
    torch.jit.save(torch.jit.script(Double()), buffer)
    return write_archive(path, {"config.pbtxt": TORCH_CONFIG, "1/model.pt": buffer.getvalue()})


def test_a_torch_model_is_not_charged_for_importing_torch(tmp_path: Path, start_server: Any) -> None:
    """Importing torch holds about 85 MB; a 40 MB budget holds a small torch model and onnx models beside it,
    and a refused load leaves the cache usable (it used to be 507 for every load after it)."""
    write_archives(tmp_path, 1, width=4)
    torch_archive(tmp_path / "double.tar.gz")
    write_archive(tmp_path / "huge.tar.gz", {"model.onnx": _onnx_bytes(tmp_path, 12 << 20)})
    server = start_server(tmp_path, "--multi-model", "--model-cache-bytes", str(40 << 20),
                          ready_path="/v2/health/live")
    assert csv_prediction(invoke(server, "double.tar.gz")) == 2.0
    assert csv_prediction(invoke(server, "model-0.tar.gz")) == 1.0
    refused = invoke(server, "huge.tar.gz", b"1\n")
    assert refused.status_code == 507, refused.text
    assert csv_prediction(invoke(server, "model-0.tar.gz")) == 1.0
    assert csv_prediction(invoke(server, "double.tar.gz")) == 2.0
    assert 0 < metric(server, "modelhost_model_cache_bytes") <= 40 << 20


def _onnx_bytes(tmp_path: Path, width: int) -> bytes:
    path = tmp_path / "big.onnx"
    onnx.save_model(weighted_model(0.0, width), str(path))
    data = path.read_bytes()
    path.unlink()
    return data


def v2_output(client: httpclient.InferenceServerClient, name: str) -> float:
    x = httpclient.InferInput("INPUT0", [1, 4], "FP32")
    x.set_data_from_numpy(np.ones((1, 4), np.float32))
    return float(client.infer(name, [x]).as_numpy("OUTPUT0")[0, 0])


def test_explicit_mode_loads_and_unloads_through_the_cache(archives: Path, start_server: Any) -> None:
    # Triton on SageMaker runs its multi-model endpoints in explicit mode: the repository API works here too,
    # each load cached within the budget beside the TargetModel loads.
    server = start_server(archives, "--multi-model", "--model-control-mode", "explicit", "--load-model", "model-2",
                          ready_path="/v2/health/live")
    wait_for(lambda: requests.get(server.sagemaker + "/ping", timeout=5).status_code == 200, what="ping")
    with httpclient.InferenceServerClient(server.url) as client:
        assert v2_output(client, "model-2") == 3.0  # loaded at start
        listed = {e["name"]: e.get("state", "") for e in requests.post(server.base + "/v2/repository/index",
                                                                        timeout=10).json()}
        assert listed["model-2"] == "READY" and listed["model-0"] == ""  # the store's archives, by name
        assert not any(name.startswith("team-a") for name in listed)  # nested archives are TargetModels only

        cached = metric(server, "modelhost_model_cache_bytes")
        client.load_model("model-4")
        assert v2_output(client, "model-4") == 5.0
        assert metric(server, "modelhost_model_cache_bytes") > cached
        assert csv_prediction(invoke(server, "model-1.tar.gz")) == 2.0  # TargetModels beside them

        client.unload_model("model-4")
        assert not client.is_model_ready("model-4")
        assert metric(server, "modelhost_loaded_models") == 2
        client.load_model("model-3", config='{"max_batch_size": 2}')  # a config override, within the budget too
        assert client.get_model_config("model-3")["max_batch_size"] == 2 and v2_output(client, "model-3") == 4.0
        assert metric(server, "modelhost_loaded_models") == 3
        response = requests.post(server.base + "/v2/repository/models/absent/load", timeout=30)
        assert response.status_code == 404 and "absent.tar.gz" in response.json()["error"]
        assert str(archives) not in response.text


def test_a_repository_load_is_held_to_the_cache_budget(tmp_path: Path, start_server: Any) -> None:
    write_archives(tmp_path, 1, width=4)
    server = start_server(tmp_path, "--multi-model", "--model-control-mode", "explicit", "--model-cache-bytes", "100",
                          ready_path="/v2/health/live")
    response = requests.post(server.base + "/v2/repository/models/model-0/load", timeout=30)
    assert response.status_code == 507 and "--model-cache-bytes" in response.json()["error"]


def test_poll_mode_is_refused_for_a_multi_model_endpoint(tmp_path: Path) -> None:
    server = ServerProcess(tmp_path, "--multi-model", "--model-control-mode", "poll")
    assert server.process.wait(timeout=30) != 0
    assert "poll cannot be combined with multi-model" in server.stop()


def test_a_repository_load_is_evicted_like_an_archive_when_room_is_needed(tmp_path: Path, start_server: Any) -> None:
    write_archives(tmp_path, 8, width=4)
    server = start_server(tmp_path, "--multi-model", "--model-control-mode", "explicit",
                          "--model-cache-bytes", str(3 << 20), ready_path="/v2/health/live")
    with httpclient.InferenceServerClient(server.url) as client:
        client.load_model("model-0")
        assert v2_output(client, "model-0") == 1.0
        for i in range(1, 8):  # more than 3 MiB of models, whatever each is charged (about 1.2 MiB)
            assert csv_prediction(invoke(server, f"model-{i}.tar.gz")) == i + 1
        assert metric(server, "modelhost_model_cache_evictions_total") >= 1
        assert metric(server, "modelhost_model_cache_bytes") <= 3 << 20
        assert not client.is_model_ready("model-0")  # the least recently used went first
        listed = {e["name"]: e.get("state", "") for e in requests.post(server.base + "/v2/repository/index",
                                                                        timeout=10).json()}
        assert listed["model-0"] == ""  # back to a name the store lists
        client.load_model("model-0")  # and it loads again
        assert v2_output(client, "model-0") == 1.0
