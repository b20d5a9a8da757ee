"""modelhost on Ray Serve, on a local two-node Ray cluster (a head node and a second node process, both on
127.0.0.1), started with `modelhost ray`: every protocol through Ray's proxies against onnxruntime, 50
archives routed with model affinity, statistics and metrics summed over the replicas, bad requests answered as
a single server answers them, a replica killed under load and 1 -> 3 -> 1 replicas under load with no failed
request for a retrying client."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import boto3
import botocore.exceptions
import numpy as np
import onnxruntime as ort
import pytest
import requests
import tritonclient.grpc as triton_grpc
import tritonclient.http as triton_http
from botocore.config import Config
from tritonclient.utils import InferenceServerException

from modelhost.client import Client, RetryPolicy
from tests.archives import weighted_model, write_archive, write_archives
from tests.core.test_sequences_e2e import ACCUMULATOR_CONFIG
from tests.onnx_models import ACCUMULATOR_CONTROLS, accumulator_model
from tests.ray.driver import RayDriver
from tests.server import ServerProcess, free_port

WIDTH = 256 * 1024  # float32 weights: 1 MiB per model
COUNT = 50
BUDGET = 400 * 1024 * 1024  # per replica: every model fits, so that only routing decides where models load


NARROW = 16  # the JSON and CSV protocols' model: what they check is the protocol, not a megabyte of text
# A Python model that holds each request 50 ms without using a core: the autoscaling test's load, whose ongoing
# requests per replica depend on how many clients send, not on how fast a loaded machine runs them.
SLEEPER_CONFIG = b"""
backend: "python"
max_batch_size: 0
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 1, 16 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 1, 16 ] } ]
"""
SLEEPER = b"""
import time


class Model:
    def execute(self, inputs):
        time.sleep(0.05)
        return {"OUTPUT0": inputs["INPUT0"]}
