"""`modelhost tfserving` end to end, as a tensorflow_model_server deployment runs it: a --model_config_file with
version labels, re-read by polling while clients send requests, a --batching_parameters_file, and
ModelService.HandleReloadConfigRequest; TF Serving's client stubs and `requests` as the clients."""

from __future__ import annotations

import shutil
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import requests

pytest.importorskip("tensorflow_serving")

import grpc  # noqa: E402
import tensorflow as tf  # noqa: E402
from tensorflow_serving.apis import (  # noqa: E402
    get_model_status_pb2,
    model_management_pb2,
    model_service_pb2_grpc,
    predict_pb2,
    prediction_service_pb2_grpc,
)
from tensorflow_serving.config import model_server_config_pb2  # noqa: E402

from tests.protocols.tfserving_models import expected_y, save_recommender  # noqa: E402
from tests.server import TfServingProcess, wait_for  # noqa: E402

BATCHING = """
max_batch_size { value: 32 }
batch_timeout_micros { value: 5000 }
num_batch_threads { value: 1 }
allowed_batch_sizes: 8
allowed_batch_sizes: 32
"""
ONE_MODEL = """
model_config_list {
  config { name: "rec" base_path: "models/rec" model_platform: "tensorflow"
           version_labels { key: "stable" value: 1 } }
}
"""
TWO_VERSIONS_AND_A_COPY = """
model_config_list {
  config { name: "rec" base_path: "models/rec" model_platform: "tensorflow"
           model_version_policy { specific { versions: 1 versions: 2 } }
           version_labels { key: "stable" value: 1 } version_labels { key: "canary" value: 2 } }
  config { name: "rec_copy" base_path: "models/rec" model_platform: "tensorflow" }
}
"""


@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[TfServingProcess, Path]]:
    root = tmp_path_factory.mktemp("tfserving")
    save_recommender(root / "models" / "rec" / "1")
    (root / "models.config").write_text(ONE_MODEL)
    (root / "batching.config").write_text(BATCHING)
    monitoring = 'prometheus_config { enable: true, path: "/monitoring/prometheus/metrics" }'
    (root / "monitoring.config").write_text(monitoring)
    server = TfServingProcess(f"--model_config_file={root / 'models.config'}",
                              f"--monitoring_config_file={root / 'monitoring.config'}",
                              "--model_config_file_poll_wait_seconds=1", "--file_system_poll_wait_seconds=1",
                              "--enable_batching", f"--batching_parameters_file={root / 'batching.config'}",
                              "--rest_api_num_threads=4")
    server.wait_ready(timeout=120)
    yield server, root
    server.stop()


def predict(stub: Any, model: str = "rec", label: str = "", rows: int = 1) -> Any:
    request = predict_pb2.PredictRequest()
    request.model_spec.name = model
    if label:
        request.model_spec.version_label = label
    request.inputs["x"].CopyFrom(tf.make_tensor_proto(np.arange(rows, dtype=np.float32)))
    return stub.Predict(request, timeout=30)


def status(server: TfServingProcess, model: str) -> dict[str, str]:
    answer = requests.get(f"{server.base}/v1/models/{model}", timeout=10)
    if answer.status_code != 200:
        return {}
    return {s["version"]: s["state"] for s in answer.json()["model_version_status"]}


def test_noted_flags_are_logged(deployment: tuple[TfServingProcess, Path]) -> None:
    server, _ = deployment
    assert "--rest_api_num_threads is accepted but changes nothing" in server.printed


def test_version_labels_over_rest_and_grpc(deployment: tuple[TfServingProcess, Path]) -> None:
    server, _ = deployment
    response = requests.post(f"{server.base}/v1/models/rec/labels/stable:predict", json={"instances": [1.0]},
                             timeout=30)
    assert response.json() == {"predictions": [3.0]}
    assert status(server, "rec/labels/stable") == {"1": "AVAILABLE"}
    metadata = requests.get(f"{server.base}/v1/models/rec/labels/stable/metadata", timeout=10).json()
    assert metadata["model_spec"] == {"name": "rec", "signature_name": "", "version": "1"}
    for path in ("/v1/models/rec/labels/stable:classify", "/v1/models/rec/labels/stable:regress"):
        answer = requests.post(f"{server.base}{path}", json={"signature_name": path.rsplit(":", 1)[1],
                                                              "examples": [{"f": 1.0}]}, timeout=30)
        assert answer.status_code == 200 and len(answer.json()["results"]) == 1, answer.text
    with grpc.insecure_channel(server.grpc_url) as channel:
        stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
        assert predict(stub, label="stable").model_spec.version.value == 1
        with pytest.raises(grpc.RpcError) as info:
            predict(stub, label="nightly")
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert info.value.details() == "Unrecognized servable version label: nightly"


