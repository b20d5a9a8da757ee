"""Names and paths from clients stay inside the model repository (explicit mode), and --user-code.

A real server in explicit mode serves <tmp>/parent/repo; the repository's parent and a sibling directory
`evil` are Python models whose model.py writes a marker file when imported. No name, path or load
parameter a client sends may load them: every attempt is a 400 / INVALID_ARGUMENT, and the marker never
appears.
"""

from __future__ import annotations

import base64
import http.client
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from tests.server import ServerProcess
from tests.test_model_control import CONFIG_JSON, factor, repository

PYTHON_CONFIG = """
backend: "python"
max_batch_size: 0
input [ { name: "x" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "y" data_type: TYPE_FP32 dims: [ 1 ] } ]
"""
PYTHON_CONFIG_JSON = json.dumps({
    "backend": "python", "max_batch_size": 0,
    "input": [{"name": "x", "data_type": "TYPE_FP32", "dims": [1]}],
    "output": [{"name": "y", "data_type": "TYPE_FP32", "dims": [1]}],
})


def model_py(marker: Path) -> str:
    """A Python model that writes `marker` when its model.py is imported."""
    return (f"open({str(marker)!r}, 'w').write('ran')\n\n"
            "class Model:\n    def execute(self, inputs):\n        return {'y': inputs['x']}\n")


def python_model(directory: Path, marker: Path) -> Path:
    (directory / "1").mkdir(parents=True, exist_ok=True)
    (directory / "config.pbtxt").write_text(PYTHON_CONFIG)
    (directory / "1" / "model.py").write_text(model_py(marker))
    return directory


class Layout:
    def __init__(self, root: Path) -> None:
        self.marker = root / "marker"
        self.parent = python_model(root / "parent", self.marker)  # the repository's parent is a model directory
        self.evil = python_model(root / "evil", self.marker)
        self.outside = repository(root / "elsewhere", {"shared": 5.0}) / "shared"
        self.repo = repository(root / "parent" / "repo", {"a": 2.0})
        (self.repo / "linked").symlink_to(self.outside, target_is_directory=True)


@pytest.fixture(scope="module")
def layout(tmp_path_factory: pytest.TempPathFactory) -> Layout:
    return Layout(tmp_path_factory.mktemp("paths"))


@pytest.fixture(scope="module")
def server(layout: Layout) -> Iterator[ServerProcess]:
    server = ServerProcess(layout.repo, "--model-control-mode", "explicit", "--load-model", "a").wait_ready()
    yield server
    server.stop()


def post(server: ServerProcess, path: str, body: dict[str, Any] | None = None) -> requests.Response:
    return requests.post(server.base + path, json=body, timeout=30)


def assert_refused_name(response: requests.Response) -> None:
    assert response.status_code == 400, response.text
    assert "model name" in response.json()["error"] and "directory name" in response.json()["error"]


@pytest.mark.parametrize("name", ["%2e%2e", "%2E%2E", "..%2F..%2Fevil", "%2F", "a%2F..", "%2Ftmp%2Fevil", "%00",
                                  "a%00b", "%01", "%2e", "a%5Cb"])
def test_http_load_and_unload_refuse_names_that_are_not_names(server: ServerProcess, layout: Layout,
                                                               name: str) -> None:
    assert_refused_name(post(server, f"/v2/repository/models/{name}/load"))
    assert_refused_name(post(server, f"/v2/repository/models/{name}/unload"))
    assert not layout.marker.exists()


def test_http_literal_dot_dot_and_absolute_names(server: ServerProcess, layout: Layout) -> None:
    # requests removes dot segments from a URL; http.client sends the path as written.
    absolute = "%2F".join(["", *layout.evil.parts[1:]])
    for path in ("/v2/repository/models/../load", "/v2/repository/models/a/../../evil/load",
                 f"/v2/repository/models/{absolute}/load"):
        connection = http.client.HTTPConnection(server.url, timeout=30)
        connection.request("POST", path, body=b"{}")
        response = connection.getresponse()
        body = json.loads(response.read())
        connection.close()
        assert response.status == 400 and "model name" in body["error"], (path, body)
    assert not layout.marker.exists()


@pytest.mark.parametrize("path", ["/v2/models/%00", "/v2/models/a%00b/ready", "/v2/models/%2e%2e/config",
                                  "/v2/models/%01/stats"])
def test_http_lookups_of_names_that_are_not_names_are_400(server: ServerProcess, path: str) -> None:
    response = requests.get(server.base + path, timeout=10)
    if path.endswith("/ready"):
        assert response.status_code == 400  # Triton's answer for "not ready"
    else:
        assert_refused_name(response)
    assert_refused_name(post(server, "/v2/models/a%00b/infer", {"inputs": []}))
    assert_refused_name(post(server, "/v1/models/a%00b:predict", {"instances": [[1.0]]}))  # TF Serving REST


