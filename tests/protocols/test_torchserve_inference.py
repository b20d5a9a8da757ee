"""TorchServe's inference API (tsfs §A1) served by `modelhost torchserve`, called with `requests` as TorchServe's
users call it, on archives made by torch-model-archiver.

The model store holds `echo.mar` (version 1.0, BEHAVING: batchSize 8, a 2 s responseTimeout), `echo-v2.mar`
(model echo, version 2.0) and `kinds.mar` (a handler that says what it was given).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import requests

from tests.backends.torchserve_archives import BEHAVING, make_archive
from tests.server import TorchServeProcess, free_port

pytest.importorskip("ts")

KINDS = '''
import json


def handle(data, context):
    if data is None:
        return None
    answers = []
    for index, row in enumerate(data):
        headers = context.get_all_request_header(index)
        answers.append(json.dumps({
            "parameters": {name: [type(value).__name__, value if isinstance(value, (str, dict, list)) else
                                  bytes(value).decode("latin-1")] for name, value in row.items()},
            "content_types": {name: headers[name]["content-type"] for name in row},
            "url_path": context.get_request_header(index, "url_path"),
            "explain": context.get_request_header(index, "explain"),
            "custom": context.get_request_header(index, "x-custom"),
            "request_id": context.get_request_id(index),
        }))
        status = context.get_request_header(index, "x-status")
        if status:
            context.set_response_status(int(status), "Chosen", index)
        context.set_response_content_type(index, "application/json")
        context.set_response_header(index, "x-handler", "kinds")
    return answers
'''
ECHO_CONFIG = """
minWorkers: 1
batchSize: 8
maxBatchDelay: 100
responseTimeout: 2
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TorchServeProcess]:
    root = tmp_path_factory.mktemp("torchserve")
    store = root / "store"
    store.mkdir()
    make_archive(store, "echo", BEHAVING, version="1.0", config=ECHO_CONFIG)
    v2 = make_archive(root, "echo", "def handle(data, context):\n    return data and ['v2'] * len(data)\n",
                      version="2.0")
    v2.rename(store / "echo-v2.mar")
    make_archive(store, "kinds", KINDS)
    modelhost_metrics = free_port()
    process = TorchServeProcess(root, "--model-store", str(store), "--models", "echo=echo.mar",
                                "echo=echo-v2.mar", "kinds.mar",
                                "--modelhost-metrics-port", str(modelhost_metrics),
                                properties="disable_token_authorization=true\ndefault_workers_per_model=1\n"
                                           "metrics_mode=prometheus\n")
    process.modelhost_metrics = f"http://127.0.0.1:{modelhost_metrics}"  # type: ignore[attr-defined]
    process.wait_ready()
    yield process
    process.stop()


def kinds(server: TorchServeProcess, **kwargs: Any) -> dict[str, Any]:
    response = requests.post(f"{server.inference}/predictions/kinds", timeout=30, **kwargs)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == "application/json"
    return json.loads(response.content)


def test_ping_is_healthy_in_torchserve_json(server: TorchServeProcess) -> None:
    response = requests.get(f"{server.inference}/ping", timeout=5)
    assert response.status_code == 200
    assert response.text == '{\n  "status": "Healthy"\n}\n'
    assert response.headers["content-type"] == "application/json"
    assert requests.post(f"{server.inference}/ping", timeout=5).status_code == 200


def test_a_raw_body_is_the_body_parameter_decoded_by_its_content_type(server: TorchServeProcess) -> None:
    raw = kinds(server, data=b"\x00\x01", headers={"Content-Type": "application/octet-stream", "X-Custom": "c"})
    assert raw["parameters"] == {"body": ["bytearray", "\x00\x01"]}
    assert raw["content_types"] == {"body": "application/octet-stream"}
    assert (raw["custom"], raw["url_path"], raw["explain"]) == ("c", "", "False")
    document = kinds(server, json={"instances": [1, 2]})
    assert document["parameters"] == {"body": ["dict", {"instances": [1, 2]}]}
    text = kinds(server, data="café".encode(), headers={"Content-Type": "text/plain; charset=utf-8"})
    assert text["parameters"] == {"body": ["str", "café"]}
    no_type = kinds(server, data=b"abc", headers={"Content-Type": ""})
    assert no_type["parameters"] == {"body": ["bytearray", "abc"]}


