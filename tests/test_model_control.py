"""Model control modes end to end: explicit load/unload over HTTP and gRPC (tritonclient), poll mode,
and the API refused in the modes that do not take it."""

from __future__ import annotations

import json
import shutil
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import requests
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.onnx_models import scale_model, write_model
from tests.server import ServerProcess, wait_for

CONFIG = """
platform: "onnxruntime_onnx"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
"""
CONFIG_JSON = json.dumps({
    "platform": "onnxruntime_onnx", "max_batch_size": 8,
    "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [4]}],
    "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [4]}],
})


def repository(root: Path, models: dict[str, float]) -> Path:
    for name, factor in models.items():
        write_model(root, name, scale_model(factor), CONFIG)
    return root


def factor(client: httpclient.InferenceServerClient | grpcclient.InferenceServerClient, name: str) -> float:
    module = httpclient if isinstance(client, httpclient.InferenceServerClient) else grpcclient
    x = module.InferInput("INPUT0", [1, 4], "FP32")
    x.set_data_from_numpy(np.ones((1, 4), np.float32))
    return float(client.infer(name, [x]).as_numpy("OUTPUT0")[0, 0])


def index(server: ServerProcess) -> dict[str, list[dict[str, str]]]:
    entries: dict[str, list[dict[str, str]]] = {}
    for entry in requests.post(server.base + "/v2/repository/index", timeout=10).json():
        entries.setdefault(entry["name"], []).append(entry)
    return entries


# --------------------------------------------------------------------------- explicit


