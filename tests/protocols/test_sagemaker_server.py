"""SageMaker single-model hosting against a real server: /ping, /invocations in every content type and
accept, model selection by custom attributes, the Runtime API through boto3, and env configuration."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import numpy as np
import onnx
import orjson
import pytest
import requests
from botocore.config import Config

from modelhost.protocols.tfserving import predict_pb2
from modelhost.protocols.tfserving.tensor_proto import array_to_tensor, tensor_to_array
from tests.onnx_models import ADD_SUB_CONFIG, add_sub_model, scale_model, write_model
from tests.protocols.test_overload_admission import CONFIG as SLOW_CONFIG
from tests.protocols.test_overload_admission import SLOW
from tests.server import ServerProcess, free_port

ROWS = np.array([[1, 2, 3, 4], [5, 6, 7, 8]], np.float32)


def runtime_client(server: ServerProcess) -> Any:
    return boto3.client(
        "sagemaker-runtime", endpoint_url=server.sagemaker, region_name="us-east-1",
        aws_access_key_id="local", aws_secret_access_key="local", config=Config(retries={"max_attempts": 0}),
    )


@pytest.fixture(scope="module")
def single(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """/opt/ml/model as a bare model file: model.onnx at the top, OUTPUT0 = 2 x INPUT0 [batch, 4]."""
    root = tmp_path_factory.mktemp("opt_ml_model")
    onnx.save_model(scale_model(2.0), str(root / "model.onnx"))
    server = ServerProcess(root, cache_dir=tmp_path_factory.mktemp("cache"))
    server.wait_ready(path=server.sagemaker + "/ping")
    yield server
    server.stop()


def invoke(server: ServerProcess, body: bytes, content_type: str, accept: str | None = None,
           **headers: str) -> requests.Response:
    sent = {"Content-Type": content_type, **headers}
    if accept is not None:
        sent["Accept"] = accept
    return requests.post(server.sagemaker + "/invocations", data=body, headers=sent, timeout=30)


def npy(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array)
    return buffer.getvalue()


def predict_request(array: np.ndarray) -> bytes:
    request = predict_pb2.PredictRequest()
    request.model_spec.name = "model"
    request.inputs["INPUT0"].CopyFrom(array_to_tensor(array))
    return request.SerializeToString()


REQUESTS = {
    "json-instances": ("application/json", orjson.dumps({"instances": ROWS.tolist()})),
    "json-inputs": ("application/json", orjson.dumps({"inputs": ROWS.tolist()})),
    "json-list": ("application/json", orjson.dumps(ROWS.tolist())),
    "json-v2": ("application/json", orjson.dumps(
        {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [2, 4], "data": ROWS.flatten().tolist()}]})),
    "csv": ("text/csv", b"1,2,3,4\n5,6,7,8\n"),
    "jsonlines": ("application/jsonlines", b"[1,2,3,4]\n[5,6,7,8]\n"),
    "npy": ("application/x-npy", npy(ROWS)),
    "protobuf": ("application/x-protobuf", predict_request(ROWS)),
}


def decoded_rows(response: requests.Response, accept: str, form: str) -> np.ndarray:
    body = response.content
    if accept == "application/json":
        document = orjson.loads(body)
        if form == "json-v2":
            return np.array(document["outputs"][0]["data"], np.float32).reshape(2, 4)
        return np.array(document["outputs"] if form == "json-inputs" else document["predictions"], np.float32)
    if accept == "text/csv":
        return np.array([[float(v) for v in line.split(",")] for line in body.decode().splitlines()], np.float32)
    if accept == "application/jsonlines":
        return np.array([orjson.loads(line) for line in body.decode().splitlines()], np.float32)
    if accept == "application/x-npy":
        return np.load(io.BytesIO(body), allow_pickle=False)
    response_proto = predict_pb2.PredictResponse.FromString(body)
    return tensor_to_array(response_proto.outputs["OUTPUT0"], "OUTPUT0")


@pytest.mark.parametrize("accept", ["application/json", "text/csv", "application/jsonlines", "application/x-npy",
                                    "application/x-protobuf"])
@pytest.mark.parametrize("form", sorted(REQUESTS))
def test_every_content_type_and_accept(single: ServerProcess, form: str, accept: str) -> None:
    content_type, body = REQUESTS[form]
    response = invoke(single, body, content_type, accept)
    assert response.status_code == 200, response.text
    assert response.headers["Content-Type"] == accept
    np.testing.assert_allclose(decoded_rows(response, accept, form), ROWS * 2)


def test_ping_and_default_accept(single: ServerProcess) -> None:
    ping = requests.get(single.sagemaker + "/ping", timeout=5)
    assert ping.status_code == 200 and ping.content == b""
    for accept in (None, "*/*"):
        response = invoke(single, b"1,2,3,4\n", "text/csv", accept)
        assert response.headers["Content-Type"] == "application/json"
        assert orjson.loads(response.content) == {"predictions": [[2.0, 4.0, 6.0, 8.0]]}


def test_unsupported_content_type_and_accept_list_what_is_supported(single: ServerProcess) -> None:
    response = invoke(single, b"<xml/>", "application/xml")
    assert response.status_code == 415
    message = response.json()["error"]
    assert "application/xml" in message and "text/csv" in message and "application/x-npy" in message
    response = invoke(single, b"1,2,3,4\n", "text/csv", "image/png")
    assert response.status_code == 406
    assert "image/png" in response.json()["error"] and "application/jsonlines" in response.json()["error"]


def test_bad_input_names_the_problem_and_the_server_keeps_serving(single: ServerProcess) -> None:
    response = invoke(single, b"1,2,3,4\n5,6,x,8\n", "text/csv")
    assert response.status_code == 400
    assert "line 2" in response.json()["error"]
    response = invoke(single, b"1,2,3\n", "text/csv")
    assert response.status_code == 400
    assert invoke(single, b"1,2,3,4\n", "text/csv").status_code == 200


def test_boto3_invoke_endpoint(single: ServerProcess) -> None:
    client = runtime_client(single)
    result = client.invoke_endpoint(EndpointName="local-endpoint", Body=b"1,2,3,4\n", ContentType="text/csv",
                                    Accept="application/json", CustomAttributes="trace=1")
    assert result["ContentType"] == "application/json"
    assert result["InvokedProductionVariant"] == "AllTraffic"
    assert orjson.loads(result["Body"].read()) == {"predictions": [[2.0, 4.0, 6.0, 8.0]]}
    with pytest.raises(client.exceptions.ModelError) as caught:
        client.invoke_endpoint(EndpointName="local-endpoint", Body=b"1,2\n", ContentType="text/csv")
    error = caught.value.response
    assert error["Error"]["Code"] == "ModelError"
    assert error["OriginalStatusCode"] == 400 and "4" in error["OriginalMessage"]
    with pytest.raises(client.exceptions.ClientError) as invalid_name:
        client.invoke_endpoint(EndpointName="bad_name", Body=b"1,2,3,4\n", ContentType="text/csv")
    assert invalid_name.value.response["Error"]["Code"] == "ValidationError"


def test_custom_attributes_select_a_model_in_a_repository(tmp_path: Path, start_server: Any) -> None:
    write_model(tmp_path, "half", scale_model(0.5), None)
    write_model(tmp_path, "triple", scale_model(3.0), None)
    write_model(tmp_path, "triple", scale_model(30.0), None, version=2)
    (tmp_path / "triple" / "config.pbtxt").write_text("version_policy: { all: {} }\n")
    server = start_server(tmp_path)
    body = b"2,2,2,2\n"
    ask = "tfs-model-name=triple"
    assert invoke(server, body, "text/csv", "text/csv", **{"X-Amzn-SageMaker-Custom-Attributes": ask}).text == \
        "60.0,60.0,60.0,60.0\n"
    latest = invoke(server, body, "text/csv", None, **{"X-Amzn-SageMaker-Custom-Attributes": ask})
    assert latest.json() == {"predictions": [[60.0] * 4]}
    first = invoke(server, body, "text/csv", None,
                   **{"X-Amzn-SageMaker-Custom-Attributes": "tfs-model-name=triple, tfs-model-version=1"})
    assert first.json() == {"predictions": [[6.0] * 4]}
    unnamed = invoke(server, body, "text/csv")
    assert unnamed.status_code == 400 and "tfs-model-name" in unnamed.json()["error"]
    unknown = invoke(server, body, "text/csv", None, **{"X-Amzn-SageMaker-Custom-Attributes": "tfs-model-name=x"})
    assert unknown.status_code == 404 and "half, triple" in unknown.json()["error"]
    superscript = invoke(server, body, "text/csv", None,  # the header's byte 0xB2 is '²' in latin-1: not a version
                         **{"X-Amzn-SageMaker-Custom-Attributes": "tfs-model-name=triple, tfs-model-version=\xb2"})
    assert superscript.status_code == 400 and "tfs-model-version" in superscript.json()["error"]
    endless = invoke(server, body, "text/csv", None,  # past the digits int() converts
                     **{"X-Amzn-SageMaker-Custom-Attributes": "tfs-model-name=triple, tfs-model-version=" + "9" * 5000})
    assert endless.status_code == 400 and "tfs-model-version" in endless.json()["error"]


def test_two_input_model_takes_named_json(tmp_path: Path, start_server: Any) -> None:
    write_model(tmp_path, "model", add_sub_model(), ADD_SUB_CONFIG.replace("max_batch_size: 8", "max_batch_size: 8"))
    server = start_server(tmp_path)
    a, b = np.arange(16, dtype=np.float32), np.ones(16, np.float32)
    body = orjson.dumps({"instances": [{"INPUT0": a.tolist(), "INPUT1": b.tolist()}]})
    prediction = invoke(server, body, "application/json").json()["predictions"][0]
    assert prediction["OUTPUT0"] == (a + b).tolist() and prediction["OUTPUT1"] == (a - b).tolist()
    csv = invoke(server, b"1,2\n", "text/csv")
    assert csv.status_code == 400 and "2 inputs" in csv.json()["error"]


def test_environment_configures_batching_and_instances(tmp_path: Path, start_server: Any) -> None:
    onnx.save_model(scale_model(2.0), str(tmp_path / "model.onnx"))
    env = {"SAGEMAKER_TFS_ENABLE_BATCHING": "true", "SAGEMAKER_TFS_MAX_BATCH_SIZE": "16",
           "SAGEMAKER_TFS_BATCH_TIMEOUT_MICROS": "500", "SAGEMAKER_MODEL_SERVER_WORKERS": "2"}
    server = start_server(tmp_path, env=env)
    config = requests.get(server.base + "/v2/models/model/config", timeout=5).json()
    assert config["max_batch_size"] == 16
    assert int(config["dynamic_batching"]["max_queue_delay_microseconds"]) == 500
    assert sum(int(group["count"]) for group in config["instance_group"]) == 2
    assert invoke(server, b"1,1,1,1\n", "text/csv").json() == {"predictions": [[2.0] * 4]}


def test_invalid_environment_value_stops_startup_naming_the_variable(tmp_path: Path) -> None:
    onnx.save_model(scale_model(2.0), str(tmp_path / "model.onnx"))
    result = subprocess.run(
        [sys.executable, "-m", "modelhost", "serve", "--model-repository", str(tmp_path), "--http-port",
         str(free_port()), "--sagemaker-port", str(free_port()), "--metrics-port", "0", "--grpc-port", "0"],
        env={**os.environ, "SAGEMAKER_TFS_MAX_BATCH_SIZE": "lots"},
        capture_output=True, text=True, timeout=60,
    )
    assert result.returncode == 2
    assert "SAGEMAKER_TFS_MAX_BATCH_SIZE" in result.stderr and "lots" in result.stderr


def test_serve_entry_runs_a_container_style_server(tmp_path: Path) -> None:
    """What a BYOC image runs: `serve serve`, settings from SAGEMAKER_* variables."""
    onnx.save_model(scale_model(2.0), str(tmp_path / "model.onnx"))
    port = free_port()
    command = [sys.executable, "-c", "import sys; from modelhost.cli import serve_main; sys.exit(serve_main())",
               "serve", "--host", "127.0.0.1", "--model-repository", str(tmp_path), "--http-port", str(free_port()),
               "--metrics-port", "0", "--grpc-port", "0"]
    env = {**os.environ, "SAGEMAKER_BIND_TO_PORT": str(port)}
    process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        base = f"http://127.0.0.1:{port}"
        for _ in range(600):
            try:
                if requests.get(base + "/ping", timeout=1).status_code == 200:
                    break
            except requests.ConnectionError:
                pass
            assert process.poll() is None, process.communicate()[0]
            time.sleep(0.05)
        response = requests.post(base + "/invocations", data=b"1,2,3,4\n", headers={"Content-Type": "text/csv"},
                                 timeout=10)
        assert response.json() == {"predictions": [[2.0, 4.0, 6.0, 8.0]]}
    finally:
        process.terminate()
        output = process.communicate(timeout=30)[0]
    assert process.returncode == 0, output


def test_ping_is_503_while_a_model_is_unavailable(tmp_path: Path, start_server: Any) -> None:
    """A model that failed to load can only fail: /ping says so (as Triton's SageMaker entry and the TF Serving
    container do), so SageMaker does not route traffic here; in a repository, one failed model is enough."""
    single = tmp_path / "single"
    single.mkdir()
    (single / "model.onnx").write_bytes(b"not an onnx model")
    server = start_server(single, ready_path="/v2/health/live")
    wait_for_state(server, "model", "UNAVAILABLE")
    ping = requests.get(server.sagemaker + "/ping", timeout=5)
    assert ping.status_code == 503
    assert invoke(server, b"1,2,3,4\n", "text/csv").status_code == 503

    repository = tmp_path / "repository"
    write_model(repository, "good", scale_model(2.0), None)
    (repository / "bad" / "1").mkdir(parents=True)
    (repository / "bad" / "1" / "model.onnx").write_bytes(b"not an onnx model")
    server = start_server(repository, ready_path="/v2/health/live")
    wait_for_state(server, "bad", "UNAVAILABLE")
    wait_for_state(server, "good", "READY")  # the two load concurrently: either may finish first
    assert requests.get(server.sagemaker + "/ping", timeout=5).status_code == 503
    pick_good = {"X-Amzn-SageMaker-Custom-Attributes": "tfs-model-name=good"}
    good = invoke(server, b"1,2,3,4\n", "text/csv", None, **pick_good)
    assert good.json() == {"predictions": [[2.0, 4.0, 6.0, 8.0]]}


def wait_for_state(server: ServerProcess, model: str, state: str) -> None:
    for _ in range(600):
        index = requests.post(server.base + "/v2/repository/index", json={}, timeout=5).json()
        if any(entry["name"] == model and entry.get("state") == state for entry in index):
            return
        time.sleep(0.05)
    raise AssertionError(f"model {model} never became {state}: {index}")


def test_runtime_api_errors_carry_botocore_error_shape(single: ServerProcess) -> None:
    """Whatever the Runtime API paths answer as an error names its code (x-amzn-ErrorType) and a message, so a
    boto3 ClientError says what went wrong; before, calls modelhost lacks were a bare 404 and an empty error."""
    client = runtime_client(single)
    with pytest.raises(client.exceptions.ValidationError) as asynchronous:
        client.invoke_endpoint_async(EndpointName="local-endpoint", InputLocation="s3://bucket/input.csv")
    error = asynchronous.value.response["Error"]
    assert error["Code"] == "ValidationError"
    assert "InvokeEndpointAsync" in error["Message"] and "not supported" in error["Message"]
    assert "InvokeEndpointWithResponseStream" in error["Message"]  # what it answers instead

    # A client whose endpoint_url has a path modelhost does not serve reaches unknown paths.
    misplaced = boto3.client("sagemaker-runtime", endpoint_url=single.sagemaker + "/prefix", region_name="us-east-1",
                             aws_access_key_id="local", aws_secret_access_key="local",
                             config=Config(retries={"max_attempts": 0}))
    with pytest.raises(misplaced.exceptions.ClientError) as unknown:
        misplaced.invoke_endpoint(EndpointName="local-endpoint", Body=b"1,2,3,4\n", ContentType="text/csv")
    error = unknown.value.response["Error"]
    assert unknown.value.response["ResponseMetadata"]["HTTPStatusCode"] == 404
    assert error["Code"] == "UnknownOperationException"
    assert "/prefix/endpoints/local-endpoint/invocations" in error["Message"]
    assert "POST /endpoints/{EndpointName}/invocations" in error["Message"]

    # Errors the HTTP layer raises on a Runtime path (here: a body that is not the gzip it says) too.
    broken = requests.post(single.sagemaker + "/endpoints/local-endpoint/invocations", data=b"not gzip",
                           headers={"Content-Type": "text/csv", "Content-Encoding": "gzip"}, timeout=10)
    assert broken.status_code == 400 and broken.headers["x-amzn-ErrorType"] == "ValidationError"
    assert "gzip" in broken.json()["message"] and broken.headers["x-amzn-RequestId"]
    wrong_method = requests.get(single.sagemaker + "/endpoints/local-endpoint/invocations", timeout=10)
    assert wrong_method.status_code == 405 and wrong_method.headers["x-amzn-ErrorType"] == "UnknownOperationException"
    assert "GET" in wrong_method.json()["message"]

    # The container contract's own routes keep their {"error": ...} answers.
    container = invoke(single, b"1,2\n", "text/csv")
    assert container.status_code == 400 and "error" in container.json()
    assert "x-amzn-ErrorType" not in container.headers


def test_transport_refusals_on_the_sagemaker_port_carry_the_error_shape(single: ServerProcess) -> None:
    """The HTTP transport's own refusals (here: a header section over --http-max-head-bytes, 431) come before any
    route, and carry the Runtime API's code and message too, so boto3 says what went wrong."""
    client = runtime_client(single)

    def oversized(request: Any, **_: Any) -> None:
        request.headers["X-Padding"] = "a" * (70 * 1024)

    client.meta.events.register("before-send.sagemaker-runtime.InvokeEndpoint", oversized)
    with pytest.raises(client.exceptions.ClientError) as refused:
        client.invoke_endpoint(EndpointName="local-endpoint", Body=b"1,2,3,4\n", ContentType="text/csv")
    assert refused.value.response["ResponseMetadata"]["HTTPStatusCode"] == 431
    error = refused.value.response["Error"]
    assert error["Code"] == "ValidationError"
    assert "--http-max-head-bytes" in error["Message"]
    # A container-contract client reads the same answer's "error".
    raw = requests.post(single.sagemaker + "/invocations", data=b"1,2,3,4\n",
                        headers={"Content-Type": "text/csv", "X-Padding": "a" * (70 * 1024)}, timeout=10)
    assert raw.status_code == 431 and "--http-max-head-bytes" in raw.json()["error"]
    assert raw.headers["x-amzn-ErrorType"] == "ValidationError"
    assert invoke(single, b"1,2,3,4\n", "text/csv").status_code == 200


