"""A repository with broken models: the good ones serve, the broken ones are UNAVAILABLE with a reason.

Real servers (tests/server.py) on a tmp repository; HTTP through `requests` so status codes are exact.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
import requests
import tritonclient.http as httpclient
from onnx import TensorProto, helper, numpy_helper

from tests.onnx_models import ADD_SUB_CONFIG, IR_VERSION, OPSET, add_sub_model, write_model
from tests.server import ServerProcess

GOOD_CONFIG = ADD_SUB_CONFIG

ADD_CONFIG = """
platform: "onnxruntime_onnx"
max_batch_size: 4
{policy}
input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] }} ]
"""

BROKEN = {
    # name -> a fragment the reason (index, 503 body, log) must contain
    "bad_syntax": "config.pbtxt: 3:",
    "bad_dtype": "config.pbtxt input 'INPUT0' has data_type TYPE_INT32 but 1/model.onnx declares FP32",
    "missing_file": "model.onnx does not exist",
    "corrupt": "model.onnx",
    "unknown_platform": "unknown platform 'tensorrt_plan'",
}
GOOD = ("good", "auto", "versions_all", "versions_latest")


def add_constant_model(constant: float) -> onnx.ModelProto:
    """INPUT0 FP32 [batch, 4] -> OUTPUT0 = INPUT0 + constant; one per version to tell versions apart."""
    graph = helper.make_graph(
        [helper.make_node("Add", ["INPUT0", "c"], ["OUTPUT0"])], "add_constant",
        [helper.make_tensor_value_info("INPUT0", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("OUTPUT0", TensorProto.FLOAT, ["batch", 4])],
        [numpy_helper.from_array(np.array(constant, np.float32), "c")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = IR_VERSION
    onnx.checker.check_model(model, full_check=True)
    return model


def build_repository(root: Path) -> Path:
    write_model(root, "good", add_sub_model(), GOOD_CONFIG)
    write_model(root, "auto", add_sub_model(), None)  # no config.pbtxt: completed from the model

    write_model(root, "bad_syntax", add_sub_model(),
                '# syntax error on line 3\nplatform: "onnxruntime_onnx"\nmax_batch_size: eight\n'
                'input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 16 ] } ]\n')
    bad_dtype = GOOD_CONFIG.replace("TYPE_FP32 dims: [ 16 ] },", "TYPE_INT32 dims: [ 16 ] },", 1)  # INPUT0 only
    write_model(root, "bad_dtype", add_sub_model(), bad_dtype)

    missing = write_model(root, "missing_file", add_sub_model(), GOOD_CONFIG)
    (missing / "1" / "model.onnx").unlink()

    corrupt = write_model(root, "corrupt", add_sub_model(), GOOD_CONFIG)
    (corrupt / "1" / "model.onnx").write_bytes(np.random.default_rng(7).bytes(4096))

    unknown = root / "unknown_platform"
    (unknown / "1").mkdir(parents=True)
    (unknown / "1" / "model.plan").write_bytes(b"not a tensorrt engine")
    (unknown / "config.pbtxt").write_text(GOOD_CONFIG.replace("onnxruntime_onnx", "tensorrt_plan"))

    for name, policy in (("versions_all", "version_policy: { all { } }"), ("versions_latest", "")):
        for version in (1, 2):
            config = ADD_CONFIG.format(policy=policy)
            write_model(root, name, add_constant_model(float(version)), config, version=version)
        # Triton ignores version directories that are not numbers or that start with "0".
        write_model(root, name, add_constant_model(100.0), None, version=3, filename="model.onnx")
        (root / name / "3").rename(root / name / "03")
        (root / name / "latest").mkdir()
    return root


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_repository(tmp_path_factory.mktemp("repo"))


@pytest.fixture(scope="module")
def server(repository: Path) -> Iterator[ServerProcess]:
    """One server on the mixed repository for the read-only checks (same as start_server, module-scoped)."""
    process = ServerProcess(repository)
    try:
        yield process.wait_ready()
    finally:
        process.stop()


def post(server: ServerProcess, path: str, document: Any = None) -> requests.Response:
    return requests.post(server.base + path, json=document, timeout=30)


def get(server: ServerProcess, path: str) -> requests.Response:
    return requests.get(server.base + path, timeout=30)


def add_sub_request(batch: int = 2) -> tuple[dict[str, Any], np.ndarray, np.ndarray]:
    a = np.arange(batch * 16, dtype=np.float32).reshape(batch, 16)
    b = np.full((batch, 16), 0.5, np.float32)
    body = {"inputs": [
        {"name": "INPUT0", "datatype": "FP32", "shape": [batch, 16], "data": a.reshape(-1).tolist()},
        {"name": "INPUT1", "datatype": "FP32", "shape": [batch, 16], "data": b.reshape(-1).tolist()},
    ]}
    return body, a, b


def outputs_of(response: requests.Response) -> dict[str, np.ndarray]:
    assert response.status_code == 200, response.text
    return {o["name"]: np.array(o["data"], np.float32).reshape(o["shape"]) for o in response.json()["outputs"]}


def index_by_name(server: ServerProcess) -> dict[str, list[dict[str, str]]]:
    response = post(server, "/v2/repository/index")
    assert response.status_code == 200, response.text
    entries: dict[str, list[dict[str, str]]] = {}
    for entry in response.json():
        entries.setdefault(entry["name"], []).append(entry)
    return entries


# --------------------------------------------------------------------------- the good models serve


def test_good_models_serve(server: ServerProcess) -> None:
    body, a, b = add_sub_request()
    for name in ("good", "auto"):
        out = outputs_of(post(server, f"/v2/models/{name}/infer", body))
        np.testing.assert_array_equal(out["OUTPUT0"], a + b)
        np.testing.assert_array_equal(out["OUTPUT1"], a - b)
        assert get(server, f"/v2/models/{name}/ready").status_code == 200


def test_good_model_with_tritonclient(server: ServerProcess) -> None:
    client = httpclient.InferenceServerClient(server.url)
    try:
        a = np.random.default_rng(0).random((3, 16), dtype=np.float32)
        b = np.ones((3, 16), np.float32)
        inputs = [httpclient.InferInput("INPUT0", [3, 16], "FP32"), httpclient.InferInput("INPUT1", [3, 16], "FP32")]
        inputs[0].set_data_from_numpy(a)
        inputs[1].set_data_from_numpy(b)
        result = client.infer("good", inputs)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
        assert client.is_server_live() and client.is_server_ready()
        assert client.is_model_ready("good") and not client.is_model_ready("bad_dtype")
    finally:
        client.close()


def test_auto_completed_config(server: ServerProcess) -> None:
    config = get(server, "/v2/models/auto/config").json()
    assert config["name"] == "auto"
    assert config["platform"] == "onnxruntime_onnx"
    assert config["max_batch_size"] == 4
    assert [(t["name"], t["data_type"], [int(d) for d in t["dims"]]) for t in config["input"]] == [
        ("INPUT0", "TYPE_FP32", [16]), ("INPUT1", "TYPE_FP32", [16])
    ]
    assert [t["name"] for t in config["output"]] == ["OUTPUT0", "OUTPUT1"]


def test_auto_completed_metadata(server: ServerProcess) -> None:
    metadata = get(server, "/v2/models/auto").json()
    assert metadata["name"] == "auto"
    assert metadata["versions"] == ["1"]
    assert metadata["platform"] == "onnxruntime_onnx"
    assert metadata["inputs"] == [
        {"name": "INPUT0", "datatype": "FP32", "shape": [-1, 16]},
        {"name": "INPUT1", "datatype": "FP32", "shape": [-1, 16]},
    ]
    assert [o["name"] for o in metadata["outputs"]] == ["OUTPUT0", "OUTPUT1"]


def test_auto_completed_max_batch_size_is_enforced(server: ServerProcess) -> None:
    body, _, _ = add_sub_request(batch=4)
    assert post(server, "/v2/models/auto/infer", body).status_code == 200
    body, _, _ = add_sub_request(batch=5)
    response = post(server, "/v2/models/auto/infer", body)
    assert response.status_code == 400
    assert "above max_batch_size 4" in response.json()["error"]


# --------------------------------------------------------------------------- broken models are reported


def test_index_reports_every_model(server: ServerProcess) -> None:
    index = index_by_name(server)
    assert set(index) == set(GOOD) | set(BROKEN)
    assert index["good"] == [{"name": "good", "version": "1", "state": "READY"}]
    assert index["auto"] == [{"name": "auto", "version": "1", "state": "READY"}]


@pytest.mark.parametrize("name", sorted(BROKEN))
def test_index_reports_broken_model_unavailable_with_reason(server: ServerProcess, name: str) -> None:
    entries = index_by_name(server)[name]
    assert len(entries) == 1, entries
    entry = entries[0]
    assert entry["state"] == "UNAVAILABLE"
    assert BROKEN[name] in entry["reason"], entry["reason"]


def test_index_ready_only(server: ServerProcess) -> None:
    response = post(server, "/v2/repository/index", {"ready": True})
    names = {e["name"] for e in response.json()}
    assert names == set(GOOD)
    assert all(e["state"] == "READY" for e in response.json())


def test_corrupt_model_reason_says_it_cannot_be_parsed(server: ServerProcess) -> None:
    reason = index_by_name(server)["corrupt"][0]["reason"]
    assert "protobuf" in reason.lower() or "parse" in reason.lower(), reason


@pytest.mark.parametrize("name", sorted(BROKEN))
def test_infer_on_broken_model_is_503_with_reason(server: ServerProcess, name: str) -> None:
    body, _, _ = add_sub_request()
    response = post(server, f"/v2/models/{name}/infer", body)
    assert response.status_code == 503, response.text
    error = response.json()["error"]
    assert name in error and "not ready" in error
    assert BROKEN[name] in error, error


@pytest.mark.parametrize("name", sorted(BROKEN))
def test_broken_model_not_ready_and_no_metadata(server: ServerProcess, name: str) -> None:
    assert get(server, f"/v2/models/{name}/ready").status_code == 400
    assert get(server, f"/v2/models/{name}").status_code == 503
    assert get(server, f"/v2/models/{name}/config").status_code == 503


def test_unknown_model_is_404(server: ServerProcess) -> None:
    body, _, _ = add_sub_request()
    response = post(server, "/v2/models/nope/infer", body)
    assert response.status_code == 404
    assert response.json()["error"].startswith("Request for unknown model: 'nope' is not found")


def test_server_is_live_and_ready_by_default(server: ServerProcess) -> None:
    assert get(server, "/v2/health/live").status_code == 200
    assert get(server, "/v2/health/ready").status_code == 200


# --------------------------------------------------------------------------- versions


def add_constant_infer(server: ServerProcess, path: str) -> requests.Response:
    x = np.array([[0.0, 1.0, 2.0, 3.0]], np.float32)
    body = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 4], "data": x.reshape(-1).tolist()}]}
    return post(server, path + "/infer", body)


def added(server: ServerProcess, path: str) -> float:
    """Which constant the served version adds."""
    response = add_constant_infer(server, path)
    assert response.status_code == 200, (path, response.text)
    data = np.array(response.json()["outputs"][0]["data"], np.float32)
    assert response.json()["model_version"] in ("1", "2")
    return float(data[0])


def test_version_policy_all(server: ServerProcess) -> None:
    assert added(server, "/v2/models/versions_all/versions/1") == 1.0
    assert added(server, "/v2/models/versions_all/versions/2") == 2.0
    assert added(server, "/v2/models/versions_all") == 2.0  # no version: the highest
    response = add_constant_infer(server, "/v2/models/versions_all")
    assert response.json()["model_version"] == "2"
    assert get(server, "/v2/models/versions_all").json()["versions"] == ["1", "2"]
    assert [e["version"] for e in index_by_name(server)["versions_all"]] == ["1", "2"]


def test_version_policy_latest(server: ServerProcess) -> None:
    assert added(server, "/v2/models/versions_latest") == 2.0
    assert added(server, "/v2/models/versions_latest/versions/2") == 2.0
    # version 1 exists on disk but the default policy (latest, 1 version) does not serve it
    assert add_constant_infer(server, "/v2/models/versions_latest/versions/1").status_code == 404
    assert get(server, "/v2/models/versions_latest").json()["versions"] == ["2"]
    assert [e["version"] for e in index_by_name(server)["versions_latest"]] == ["2"]


@pytest.mark.parametrize("path", ["/v2/models/versions_all/versions/3", "/v2/models/versions_all/versions/03",
                                  "/v2/models/versions_all/versions/7", "/v2/models/good/versions/2"])
def test_unknown_version_is_404(server: ServerProcess, path: str) -> None:
    response = add_constant_infer(server, path)
    assert response.status_code == 404, response.text
    assert "not found" in response.json()["error"]
    assert get(server, path).status_code == 404
    assert get(server, path + "/ready").status_code == 400


def test_version_specific_ready_and_metadata(server: ServerProcess) -> None:
    assert get(server, "/v2/models/versions_all/versions/1/ready").status_code == 200
    assert get(server, "/v2/models/versions_all/versions/2/ready").status_code == 200
    assert get(server, "/v2/models/versions_all/versions/1").json()["name"] == "versions_all"


def test_non_numeric_version_is_not_routed(server: ServerProcess) -> None:
    response = add_constant_infer(server, "/v2/models/versions_all/versions/latest")
    assert response.status_code == 404


# --------------------------------------------------------------------------- log and readiness (own servers)


def test_log_names_each_failure(start_server, repository: Path) -> None:  # type: ignore[no-untyped-def]
    own = start_server(repository)
    assert requests.get(own.base + "/v2/models/good/ready", timeout=5).status_code == 200
    log = own.stop()
    for name, fragment in BROKEN.items():
        lines = [line for line in log.splitlines() if f"model {name} " in line and "fail" in line]
        assert lines, f"no failure line for {name} in:\n{log}"
        assert any(fragment in line for line in lines), (name, lines)
    assert "loaded model good version 1" in log


def wait_loaded(server: ServerProcess, names: set[str], timeout: float = 30.0) -> None:
    """Until the index has every model and none is LOADING (readiness cannot tell us under strict mode)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        entries = post(server, "/v2/repository/index").json()
        if {e["name"] for e in entries} >= names and all(e.get("state") != "LOADING" for e in entries):
            return
        time.sleep(0.05)
    raise TimeoutError(f"models still loading: {entries}")