def test_batching_parameters_batch_and_pad(deployment: tuple[TfServingProcess, Path]) -> None:
    server, _ = deployment
    before = requests.get(f"{server.base}/v2/models/rec/stats", timeout=10).json()["model_stats"][0]
    with grpc.insecure_channel(server.grpc_url) as channel:
        stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
        futures = []
        for _ in range(24):
            request = predict_pb2.PredictRequest()
            request.model_spec.name = "rec"
            request.inputs["x"].CopyFrom(tf.make_tensor_proto(np.array([2.0], np.float32)))
            futures.append(stub.Predict.future(request, timeout=30))
        for future in futures:
            np.testing.assert_array_equal(tf.make_ndarray(future.result().outputs["y"]), [5.0])
    after = requests.get(f"{server.base}/v2/models/rec/stats", timeout=10).json()["model_stats"][0]
    executions = after["execution_count"] - before["execution_count"]
    inferences = after["inference_count"] - before["inference_count"]
    assert inferences == 24 and executions < 24  # requests waited up to 5 ms for each other: batches
    config = requests.get(f"{server.base}/v2/models/rec/config", timeout=10).json()
    assert config["max_batch_size"] == 32
    assert config["dynamic_batching"]["max_queue_delay_microseconds"] == 5000
    assert config["parameters"]["pad_to_preferred_batch_size"]["string_value"] == "true"


def test_tf_servings_prometheus_metrics_at_the_monitoring_path(deployment: tuple[TfServingProcess, Path]) -> None:
    server, _ = deployment
    with grpc.insecure_channel(server.grpc_url) as channel:
        stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
        predict(stub)
        with pytest.raises(grpc.RpcError):
            predict(stub, model="no_such_model")
    requests.post(f"{server.base}/v1/models/rec:predict", json={"instances": ["not a number"]}, timeout=30)
    # A name the server does not have, refused before any lookup (its label): no label set of its own.
    requests.post(f"{server.base}/v1/models/made_up_7/labels/x:predict", json={"instances": [1.0]}, timeout=30)
    response = requests.get(f"{server.base}/monitoring/prometheus/metrics", timeout=10)
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/plain")
    samples = {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
               for line in response.text.splitlines() if line and not line.startswith("#")}
    assert samples[':tensorflow:serving:request_count{model_name="rec",status="OK"}'] >= 1
    assert samples[':tensorflow:serving:request_count{model_name="rec",status="INVALID_ARGUMENT"}'] >= 1
    assert samples[':tensorflow:serving:request_count{model_name="",status="NOT_FOUND"}'] >= 1  # no label per name
    assert samples[':tensorflow:serving:request_count{model_name="",status="INVALID_ARGUMENT"}'] >= 1
    assert "made_up_7" not in response.text
    count = samples[':tensorflow:serving:request_latency_count{API="Predict",entrypoint="GRPC",model_name="rec"}']
    assert count >= 1
    assert samples[':tensorflow:serving:request_latency_bucket{API="Predict",entrypoint="GRPC",le="+Inf",'
                   'model_name="rec"}'] == count


