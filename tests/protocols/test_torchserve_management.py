"""TorchServe's management API (tsfs §A2) on `modelhost torchserve` with enable_model_api: register (from the model
store, by URL, with a JSON body), describe, list with paging, scale workers under traffic with no failed request,
set-default and unregister, each answered as TorchServe answers."""

from __future__ import annotations

import functools
import http.server
import json
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import requests

from tests.backends.torchserve_archives import BEHAVING, MODULE_HANDLE, make_archive
from tests.server import TorchServeProcess

pytest.importorskip("ts")

V2 = "def handle(data, context):\n    return data and ['v2'] * len(data)\n"


@pytest.fixture(scope="module")
def archives(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("torchserve_management")
    store = root / "store"
    store.mkdir()
    make_archive(store, "echo", BEHAVING, version="1.0", config="batchSize: 4\nmaxBatchDelay: 20\n")
    make_archive(root, "echo", V2, version="2.0").rename(store / "echo-v2.mar")
    make_archive(store, "lengths", MODULE_HANDLE)
    for index in range(5):
        make_archive(store, f"many{index}", MODULE_HANDLE)
    (root / "web").mkdir()
    make_archive(root / "web", "remote", MODULE_HANDLE)
    return root


@pytest.fixture(scope="module")
def server(archives: Path) -> Iterator[TorchServeProcess]:
    process = TorchServeProcess(archives, "--model-store", str(archives / "store"), properties=(
        "disable_token_authorization=true\nenable_model_api=true\n"
        "allowed_urls=http://127\\\\.0\\\\.0\\\\.1:\\\\d+/.*\n"))
    process.wait_ready()
    yield process
    process.stop()


def manage(server: TorchServeProcess, method: str, path: str, **kwargs: Any) -> requests.Response:
    return requests.request(method, f"{server.management}{path}", timeout=120, **kwargs)


def predict(server: TorchServeProcess, model: str, body: bytes = b"x") -> requests.Response:
    return requests.post(f"{server.inference}/predictions/{model}", data=body,
                         headers={"Content-Type": "application/octet-stream"}, timeout=60)


def test_register_describe_and_list(server: TorchServeProcess) -> None:
    assert manage(server, "POST", "/models").json() == {
        "code": 400, "type": "BadRequestException", "message": "Parameter url is required."}
    registered = manage(server, "POST", "/models?url=lengths.mar&initial_workers=1&synchronous=true")
    assert registered.status_code == 200, registered.text
    assert registered.json() == {"status": 'Model "lengths" Version: 1.0 registered with 1 initial workers'}
    again = manage(server, "POST", "/models?url=lengths.mar&initial_workers=1")
    assert again.status_code == 409
    assert again.json()["message"] == "Model version 1.0 is already registered for model lengths"
    assert json.loads(predict(server, "lengths", b"abcd").content)["length"] == 4

    (described,) = manage(server, "GET", "/models/lengths").json()
    assert {k: described[k] for k in ("modelName", "modelVersion", "modelUrl", "runtime", "minWorkers",
                                      "maxWorkers", "batchSize", "maxBatchDelay", "loadedAtStartup")} == {
        "modelName": "lengths", "modelVersion": "1.0", "modelUrl": "lengths.mar", "runtime": "python",
        "minWorkers": 1, "maxWorkers": 1, "batchSize": 1, "maxBatchDelay": 100, "loadedAtStartup": False}
    (worker,) = described["workers"]
    assert worker["status"] == "READY" and worker["pid"] > 0 and worker["memoryUsage"] > 0
    assert described["jobQueueStatus"] == {"remainingCapacity": 100, "pendingRequests": 0}

    zero = manage(server, "POST", "/models", json={"url": "many0.mar", "model_name": "zero"})
    assert zero.json() == {"status": 'Model "zero" Version: 1.0 registered with 0 initial workers. Use scale '
                                     "workers API to add workers for the model."}
    assert predict(server, "zero").status_code == 503
    for index in range(1, 5):
        assert manage(server, "POST", f"/models?url=many{index}.mar").status_code == 200
    first = manage(server, "GET", "/models?limit=2").json()
    assert first == {"nextPageToken": "2", "models": [{"modelName": "lengths", "modelUrl": "lengths.mar"},
                                                     {"modelName": "many1", "modelUrl": "many1.mar"}]}
    rest = manage(server, "GET", "/models?limit=10&next_page_token=2").json()
    assert "nextPageToken" not in rest
    assert [m["modelName"] for m in rest["models"]] == ["many2", "many3", "many4", "zero"]


def test_versions_set_default_and_unregister(server: TorchServeProcess) -> None:
    assert manage(server, "POST", "/models?url=echo.mar&initial_workers=1").status_code == 200
    assert manage(server, "POST", "/models?url=echo-v2.mar&initial_workers=1").status_code == 200
    assert json.loads(predict(server, "echo").content)["echo"] == "x"  # the first registered is the default
    assert [d["modelVersion"] for d in manage(server, "GET", "/models/echo/all").json()] == ["1.0", "2.0"]
    assert manage(server, "GET", "/models/echo/2.0").json()[0]["batchSize"] == 1
    assert manage(server, "GET", "/models/echo/1.0").json()[0]["batchSize"] == 4  # its YAML's

    changed = manage(server, "PUT", "/models/echo/2.0/set-default")
    assert changed.json() == {"status": 'Default version successfully updated for model "echo" to "2.0"'}
    assert predict(server, "echo").content == b"v2"
    missing = manage(server, "PUT", "/models/echo/3.0/set-default")
    assert (missing.status_code, missing.json()["message"]) == (404, "Model version 3.0 does not exist for model echo")

    refused = manage(server, "DELETE", "/models/echo/2.0")
    assert (refused.status_code, refused.json()["type"]) == (403, "InvalidModelVersionException")
    assert manage(server, "DELETE", "/models/echo/1.0").json() == {"status": 'Model "echo" unregistered'}
    assert requests.post(f"{server.inference}/predictions/echo/1.0", data=b"x", timeout=30).status_code == 404
    assert manage(server, "DELETE", "/models/echo").status_code == 200
    assert predict(server, "echo").status_code == 404
    assert manage(server, "GET", "/models/echo").json()["type"] == "ModelNotFoundException"


def test_scaling_under_traffic_fails_no_request(server: TorchServeProcess) -> None:
    assert manage(server, "POST", "/models?url=echo.mar&model_name=scaled&initial_workers=1").status_code == 200
    stop = threading.Event()
    statuses: list[int] = []

    def traffic() -> None:
        while not stop.is_set():
            statuses.append(predict(server, "scaled", b"ok").status_code)

    with ThreadPoolExecutor(4) as pool:
        senders = [pool.submit(traffic) for _ in range(3)]
        up = manage(server, "PUT", "/models/scaled?min_worker=3&synchronous=true")
        assert up.json() == {"status": "Workers scaled to 3 for model: scaled"}
        pids = {w["pid"] for w in manage(server, "GET", "/models/scaled").json()[0]["workers"]}
        assert len(pids) == 3
        down = manage(server, "PUT", "/models/scaled?min_worker=1")
        assert (down.status_code, down.json()) == (202, {"status": "Processing worker updates..."})
        deadline = time.monotonic() + 60
        while len(manage(server, "GET", "/models/scaled").json()[0]["workers"]) != 1:
            assert time.monotonic() < deadline
            time.sleep(0.2)
        stop.set()
        for sender in senders:
            sender.result()
    assert len(statuses) > 20 and set(statuses) == {200}
    bad = manage(server, "PUT", "/models/scaled?min_worker=3&max_worker=2")
    assert (bad.status_code, bad.json()["message"]) == (400, "max_worker cannot be less than min_worker.")
    many = manage(server, "PUT", "/models/scaled?min_worker=1000")
    assert (many.status_code, many.json()["message"]) == (400, "1000 workers is more than the 128 a model may have")


def test_register_by_url_downloads_into_the_model_store(server: TorchServeProcess, archives: Path) -> None:
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(archives / "web"))
    web = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=web.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{web.server_address[1]}/remote.mar"
        registered = manage(server, "POST", "/models", params={"url": url, "initial_workers": "1"})
        assert registered.status_code == 200, registered.text
        assert (archives / "store" / "remote.mar").is_file()
        assert json.loads(predict(server, "remote", b"abc").content)["length"] == 3
        assert manage(server, "GET", "/models/remote").json()[0]["modelUrl"] == url
        again = manage(server, "POST", "/models", params={"url": url})
        assert (again.status_code, again.json()["message"]) == (500, "Model file already exists remote.mar")
    finally:
        web.shutdown()
    refused = manage(server, "POST", "/models", params={"url": "https://example.com/x.mar"})
    assert refused.status_code == 400 and "does not match any allowed URL" in refused.json()["message"]
    outside = manage(server, "POST", "/models", params={"url": "/etc/passwd"})
    assert outside.status_code == 400 and outside.json()["message"] == "passwd is not in the model store"


def test_a_register_body_that_is_not_usable_json_is_a_bad_request(server: TorchServeProcess) -> None:
    for body in (b"[" * 200_000, b"{\"url\": ", b"[1, 2]"):  # nested past any parser's depth, cut short, not an object
        response = manage(server, "POST", "/models", data=body, headers={"Content-Type": "application/json"})
        assert response.status_code == 400, (body[:20], response.text)
        assert response.json()["type"] == "BadRequestException"
    assert manage(server, "GET", "/models").status_code == 200  # and it serves on