def test_an_overloaded_invocation_says_when_to_retry(tmp_path: Path, start_server: Any) -> None:
    """A full queue is a 503 with Retry-After on the SageMaker port too, as on the KServe port."""
    (tmp_path / "slow" / "1").mkdir(parents=True)
    (tmp_path / "slow" / "1" / "model.py").write_text(SLOW)  # 1.5 s per request, a queue of one
    (tmp_path / "slow" / "config.pbtxt").write_text(SLOW_CONFIG)
    server = start_server(tmp_path)
    answers: list[requests.Response] = []

    def call() -> None:
        answers.append(requests.post(server.sagemaker + "/invocations", data=b"1,2,3,4\n",
                                     headers={"Content-Type": "text/csv"}, timeout=30))

    threads = [threading.Thread(target=call) for _ in range(2)]  # one runs, one waits in the queue
    for thread in threads:
        thread.start()
        time.sleep(0.3)
    refused = requests.post(server.sagemaker + "/invocations", data=b"1,2,3,4\n",
                            headers={"Content-Type": "text/csv"}, timeout=30)
    for thread in threads:
        thread.join()
    assert refused.status_code == 503, refused.text
    assert refused.headers["Retry-After"] == "1" and "max_queue_size 1" in refused.json()["error"]
    assert [a.status_code for a in answers] == [200, 200]