def test_strict_readiness_fails_with_broken_models(start_server, repository: Path) -> None:  # type: ignore[no-untyped-def]
    strict = start_server(repository, "--strict-readiness", ready_path="/v2/health/live")
    wait_loaded(strict, set(GOOD) | set(BROKEN))
    time.sleep(0.3)  # past the end of loading
    assert requests.get(strict.base + "/v2/health/ready", timeout=5).status_code == 400
    # the good models still serve
    body, a, b = add_sub_request()
    out = outputs_of(requests.post(strict.base + "/v2/models/good/infer", json=body, timeout=30))
    np.testing.assert_array_equal(out["OUTPUT0"], a + b)


def test_strict_readiness_passes_when_all_models_load(start_server, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    write_model(tmp_path, "good", add_sub_model(), GOOD_CONFIG)
    write_model(tmp_path, "auto", add_sub_model(), None)
    strict = start_server(tmp_path, "--strict-readiness")  # waits for /v2/health/ready == 200
    assert requests.get(strict.base + "/v2/health/ready", timeout=5).status_code == 200


@pytest.mark.parametrize("name", sorted(BROKEN))
def test_infer_on_broken_model_version_is_503_with_reason(server: ServerProcess, name: str) -> None:
    # Every broken model has a version directory 1; naming it must not turn "broken" into "unknown".
    body, _, _ = add_sub_request()
    response = post(server, f"/v2/models/{name}/versions/1/infer", body)
    assert response.status_code == 503, response.text
    assert BROKEN[name] in response.json()["error"]