def test_form_fields_are_parameters(server: TorchServeProcess) -> None:
    multipart = kinds(server, files={"data": ("image.png", b"\x89PNG", "image/png"),
                                     "meta": ("meta.json", b'{"k": 1}', "application/json")},
                      data={"plain": "text"})
    assert multipart["parameters"] == {"plain": ["bytearray", "text"], "data": ["bytearray", "\x89PNG"],
                                       "meta": ["dict", {"k": 1}]}
    assert multipart["content_types"] == {"plain": "", "data": "image/png", "meta": "application/json"}
    form = kinds(server, data={"a": "1", "b": "é"})
    assert form["parameters"] == {"a": ["bytearray", "1"], "b": ["bytearray", "é".encode().decode("latin-1")]}


def test_answers_carry_the_handlers_status_and_headers_and_torchserves(server: TorchServeProcess) -> None:
    response = requests.post(f"{server.inference}/predictions/kinds", data=b"x", headers={"x-status": "418"},
                             timeout=30)
    assert response.status_code == 418
    assert response.headers["x-handler"] == "kinds"
    assert response.headers["cache-control"] == "no-cache; no-store, must-revalidate, private"
    assert response.headers["pragma"] == "no-cache"
    assert json.loads(response.content)["request_id"] == response.headers["x-request-id"]
    echo = requests.post(f"{server.inference}/predictions/echo", data=b"hi",
                         headers={"Content-Type": "application/octet-stream"}, timeout=30)
    assert echo.status_code == 200 and "content-type" not in echo.headers  # TorchServe sets none unless asked
    assert json.loads(echo.content)["echo"] == "hi"


def test_versions_extra_path_explanations_and_invocations(server: TorchServeProcess) -> None:
    post = requests.post
    assert post(f"{server.inference}/predictions/echo/2.0", data=b"x", timeout=30).content == b"v2"
    assert json.loads(post(f"{server.inference}/predictions/echo/1.0", data=b"x", timeout=30).content)["echo"] == "x"
    extra = kinds_at(server, "/predictions/kinds/1.0/a/b")
    assert extra["url_path"] == "a/b"
    assert kinds_at(server, "/explanations/kinds")["explain"] == "True"
    assert kinds_at(server, "/v1/models/kinds:explain")["explain"] == "True"
    invoked = kinds_at(server, "/invocations?model_name=kinds&extra=1")
    assert invoked["parameters"]["extra"] == ["bytearray", "1"]


def kinds_at(server: TorchServeProcess, path: str) -> dict[str, Any]:
    response = requests.post(f"{server.inference}{path}", data=b"x", headers={"Content-Type": "text/plain"},
                             timeout=30)
    assert response.status_code == 200, response.text
    return json.loads(response.content)


@pytest.mark.parametrize(("method", "path", "status", "kind", "message"), [
    ("POST", "/predictions/nope", 404, "ModelNotFoundException", "Model not found: nope"),
    ("POST", "/predictions/echo/9.9", 404, "ModelVersionNotFoundException",
     "Model version: 9.9 does not exist for model: echo"),
    ("GET", "/nothing/here", 404, "ResourceNotFoundException",
     "Requested resource is not found, please refer to API document."),
    ("DELETE", "/ping", 405, "MethodNotAllowedException",
     "Requested method is not allowed, please refer to API document."),
    ("POST", "/invocations", 400, "BadRequestException", "Parameter model_name is required."),
])
def test_errors_are_torchserves(server: TorchServeProcess, method: str, path: str, status: int, kind: str,
                                message: str) -> None:
    response = requests.request(method, f"{server.inference}{path}", data=b"x", timeout=30)
    assert response.status_code == status
    assert response.json() == {"code": status, "type": kind, "message": message}
    assert response.text.endswith("\n}\n")  # pretty-printed, as Gson writes it


def test_handler_failures_each_get_torchserves_answer_and_the_model_keeps_serving(server: TorchServeProcess) -> None:
    def echo(body: bytes) -> requests.Response:
        return requests.post(f"{server.inference}/predictions/echo", data=body,
                             headers={"Content-Type": "application/octet-stream"}, timeout=30)

    pid = json.loads(echo(b"ok").content)["pid"]
    raised = echo(b"raise")
    assert raised.status_code == 503
    assert raised.json()["type"] == "InternalServerException"
    assert raised.json()["message"].startswith("Prediction failed: handler 'handler.py' of model 'echo' raised "
                                               "ValueError: asked to raise")
    missing = echo(b"missing")
    assert (missing.status_code, missing.json()["message"]) == (404, "no such item")
    hung = echo(b"hang")
    assert hung.status_code == 504 and "did not answer within 2 s" in hung.json()["message"]
    died = echo(b"exit")
    assert died.status_code == 500 and "exited with code 3" in died.json()["message"]
    answer = json.loads(echo(b"ok").content)
    assert answer["echo"] == "ok" and answer["pid"] != pid