def test_config_file_reloaded_by_polling_under_traffic(deployment: tuple[TfServingProcess, Path]) -> None:
    server, root = deployment
    failures: list[str] = []
    answered = [0]
    stop = threading.Event()

    def traffic() -> None:
        with grpc.insecure_channel(server.grpc_url) as channel:
            stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
            while not stop.is_set():
                try:
                    y = tf.make_ndarray(predict(stub, rows=4).outputs["y"])
                    np.testing.assert_array_equal(y, expected_y(np.arange(4)))
                    response = requests.post(f"{server.base}/v1/models/rec/labels/stable:predict",
                                             json={"instances": [0.0]}, timeout=30)
                    assert response.status_code == 200, response.text
                    answered[0] += 1
                except Exception as exc:  # noqa: BLE001 - every failure is collected and reported
                    failures.append(repr(exc))

    thread = threading.Thread(target=traffic)
    thread.start()
    try:
        wait_for(lambda: answered[0] > 3, timeout=30, what="traffic before the change")
        # The config first: it pins version 1, which a new version 2 under ONE_MODEL's default policy (latest 1)
        # would replace if the file-system poll saw it before the config poll saw the config (TF Serving does the
        # same); version 2 is then added whole, as TF Serving asks, and loads beside version 1.
        (root / "models.config").write_text(TWO_VERSIONS_AND_A_COPY)
        wait_for(lambda: status(server, "rec_copy") == {"1": "AVAILABLE"}, timeout=90, what="the new config to apply")
        staging = root / "staging"
        shutil.copytree(root / "models" / "rec" / "1", staging)
        staging.rename(root / "models" / "rec" / "2")
        # Labels change once the versions they name serve, so "canary" comes last.
        wait_for(lambda: status(server, "rec") == {"1": "AVAILABLE", "2": "AVAILABLE"}
                 and status(server, "rec_copy") == {"2": "AVAILABLE"}
                 and status(server, "rec/labels/canary") == {"2": "AVAILABLE"}, timeout=90,
                 what="the new config to apply")
        counted = answered[0]
        wait_for(lambda: answered[0] > counted + 3, timeout=30, what="traffic after the change")
    finally:
        stop.set()
        thread.join(timeout=60)
    assert not failures, failures[:5]
    with grpc.insecure_channel(server.grpc_url) as channel:
        stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
        assert predict(stub, label="canary").model_spec.version.value == 2
        assert predict(stub).model_spec.version.value == 2  # no version: the latest served
        assert predict(stub, label="stable").model_spec.version.value == 1


def test_handle_reload_config_request(deployment: tuple[TfServingProcess, Path]) -> None:
    server, root = deployment
    config = model_server_config_pb2.ModelServerConfig()
    model = config.model_config_list.config.add(name="rec", base_path=str(root / "models" / "rec"),
                                                model_platform="tensorflow")
    model.version_labels["stable"] = 2
    with grpc.insecure_channel(server.grpc_url) as channel:
        models = model_service_pb2_grpc.ModelServiceStub(channel)
        response = models.HandleReloadConfigRequest(model_management_pb2.ReloadConfigRequest(config=config),
                                                    timeout=120)
        assert response.status.error_code == 0
        request = get_model_status_pb2.GetModelStatusRequest()
        request.model_spec.name = "rec"
        statuses = models.GetModelStatus(request, timeout=30).model_version_status
        assert [(s.version, s.state) for s in statuses] == [(2, get_model_status_pb2.ModelVersionStatus.AVAILABLE)]
        stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
        assert predict(stub, label="stable").model_spec.version.value == 2
        outside = model_server_config_pb2.ModelServerConfig()
        outside.model_config_list.config.add(name="etc", base_path="/etc", model_platform="tensorflow")
        with pytest.raises(grpc.RpcError) as info:
            models.HandleReloadConfigRequest(model_management_pb2.ReloadConfigRequest(config=outside), timeout=30)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "outside the directories this server was started with" in info.value.details()


def test_rest_api_port_0_serves_grpc_only(tmp_path: Path) -> None:
    save_recommender(tmp_path / "rec" / "1")
    server = TfServingProcess(f"--model_base_path={tmp_path / 'rec'}", "--model_name=rec", "--rest_api_port=0")
    try:
        with grpc.insecure_channel(server.grpc_url) as channel:
            stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)

            def answers() -> bool:
                try:
                    return predict(stub).model_spec.version.value == 1
                except grpc.RpcError:
                    return False

            wait_for(answers, timeout=120, what="gRPC Predict")
        assert "ready: no HTTP, gRPC on 0.0.0.0:" in server.printed
        with pytest.raises(requests.ConnectionError):
            requests.get(f"{server.base}/v1/models/rec", timeout=5)
    finally:
        server.stop()