def test_explicit_mode_over_http(start_server, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    repo = repository(tmp_path / "repo", {"a": 2.0, "b": 3.0, "c": 4.0})
    server = start_server(repo, "--model-control-mode", "explicit", "--load-model", "a")
    client = httpclient.InferenceServerClient(server.url)
    try:
        assert factor(client, "a") == 2.0
        assert not client.is_model_ready("b")
        # Models never loaded are listed by name only.
        assert index(server)["b"] == [{"name": "b"}]
        assert index(server)["a"] == [{"name": "a", "version": "1", "state": "READY"}]

        client.load_model("b")
        assert factor(client, "b") == 3.0
        client.unload_model("a")
        assert not client.is_model_ready("a")
        assert index(server)["a"] == [{"name": "a", "version": "1", "state": "UNAVAILABLE", "reason": "unloaded"}]
        with pytest.raises(InferenceServerException, match="unloaded"):
            factor(client, "a")
        assert factor(client, "b") == 3.0

        # A config override, then an override directory from files (tritonclient base64-encodes them).
        client.load_model("c", config=CONFIG_JSON.replace('"max_batch_size": 8', '"max_batch_size": 2'))
        assert client.get_model_config("c")["max_batch_size"] == 2
        client.load_model("c", config=CONFIG_JSON, files={"file:3/model.onnx": scale_model(11.0).SerializeToString()})
        assert factor(client, "c") == 11.0
        assert client.get_model_metadata("c")["versions"] == ["3"]

        with pytest.raises(InferenceServerException, match="failed to load 'nope', failed to poll from model "
                           "repository"):  # Triton's words, which Triton's own tests match
            client.load_model("nope")
        with pytest.raises(InferenceServerException, match="need a 'config' parameter"):
            client.load_model("c", files={"file:1/model.onnx": b"x"})
        assert factor(client, "c") == 11.0
    finally:
        client.close()


def test_explicit_load_errors_are_v2_errors(start_server, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    repo = repository(tmp_path / "repo", {"a": 2.0})
    (repo / "broken" / "1").mkdir(parents=True)
    (repo / "broken" / "1" / "model.onnx").write_bytes(b"not onnx")
    server = start_server(repo, "--model-control-mode", "explicit")
    base = server.base + "/v2/repository/models"
    response = requests.post(f"{base}/broken/load", timeout=30)
    assert response.status_code == 503 and "model.onnx" in response.json()["error"]
    assert index(server)["broken"][0]["state"] == "UNAVAILABLE"
    response = requests.post(f"{base}/nope/load", timeout=30)
    assert response.status_code == 404 and "nope" in response.json()["error"]
    response = requests.post(f"{base}/a/load", json={"parameters": {"file:1/model.onnx": "%%%", "config": "{}"}},
                             timeout=30)
    assert response.status_code == 400 and "'file:1/model.onnx' is not valid base64" in response.json()["error"]
    response = requests.post(f"{base}/a/load", json={"parameters": {"config": {"not": "a string"}}}, timeout=30)
    assert response.status_code == 400 and "'config' must be a string" in response.json()["error"]
    # Every refused load says "failed to load '<name>'", as Triton's do (its model-control example matches it).
    response = requests.post(f"{base}/a/load", json={"parameters": {"config": '"max_batch_size": {{8}}'}},
                             timeout=30)
    assert response.status_code == 400 and response.json()["error"].startswith("failed to load 'a': ")
    response = requests.post(f"{base}/a/unload", json={"parameters": {"unload_dependents": "yes"}}, timeout=30)
    assert response.status_code == 400 and "unload_dependents" in response.json()["error"]
    assert requests.post(f"{base}/a/load", timeout=30).status_code == 200


def test_explicit_mode_over_grpc(start_server, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    repo = repository(tmp_path / "repo", {"a": 2.0, "b": 3.0})
    server = start_server(repo, "--model-control-mode", "explicit", "--load-model", "*")
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        assert factor(client, "a") == 2.0 and factor(client, "b") == 3.0
        client.unload_model("a")
        assert not client.is_model_ready("a")
        states = {(m.name, m.state) for m in client.get_model_repository_index().models}
        assert ("a", "UNAVAILABLE") in states and ("b", "READY") in states
        client.load_model("a", config=CONFIG_JSON, files={"file:2/model.onnx": scale_model(6.0).SerializeToString()})
        assert factor(client, "a") == 6.0
        with pytest.raises(InferenceServerException, match="failed to load 'nope', failed to poll from model "
                           "repository"):  # Triton's words, which Triton's own tests match
            client.load_model("nope")
        with pytest.raises(InferenceServerException, match="failed to load 'a': load parameter 'config'") as error:
            client.load_model("a", config='"max_batch_size": {{8}}')
        assert error.value.status() == "StatusCode.INVALID_ARGUMENT"
    finally:
        client.close()


@pytest.mark.parametrize("mode", ["none", "poll"])
def test_load_and_unload_refused_outside_explicit_mode(start_server, tmp_path: Path, mode: str) -> None:  # type: ignore[no-untyped-def]
    server = start_server(repository(tmp_path / "repo", {"a": 2.0}), "--model-control-mode", mode)
    for action in ("load", "unload"):
        response = requests.post(f"{server.base}/v2/repository/models/a/{action}", timeout=10)
        # Triton's status and words (model_analyzer matches "polling is enabled"), then what they mean here
        assert response.status_code == 503
        assert response.json()["error"].startswith("explicit model load / unload is not allowed if polling is enabled")
        assert f"model control mode is '{mode}'" in response.json()["error"]
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        with pytest.raises(InferenceServerException, match="explicit") as error:
            client.load_model("a")
        assert error.value.status() == "StatusCode.UNAVAILABLE"
        assert "explicit model load / unload is not allowed if polling is enabled" in error.value.message()
    finally:
        client.close()


def test_load_does_not_block_other_models(start_server, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """While a model loads (slowly, warming up), another model answers as fast as before."""
    repo = repository(tmp_path / "repo", {"fast": 2.0})
    slow = write_model(repo, "slow", scale_model(3.0, width=4096), CONFIG.replace("[ 4 ]", "[ 4096 ]") + """
model_warmup [ { name: "long" batch_size: 8 count: 15000
  inputs { key: "INPUT0" value: { data_type: TYPE_FP32 dims: [ 4096 ] random_data: true } } } ]
""")
    assert slow.exists()
    server = start_server(repo, "--model-control-mode", "explicit", "--load-model", "fast")
    client = httpclient.InferenceServerClient(server.url)
    try:
        before = [_timed(lambda: factor(client, "fast")) for _ in range(20)]
        loading = threading.Thread(target=requests.post, args=(f"{server.base}/v2/repository/models/slow/load",),
                                   kwargs={"timeout": 120})
        loading.start()
        wait_for(lambda: index(server)["slow"][0].get("state") == "LOADING", what="slow model loading")
        ready_while_loading = requests.get(f"{server.base}/v2/health/ready", timeout=10).status_code
        during = []
        while index(server)["slow"][0].get("state") == "LOADING" and len(during) < 200:
            during.append(_timed(lambda: factor(client, "fast")))
        loading.join()
        assert len(during) >= 10, "the slow model loaded too fast to test anything"
        assert ready_while_loading == 200, "a load after start made the server unready"
        assert np.median(during) < max(10 * np.median(before), 0.05), (np.median(before), np.median(during))
        assert client.is_model_ready("slow")
    finally:
        client.close()


def _timed(call) -> float:  # type: ignore[no-untyped-def]
    started = time.monotonic()
    call()
    return time.monotonic() - started


# --------------------------------------------------------------------------- poll


def test_poll_mode_applies_changes(start_server, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    repo = repository(tmp_path / "repo", {"a": 2.0})
    server = start_server(repo, "--model-control-mode", "poll", "--repository-poll-secs", "0.2")
    client = httpclient.InferenceServerClient(server.url)
    try:
        assert factor(client, "a") == 2.0
        write_model(repo, "a", scale_model(5.0), CONFIG, version=2)
        wait_for(lambda: factor(client, "a") == 5.0, timeout=10, what="version 2 serving")
        wait_for(lambda: [e["version"] for e in index(server)["a"]] == ["2"], timeout=10, what="version 1 unloaded")
        write_model(repo, "b", scale_model(7.0), CONFIG)
        wait_for(lambda: client.is_model_ready("b"), timeout=10, what="new model b")
        assert factor(client, "b") == 7.0
        shutil.rmtree(repo / "b")
        wait_for(lambda: "b" not in index(server), timeout=10, what="model b removed")
        assert factor(client, "a") == 5.0
    finally:
        client.close()


def test_reload_under_load_fails_no_request(start_server, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """Clients keep sending while the model is reloaded with new files, five times: every request succeeds,
    and answers move from the old version's to the new one's."""
    repo = repository(tmp_path / "repo", {"a": 2.0})
    server = start_server(repo, "--model-control-mode", "explicit", "--load-model", "a")
    body = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 4], "data": [1, 1, 1, 1]}]}
    stop = threading.Event()
    answers: list[float] = []
    failures: list[str] = []

    def client() -> None:
        with requests.Session() as session:
            while not stop.is_set():
                response = session.post(f"{server.base}/v2/models/a/infer", json=body, timeout=30)
                if response.status_code == 200:
                    answers.append(response.json()["outputs"][0]["data"][0])
                else:
                    failures.append(response.text)

    clients = [threading.Thread(target=client) for _ in range(4)]
    for thread in clients:
        thread.start()
    try:
        for factor_ in (3.0, 4.0, 5.0, 6.0, 7.0):
            write_model(repo, "a", scale_model(factor_), CONFIG)
            response = requests.post(f"{server.base}/v2/repository/models/a/load", timeout=60)
            assert response.status_code == 200, response.text
            count = len(answers)
            wait_for(lambda count=count: len(answers) > count + 20, timeout=10, what="answers after the reload")
            assert answers[-1] == factor_
    finally:
        stop.set()
        for thread in clients:
            thread.join()
    assert not failures, failures[:3]
    assert set(answers) == {2.0, 3.0, 4.0, 5.0, 6.0, 7.0}