"""


@pytest.fixture(scope="module")
def archives(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("archives")
    write_archives(root, COUNT, WIDTH)
    write_archive(root / "narrow.tar.gz", {"model.onnx": weighted_model(3.0, NARROW).SerializeToString()})
    write_archive(root / "accumulator.tar.gz", {  # a sequence model: 16 sequences at once, idle after 30 s
        "config.pbtxt": (ACCUMULATOR_CONFIG % (16, 30_000_000, ACCUMULATOR_CONTROLS)).encode(),
        "model.onnx": accumulator_model().SerializeToString()})
    write_archive(root / "sleeper.tar.gz", {"config.pbtxt": SLEEPER_CONFIG, "1/model.py": SLEEPER})
    return root


@pytest.fixture(scope="module")
def cluster() -> Iterator[RayDriver]:
    os.environ["RAY_USAGE_STATS_ENABLED"] = "0"  # for the cluster, and for `modelhost ray` started by the tests
    driver = RayDriver()
    try:
        yield driver
    finally:
        driver.close()


class RayApp:
    """`modelhost ray` on the cluster, and what the tests need to reach and reshape it."""

    def __init__(self, cluster: RayDriver, archives: Path) -> None:
        self.cluster = cluster
        self.port = free_port()
        self.grpc_port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.argv = ["--model-repository", str(archives), "--replicas", "2", "--replica-cpus", "1",
                     "--host", "127.0.0.1", "--http-port", str(self.port), "--grpc-port", str(self.grpc_port),
                     "--model-cache-bytes", str(BUDGET), "--model-control-mode", "explicit"]
        self.process = subprocess.Popen([sys.executable, "-m", "modelhost", "ray", "--address", cluster.address,
                                         *self.argv], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

    def wait_ready(self, timeout: float = 180.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.process.poll() is None, self.process.stdout.read() if self.process.stdout else ""
            try:
                if requests.get(self.base + "/v2/health/ready", timeout=2).status_code == 200:
                    return
            except requests.RequestException:
                pass
            time.sleep(0.5)
        raise AssertionError("modelhost ray did not become ready")

    def replicas(self) -> list[dict[str, Any]]:
        return list(self.cluster.call("replicas"))

    def on_every_replica(self, method: str, path: str, model: str) -> list[Any]:
        return list(self.cluster.call("on_every_replica", method, path, model))

    def max_batch_sizes(self, model: str) -> list[int]:
        """`model`'s max_batch_size in each replica's config (loading it where it is not loaded)."""
        answers = self.on_every_replica("GET", f"/v2/models/{model}/config", model)
        assert all(answer.status == 200 for answer in answers), answers
        return [json.loads(answer.body)["max_batch_size"] for answer in answers]

    def resize(self, replicas: dict[str, Any]) -> None:
        """Deploy the same application's config with other replica options, as `serve deploy` of an edited config
        file would: resized in place."""
        self.cluster.call("redeploy", self.argv, replicas)

    def stop(self) -> None:
        self.process.send_signal(signal.SIGTERM)
        self.process.wait(timeout=60)


@pytest.fixture(scope="module")
def app(cluster: RayDriver, archives: Path) -> Iterator[RayApp]:
    running = RayApp(cluster, archives)
    try:
        running.wait_ready()
        yield running
    finally:
        running.stop()


def row(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).random((1, WIDTH), dtype=np.float32)


def onnxruntime_answer(model: int, x: np.ndarray) -> np.ndarray:
    session = ort.InferenceSession(weighted_model(float(model), x.shape[1]).SerializeToString())
    return session.run(["OUTPUT0"], {"INPUT0": x})[0]


def v2_infer(app: RayApp, model: int, x: np.ndarray) -> np.ndarray:
    client = triton_http.InferenceServerClient(f"127.0.0.1:{app.port}")
    given = triton_http.InferInput("INPUT0", list(x.shape), "FP32")
    given.set_data_from_numpy(x, binary_data=True)
    return client.infer(f"model-{model}", [given]).as_numpy("OUTPUT0")


def test_each_model_loads_on_one_replica_and_its_requests_follow_it(app: RayApp) -> None:
    """Three requests for each cold model at once, eight models at a time: each model's requests meet on one
    replica, which alone loads it."""
    x = row(0)

    def check(model: int) -> None:
        np.testing.assert_array_equal(v2_infer(app, model, x), x + model)

    with ThreadPoolExecutor(24) as pool:
        list(pool.map(check, [model for model in range(COUNT) for _ in range(3)]))
    replicas = app.replicas()
    assert len(replicas) == 2
    held = [set(replica["models"]) for replica in replicas]
    assert held[0] | held[1] == {f"model-{i}" for i in range(COUNT)}
    assert not held[0] & held[1], "a model was loaded by both replicas"
    assert min(len(models) for models in held) >= COUNT // 5, "one replica took almost every model"
    assert all(replica["cache_bytes"] <= replica["cache_budget_bytes"] for replica in replicas)
    assert sum(replica["missed"] for replica in replicas) >= COUNT
    index = requests.post(app.base + "/v2/repository/index", json={"ready": True}, timeout=30).json()
    assert {f"model-{i}" for i in range(COUNT)} <= {entry["name"] for entry in index}, "the index is every replica's"


def test_statistics_and_metrics_answer_for_every_replica(app: RayApp) -> None:
    stats = requests.get(app.base + "/v2/models/stats", timeout=30).json()["model_stats"]
    counts = {stat["name"]: stat["inference_count"] for stat in stats}
    assert {f"model-{i}" for i in range(COUNT)} <= set(counts)
    assert all(counts[f"model-{i}"] >= 3 for i in range(COUNT))
    one = requests.get(app.base + "/v2/models/model-7/stats", timeout=30).json()["model_stats"]
    assert [stat["name"] for stat in one] == ["model-7"]
    metrics = requests.get(app.base + "/metrics", timeout=30).text
    loads = sum(float(line.split()[-1]) for line in metrics.splitlines()
                if line.startswith("modelhost_model_loading_seconds_count"))
    assert loads == COUNT, "each model is loaded once across the replicas"


def test_every_protocol_answers_as_onnxruntime(app: RayApp) -> None:
    x = row(1)
    np.testing.assert_array_equal(v2_infer(app, 3, x), onnxruntime_answer(3, x))
    grpc_client = triton_grpc.InferenceServerClient(f"127.0.0.1:{app.grpc_port}")
    given = triton_grpc.InferInput("INPUT0", list(x.shape), "FP32")
    given.set_data_from_numpy(x)
    np.testing.assert_array_equal(grpc_client.infer("model-6", [given]).as_numpy("OUTPUT0"), onnxruntime_answer(6, x))
    assert grpc_client.is_model_ready("model-6") and grpc_client.get_model_metadata("model-6").name == "model-6"
    with pytest.raises(InferenceServerException) as unknown:
        grpc_client.infer("no-such-model", [given])
    assert unknown.value.status() == "StatusCode.NOT_FOUND" and "no-such-model" in unknown.value.message()
    small = np.random.default_rng(2).random((1, NARROW), dtype=np.float32)
    expected = onnxruntime_answer(3, small)  # "narrow" adds 3, as model-3 does
    predicted = requests.post(app.base + "/v1/models/narrow:predict", json={"instances": small.tolist()}, timeout=60)
    assert predicted.status_code == 200, predicted.text
    np.testing.assert_allclose(np.array(predicted.json()["predictions"], np.float32), expected)
    tfserving_grpc_predict(app, small, expected)
    runtime = boto3.client("sagemaker-runtime", endpoint_url=app.base, region_name="us-east-1",
                           aws_access_key_id="local", aws_secret_access_key="local",
                           config=Config(retries={"max_attempts": 0}))
    answer = runtime.invoke_endpoint(EndpointName="ray", TargetModel="narrow.tar.gz", ContentType="text/csv",
                                     Accept="text/csv", Body=",".join(str(v) for v in small[0].tolist()))
    got = np.array([float(v) for v in answer["Body"].read().decode().strip().split(",")], np.float32)
    np.testing.assert_allclose(got, expected[0], rtol=1e-6)
    assert requests.get(app.base + "/ping", timeout=10).status_code == 200
    streamed = requests.post(app.base + "/v2/models/narrow/generate_stream", json={"INPUT0": small[0].tolist()},
                             stream=True, timeout=60)
    events = [line for line in streamed.iter_lines() if line.startswith(b"data:")]
    assert streamed.headers["content-type"].startswith("text/event-stream") and len(events) == 1
    np.testing.assert_allclose(np.array(json.loads(events[0][5:])["OUTPUT0"], np.float32).reshape(small.shape),
                               expected)


def tfserving_grpc_predict(app: RayApp, x: np.ndarray, expected: np.ndarray) -> None:
    """TF Serving's gRPC Predict and GetModelStatus, with its own stubs and make_tensor_proto."""
    import grpc
    import tensorflow as tf
    from tensorflow_serving.apis import (
        get_model_status_pb2,
        model_service_pb2_grpc,
        predict_pb2,
        prediction_service_pb2_grpc,
    )

    with grpc.insecure_channel(f"127.0.0.1:{app.grpc_port}") as channel:
        request = predict_pb2.PredictRequest()
        request.model_spec.name = "narrow"
        request.inputs["INPUT0"].CopyFrom(tf.make_tensor_proto(x))
        answer = prediction_service_pb2_grpc.PredictionServiceStub(channel).Predict(request, timeout=60)
        np.testing.assert_allclose(tf.make_ndarray(answer.outputs["OUTPUT0"]), expected)
        status = model_service_pb2_grpc.ModelServiceStub(channel).GetModelStatus(
            get_model_status_pb2.GetModelStatusRequest(model_spec={"name": "narrow"}), timeout=30)
        assert [version.state for version in status.model_version_status] == [30]  # AVAILABLE
        request.model_spec.name = "no-such-model"
        with pytest.raises(grpc.RpcError) as unknown:
            prediction_service_pb2_grpc.PredictionServiceStub(channel).Predict(request, timeout=60)
        assert unknown.value.code() == grpc.StatusCode.NOT_FOUND, unknown.value.details()