def test_concurrent_requests_reach_the_handler_as_batches(server: TorchServeProcess) -> None:
    def echo(index: int) -> dict[str, Any]:
        response = requests.post(f"{server.inference}/predictions/echo", data=f"r{index}".encode(),
                                 headers={"Content-Type": "application/octet-stream"}, timeout=30)
        assert response.status_code == 200, response.text
        return json.loads(response.content)

    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(echo, range(16)))
    assert [a["echo"] for a in answers] == [f"r{index}" for index in range(16)]
    assert max(a["batch"] for a in answers) > 1
    assert max(a["batch"] for a in answers) <= 8


def test_stop_stops_the_server_start_started(tmp_path: Path) -> None:
    import subprocess
    import sys

    store = tmp_path / "store"
    store.mkdir()
    process = TorchServeProcess(tmp_path, "--model-store", str(store),
                                properties="disable_token_authorization=true\n").wait_ready()
    second = subprocess.run([sys.executable, "-m", "modelhost", "torchserve", "--start", "--ts-config",
                             str(process.config_file)], capture_output=True, text=True, timeout=60,
                            env={**__import__("os").environ, "TMPDIR": str(process.temporary)})
    assert second.returncode == 1 and "already running" in second.stderr
    stopped = subprocess.run([sys.executable, "-m", "modelhost", "torchserve", "--stop"], capture_output=True,
                             text=True, timeout=90, env={**__import__("os").environ, "TMPDIR": str(process.temporary)})
    assert stopped.stdout.strip() == "TorchServe has stopped."
    assert process.process.wait(timeout=10) == 0
    process.stop()


def test_register_and_unregister_need_the_model_api_and_the_rest_answers(server: TorchServeProcess) -> None:
    for method, path in (("POST", "/models?url=kinds.mar"), ("DELETE", "/models/kinds")):
        response = requests.request(method, f"{server.management}{path}", timeout=30)
        assert response.status_code == 405 and response.json()["type"] == "MethodNotAllowedException"
    listed = requests.get(f"{server.management}/models", timeout=30).json()
    assert [m["modelName"] for m in listed["models"]] == ["echo", "kinds"]
    (described,) = requests.get(f"{server.management}/models/kinds", timeout=30).json()
    assert described["loadedAtStartup"] is True and described["minWorkers"] == 1
    # customized: the handler's own answer to a request with header describe: True (BaseHandler's describe_handle)
    (customized,) = requests.get(f"{server.management}/models/kinds?customized=true", timeout=30).json()
    assert customized["customizedMetadata"]["explain"] == "False"
    assert customized["customizedMetadata"]["parameters"] == {"body": ["bytearray", ""]}


def test_metrics_in_torchserves_names_beside_modelhosts_own(server: TorchServeProcess) -> None:
    for _ in range(3):
        kinds_at(server, "/predictions/kinds")
    kinds_at(server, "/predictions/kinds/1.0")
    requests.post(f"{server.inference}/predictions/nope", data=b"x", timeout=30)
    response = requests.get(f"{server.metrics}/metrics", timeout=30)
    assert response.headers["content-type"] == "text/plain; version=0.0.4; charset=utf-8"
    values = _samples(response.text)
    hostname = dict(next(labels for name, labels in values if name == "Requests2XX"))["Hostname"]
    labels = (("hostname", hostname), ("model_name", "kinds"), ("model_version", "default"))
    assert values[("ts_inference_requests_total", labels)] >= 3
    versioned = (("hostname", hostname), ("model_name", "kinds"), ("model_version", "1.0"))
    assert values[("ts_inference_requests_total", versioned)] >= 1
    assert values[("ts_inference_latency_microseconds", labels)] > 0
    assert values[("ts_queue_latency_microseconds", versioned)] >= 0
    assert values[("Requests4XX", (("Hostname", hostname), ("Level", "Host")))] >= 1
    assert ("MemoryUsed", (("Hostname", hostname), ("Level", "Host"))) in values
    only = requests.get(f"{server.metrics}/metrics?name[]=ts_inference_requests_total", timeout=30).text
    assert {name for name, _ in _samples(only)} == {"ts_inference_requests_total"}
    own = requests.get(f"{server.modelhost_metrics}/metrics", timeout=30).text  # type: ignore[attr-defined]
    assert 'nv_inference_request_success{model="kinds",version="1"}' in own


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    from prometheus_client.parser import text_string_to_metric_families

    return {(sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in text_string_to_metric_families(text) for sample in family.samples}
