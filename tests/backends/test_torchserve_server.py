"""TorchServe archives served from a repository by `modelhost serve`: the torchserve backend end to end, over
KServe V2 (BYTES `body` in, the handler's answer as `response`), with real archives and a real server.

The repository holds archives in each of torch-model-archiver's formats and places:
- `echo/1/model.mar` (zip): BEHAVING, batchSize 8 and a 200 ms maxBatchDelay, a 2 s responseTimeout;
- `plain/1/plain.mar`: a module-level handle, no YAML (TorchServe's defaults: batchSize 1);
- `tgz/1/model.mar`: the tgz format under the default name; `unpacked/1/`: the no-archive format as the version
  directory itself.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import requests
import tritonclient.http as httpclient

from tests.backends.torchserve_archives import BEHAVING, MODULE_HANDLE, make_archive
from tests.server import ServerProcess

pytest.importorskip("ts")

ECHO_CONFIG = """
batchSize: 8
maxBatchDelay: 200
responseTimeout: 2
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repo = tmp_path_factory.mktemp("torchserve_repo")
    made = tmp_path_factory.mktemp("archives")
    for name, handler, config, version_file, archive_format in (
        ("echo", BEHAVING, ECHO_CONFIG, "model.mar", "default"),
        ("plain", MODULE_HANDLE, None, "plain.mar", "default"),
        ("tgz", MODULE_HANDLE, None, "model.mar", "tgz"),
    ):
        archive = make_archive(made, name, handler, config=config, archive_format=archive_format)
        (repo / name / "1").mkdir(parents=True)
        shutil.move(archive, repo / name / "1" / version_file)
    unpacked = make_archive(made, "unpacked", MODULE_HANDLE, archive_format="no-archive")
    (repo / "unpacked").mkdir()
    shutil.move(unpacked, repo / "unpacked" / "1")
    process = ServerProcess(repo).wait_ready()
    yield process
    process.stop()


def infer(server: ServerProcess, model: str, *bodies: bytes) -> requests.Response:
    body = {"inputs": [{"name": "body", "datatype": "BYTES", "shape": [len(bodies), 1],
                        "data": [b.decode() for b in bodies]}]}
    return requests.post(f"{server.base}/v2/models/{model}/infer", json=body, timeout=30)


def answers(response: requests.Response) -> list[Any]:
    assert response.status_code == 200, response.text
    (output,) = response.json()["outputs"]
    assert output["name"] == "response" and output["datatype"] == "BYTES"
    return [json.loads(item) for item in output["data"]]


def test_every_archive_format_loads_and_answers(server: ServerProcess) -> None:
    for model in ("plain", "tgz", "unpacked"):
        assert answers(infer(server, model, b"abc")) == [{"length": 3, "model": model, "batch": 1}]
    # Two requests in one, to a handler of batch size 1: the worker hands them to it one at a time.
    assert answers(infer(server, "plain", b"abc", b"de")) == [{"length": 3, "model": "plain", "batch": 1},
                                                             {"length": 2, "model": "plain", "batch": 1}]
    assert [a["echo"] for a in answers(infer(server, "echo", b"abc", b"de"))] == ["abc", "de"]


def test_metadata_and_config_come_from_the_archive(server: ServerProcess) -> None:
    metadata = requests.get(f"{server.base}/v2/models/echo", timeout=5).json()
    # One request per row, as Triton shapes a string per row: dims [ 1 ] over the batch dim.
    assert metadata["inputs"] == [{"name": "body", "datatype": "BYTES", "shape": [-1, 1]}]
    assert metadata["outputs"] == [{"name": "response", "datatype": "BYTES", "shape": [-1, 1]}]
    config = requests.get(f"{server.base}/v2/models/echo/config", timeout=5).json()
    assert config["backend"] == "torchserve"
    assert config["max_batch_size"] == 8
    assert config["parameters"]["handler_batch_size"]["string_value"] == "8"
    assert config["dynamic_batching"]["max_queue_delay_microseconds"] == 200_000
    assert config["parameters"]["execute_timeout_seconds"]["string_value"] == "2"
    plain = requests.get(f"{server.base}/v2/models/plain/config", timeout=5).json()
    assert plain["parameters"]["handler_batch_size"]["string_value"] == "1"  # TorchServe's default batchSize
    assert plain["max_batch_size"] == 32  # what waits goes to the worker at once, for the handler one by one
    assert plain["dynamic_batching"]["max_queue_delay_microseconds"] == 0


def test_concurrent_requests_reach_the_handler_as_one_batch(server: ServerProcess) -> None:
    client = httpclient.InferenceServerClient(server.url, concurrency=8)
    try:
        pending = []
        for index in range(8):
            body = httpclient.InferInput("body", [1, 1], "BYTES")
            body.set_data_from_numpy(np.array([[f"r{index}".encode()]], dtype=object))
            pending.append((index, client.async_infer("echo", [body])))
        results = [(index, json.loads(p.get_result().as_numpy("response")[0, 0])) for index, p in pending]
    finally:
        client.close()
    assert [answer["echo"] for _, answer in results] == [f"r{index}" for index, _ in results]
    assert max(answer["batch"] for _, answer in results) > 1


def test_handler_failures_are_clear_errors_and_the_model_keeps_serving(server: ServerProcess) -> None:
    pid = answers(infer(server, "echo", b"ok"))[0]["pid"]
    raised = infer(server, "echo", b"raise")
    assert raised.status_code == 500
    assert "Prediction failed" in raised.json()["error"] and "ValueError: asked to raise" in raised.json()["error"]
    wrong = infer(server, "echo", b"count", b"x")
    assert wrong.status_code == 500
    assert "returned 1 response(s) for a batch of 2 request(s)" in wrong.json()["error"]
    assert answers(infer(server, "echo", b"ok"))[0]["pid"] == pid  # the same worker: nothing crashed

    with ThreadPoolExecutor(1) as pool:
        hung = pool.submit(infer, server, "echo", b"hang").result()
    assert hung.status_code == 504, hung.text
    assert "did not answer within 2 s" in hung.json()["error"]
    after_hang = answers(infer(server, "echo", b"ok"))[0]["pid"]
    assert after_hang != pid

    died = infer(server, "echo", b"exit")
    assert died.status_code == 500 and "exited with code 3" in died.json()["error"]
    assert answers(infer(server, "echo", b"ok"))[0]["pid"] not in (pid, after_hang)
    assert answers(infer(server, "plain", b"still"))[0]["length"] == 5


def test_a_torchserve_model_store_is_a_repository(tmp_path: Path) -> None:
    store = tmp_path / "store"
    store.mkdir()
    make_archive(store, "lengths", MODULE_HANDLE)
    make_archive(store, "echo", BEHAVING)
    process = ServerProcess(store).wait_ready()
    try:
        index = requests.post(f"{process.base}/v2/repository/index", timeout=10).json()
        assert sorted((m["name"], m["state"]) for m in index) == [("echo", "READY"), ("lengths", "READY")]
        assert answers(infer(process, "lengths", b"abcde")) == [{"length": 5, "model": "lengths", "batch": 1}]
    finally:
        process.stop()