BAD_REQUESTS: list[tuple[str, str, dict[str, Any]]] = [
    ("POST", "/v2/models/model-7/infer", {"json": {"inputs": [{"name": "INPUT0", "datatype": "INT32",
                                                               "shape": [1, 2], "data": [1, 2]}]}}),
    ("POST", "/v2/models/model-7/infer", {"json": {"inputs": [{"name": "INPUT0", "datatype": "FP32",
                                                               "shape": [1, 3], "data": [1, 2]}]}}),
    ("POST", "/v2/models/model-7/infer", {"data": b"{not json"}),
    ("POST", "/v2/models/model-7/infer", {"json": {"outputs": []}}),
    ("POST", "/v2/models/no-such-model/infer", {"json": {"inputs": []}}),
    ("POST", "/v2/models/..%2F..%2Fetc/infer", {"json": {"inputs": []}}),
    ("GET", "/v2/models/no-such-model", {}),
    ("POST", "/v1/models/model-7:predict", {"json": {"instances": "nope"}}),
    ("POST", "/v1/models/no-such-model:predict", {"json": {"instances": [[1.0]]}}),
]


def test_bad_requests_get_what_a_single_server_answers(app: RayApp, archives: Path) -> None:
    requests.post(app.base + "/v2/models/model-7/infer", timeout=30)  # model-7 is loaded on a replica first
    single = ServerProcess(archives, "--multi-model", "--model-control-mode", "explicit", "--load-model", "model-7")
    try:
        single.wait_ready()
        for method, path, body in BAD_REQUESTS:
            ours = requests.request(method, app.base + path, timeout=30, **body)
            theirs = requests.request(method, single.base + path, timeout=30, **body)
            assert 400 <= ours.status_code < 500, (path, ours.text)
            assert (ours.status_code, ours.json()) == (theirs.status_code, theirs.json()), path
    finally:
        single.stop()
    too_large = requests.post(app.base + "/v2/models/model-7/infer", data=b"0" * (65 * 1024 * 1024), timeout=60)
    assert too_large.status_code == 413 and "limit" in too_large.json()["error"]
    runtime = boto3.client("sagemaker-runtime", endpoint_url=app.base, region_name="us-east-1",
                           aws_access_key_id="local", aws_secret_access_key="local",
                           config=Config(retries={"max_attempts": 0}))
    with pytest.raises(botocore.exceptions.ClientError) as refused:  # the Runtime API's shape, as boto3 reads it
        runtime.invoke_endpoint(EndpointName="e", Body=b"0" * (65 * 1024 * 1024), ContentType="application/json",
                                TargetModel="model-7.tar.gz")
    assert refused.value.response["Error"]["Code"] == "ValidationError"
    assert "limit" in refused.value.response["Error"]["Message"]