def test_http_versions_past_what_int_converts_are_400(server: ServerProcess) -> None:
    version = "9" * 5000  # int() refuses more than 4,300 digits
    for response in (requests.get(f"{server.base}/v2/models/a/versions/{version}", timeout=10),
                     post(server, f"/v2/models/a/versions/{version}/infer", {"inputs": []})):
        assert response.status_code == 400 and "is not a number" in response.json()["error"], response.text


@pytest.mark.parametrize("name", ["..", "../evil", "a/../../evil", "\\..\\evil", "a\x00b", "\x01", "."])
def test_grpc_load_refuses_names_that_are_not_names(server: ServerProcess, layout: Layout, name: str) -> None:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    for call in (client.load_model, client.unload_model, client.get_model_metadata):
        with pytest.raises(InferenceServerException) as refused:
            call(name)
        assert refused.value.status() == "StatusCode.INVALID_ARGUMENT", (call, refused.value)
        assert "model name" in refused.value.message()
    assert not layout.marker.exists()


def test_grpc_load_refuses_absolute_directories(server: ServerProcess, layout: Layout) -> None:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    for directory in (layout.evil, layout.parent):
        with pytest.raises(InferenceServerException) as refused:
            client.load_model(str(directory))
        assert refused.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert not layout.marker.exists()
    assert factor(client, "a") == 2.0


@pytest.mark.parametrize("filename", ["ABSOLUTE", "../../../evil/1/model.py", "../../../../evil/1/model.py",
                                      "./../model.py", "1/../../model.py"])
def test_config_override_default_model_filename_stays_in_the_version_directory(
    server: ServerProcess, layout: Layout, filename: str
) -> None:
    filename = str(layout.evil / "1" / "model.py") if filename == "ABSOLUTE" else filename
    config = json.dumps({**json.loads(PYTHON_CONFIG_JSON), "default_model_filename": filename})
    response = post(server, "/v2/repository/models/a/load", {"parameters": {"config": config}})
    assert response.status_code == 400 and "default_model_filename" in response.json()["error"], response.text
    client = grpcclient.InferenceServerClient(server.grpc_url)
    with pytest.raises(InferenceServerException) as refused:
        client.load_model("a", config=config)
    assert refused.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert not layout.marker.exists()
    assert factor(client, "a") == 2.0  # still the repository's model


def test_load_files_cannot_leave_the_override_directory(server: ServerProcess, layout: Layout) -> None:
    content = base64.b64encode(b"x").decode()
    for key in ("file:1/../../escape", "file:/tmp/escape", "file:1/a\x00b", "file:1//a", "file:1\\..\\x",
                "file:²/model.onnx", "file:٣/model.onnx"):  # digits to str.isdigit, not version directories
        response = post(server, "/v2/repository/models/a/load", {"parameters": {"config": CONFIG_JSON, key: content}})
        assert response.status_code == 400 and "file:<version>/<path>" in response.json()["error"], (key, response.text)


def test_uploaded_code_does_not_run_by_default(server: ServerProcess, layout: Layout) -> None:
    files = {"file:1/model.py": base64.b64encode(model_py(layout.marker).encode()).decode()}
    response = post(server, "/v2/repository/models/up/load", {"parameters": {"config": PYTHON_CONFIG_JSON, **files}})
    assert response.status_code == 400 and "--user-code" in response.json()["error"], response.text
    assert not layout.marker.exists()


def test_a_symlink_in_the_repository_is_the_operators_and_is_followed(server: ServerProcess) -> None:
    assert post(server, "/v2/repository/models/linked/load").status_code == 200
    assert factor(grpcclient.InferenceServerClient(server.grpc_url), "linked") == 5.0


def test_user_code_none_fails_only_the_models_that_run_code(start_server: Any, tmp_path: Path) -> None:
    marker = tmp_path / "marker"
    repo = repository(tmp_path / "repo", {"a": 2.0})
    python_model(repo / "py", marker)
    server = start_server(repo, "--user-code", "none")
    index = {e["name"]: e for e in post(server, "/v2/repository/index").json()}
    assert index["a"]["state"] == "READY"
    assert index["py"]["state"] == "UNAVAILABLE" and "--user-code none" in index["py"]["reason"]
    assert not marker.exists()


def test_user_code_all_runs_uploaded_code(start_server: Any, tmp_path: Path) -> None:
    marker = tmp_path / "marker"
    server = start_server(repository(tmp_path / "repo", {"a": 2.0}), "--model-control-mode", "explicit",
                          "--user-code", "all")
    files = {"file:1/model.py": base64.b64encode(model_py(marker).encode()).decode()}
    response = post(server, "/v2/repository/models/up/load", {"parameters": {"config": PYTHON_CONFIG_JSON, **files}})
    assert response.status_code == 200, response.text
    assert marker.exists()