OVERRIDE = json.dumps({"backend": "onnxruntime", "max_batch_size": 2})  # the archives' models have 4


def test_a_load_with_a_config_and_an_unload_reach_every_replica(app: RayApp) -> None:
    """A load with a config (as `modelhost tune` and model_analyzer send) reloads the model on every replica that
    holds it, and the others load it with that config on first use; an unload unloads it everywhere, and no
    replica loads it on first use until a client loads it again."""
    client = triton_http.InferenceServerClient(f"127.0.0.1:{app.port}")
    assert app.max_batch_sizes("model-40") == [4, 4]  # held by both replicas
    client.load_model("model-40", config=OVERRIDE)
    assert app.max_batch_sizes("model-40") == [2, 2]
    client.load_model("model-41", config=OVERRIDE)  # held by one replica at most
    assert app.max_batch_sizes("model-41") == [2, 2]
    client.unload_model("model-40")
    assert [answer.status for answer in app.on_every_replica("GET", "/v2/models/model-40/ready", "model-40")] \
        == [400, 400]
    with pytest.raises(InferenceServerException) as unloaded:
        v2_infer(app, 40, row(3))
    assert unloaded.value.status() == "404"
    assert [replica["models"].count("model-40") for replica in app.replicas()] == [0, 0]
    index = requests.post(app.base + "/v2/repository/index", json={}, timeout=30).json()
    assert [entry.get("state") for entry in index if entry["name"] == "model-40"] == ["UNAVAILABLE"]
    client.load_model("model-40")
    np.testing.assert_array_equal(v2_infer(app, 40, row(3)), row(3) + 40)
    assert app.max_batch_sizes("model-40") == [4, 4], "loaded again from the repository's files"


def sequence_steps(app: RayApp, sequence: int) -> list[int]:
    """One sequence of six steps adding 1..6, alternately over HTTP and gRPC: the running sums it was answered."""
    http = triton_http.InferenceServerClient(f"127.0.0.1:{app.port}")
    rpc = triton_grpc.InferenceServerClient(f"127.0.0.1:{app.grpc_port}")
    sums = []
    for step in range(1, 7):
        module, client = (triton_http, http) if step % 2 else (triton_grpc, rpc)
        given = module.InferInput("INPUT", [1, 1], "INT32")
        given.set_data_from_numpy(np.array([[step]], np.int32))
        result = client.infer("accumulator", [given], sequence_id=sequence, sequence_start=step == 1,
                              sequence_end=step == 6)
        sums.append(int(result.as_numpy("OUTPUT")[0, 0]))
    rpc.close()
    return sums


def test_a_sequence_stays_on_one_replica_when_its_model_is_on_both(app: RayApp) -> None:
    """With the sequence model on both replicas, Ray would send each request to the less busy one; a sequence's
    state is on one, so its requests all go there."""
    app.on_every_replica("GET", "/v2/models/accumulator/ready", "accumulator")
    until(lambda: all("accumulator" in replica["models"] for replica in app.replicas()), "both replicas to hold it")
    time.sleep(1.0)  # their reports reach the router
    with ThreadPoolExecutor(8) as pool:
        answered = list(pool.map(lambda sequence: sequence_steps(app, sequence), range(1, 17)))
    assert answered == [[1, 3, 6, 10, 15, 21]] * 16


class Load:
    """Clients sending requests for ten models (or for `model` alone, a narrow one that answers its input) until
    stopped, with retries, each answer checked."""

    def __init__(self, app: RayApp, clients: int = 3, model: str | None = None) -> None:
        self._model = model
        self.answered = 0
        self.failures: list[str] = []
        self._url = f"127.0.0.1:{app.port}"
        self._threads: list[tuple[threading.Thread, threading.Event]] = []
        self.resize(clients)

    def resize(self, clients: int) -> None:
        while len(self._threads) > clients:
            thread, stop = self._threads.pop()
            stop.set()
            thread.join(timeout=120)
        while len(self._threads) < clients:
            stop = threading.Event()
            thread = threading.Thread(target=self._run, args=(len(self._threads), stop), daemon=True)
            thread.start()
            self._threads.append((thread, stop))

    def _run(self, first: int, stop: threading.Event) -> None:
        x = row(first) if self._model is None else np.full((1, NARROW), first, np.float32)
        retry = RetryPolicy(attempts=20, base_s=0.05, cap_s=1.0)
        with Client(self._url, timeout=60, retry=retry) as client:
            model = first
            while not stop.is_set():
                try:
                    if self._model is not None:
                        np.testing.assert_array_equal(client.infer(self._model, {"INPUT0": x})["OUTPUT0"], x)
                        self.answered += 1
                        continue
                    answer = client.infer(f"model-{model % 10}", {"INPUT0": x})["OUTPUT0"]
                    np.testing.assert_array_equal(answer, x + model % 10)
                    self.answered += 1
                except Exception as exc:
                    self.failures.append(repr(exc))
                model += 1

    def stop(self) -> None:
        self.resize(0)


def until(predicate: Callable[[], bool], what: str, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def test_a_replica_killed_under_load_loses_no_request(app: RayApp) -> None:
    before = app.replicas()
    load = Load(app)
    try:
        until(lambda: load.answered > 20, "requests to be answered")
        app.cluster.call("kill_actor", before[0]["actor"])
        until(lambda: len(ids := {r["replica"] for r in app.replicas()}) == 2 and before[0]["replica"] not in ids,
              "the killed replica to be replaced")
        answered = load.answered
        until(lambda: load.answered > answered + 20, "requests to the new replicas")
    finally:
        load.stop()
    assert load.failures == []


def test_autoscaling_1_3_1_under_load_loses_no_request(app: RayApp) -> None:
    """Ray Serve's autoscaling on ongoing requests per replica: 1 replica for one client, 3 for six, and back. The
    clients call a model that holds each request 50 ms: with models that answer in a millisecond, how many requests
    were ongoing depended on how fast the machine ran the clients, and on a loaded CI machine six clients of the
    1 MiB models did not bring a third replica within 120 s."""
    app.resize({"num_replicas": "auto", "autoscaling_config": {
        "min_replicas": 1, "max_replicas": 3, "initial_replicas": 1, "target_ongoing_requests": 1,
        "upscale_delay_s": 0.5, "downscale_delay_s": 1.0, "metrics_interval_s": 0.2, "look_back_period_s": 0.5}})
    load = Load(app, clients=1, model="sleeper")
    try:
        until(lambda: len(app.replicas()) == 1, "1 replica")
        triton_http.InferenceServerClient(f"127.0.0.1:{app.port}").load_model("model-44", config=OVERRIDE)
        load.resize(6)
        until(lambda: len(app.replicas()) == 3, "3 replicas under load")
        assert app.max_batch_sizes("model-44") == [2, 2, 2], "the new replicas learnt the load from the first"
        answered = load.answered
        until(lambda: load.answered > answered + 20, "requests with 3 replicas")
        load.resize(1)
        until(lambda: len(app.replicas()) == 1, "1 replica once the load is gone")
        answered = load.answered
        until(lambda: load.answered > answered + 5, "requests after scaling down")
    finally:
        load.stop()
    assert load.failures == []
