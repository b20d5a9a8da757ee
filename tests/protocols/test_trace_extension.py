"""Triton's trace extension, spoken by tritonclient (HTTP and gRPC) to one server tracing to a file.

The server starts with `--trace-config`: every request traced (rate 1, TIMESTAMPS), each trace written as it
comes (log-frequency 1: `trace.json.<n>`). The trace files are read back and every stage checked, in order.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import requests
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.onnx_models import ADD_SUB_CONFIG, add_sub_model, write_model
from tests.server import ServerProcess

# A model whose requests queue for an instance thread (a queue delay keeps them off the event loop).
QUEUED_CONFIG = ADD_SUB_CONFIG + "dynamic_batching { max_queue_delay_microseconds: 500 }\n"
# simple (a+b, a-b), then queued on those: 2a, 2b.
PAIR_CONFIG = """
platform: "ensemble"
max_batch_size: 8
input [ { name: "A" data_type: TYPE_FP32 dims: [ 16 ] }, { name: "B" data_type: TYPE_FP32 dims: [ 16 ] } ]
output [ { name: "A2" data_type: TYPE_FP32 dims: [ 16 ] }, { name: "B2" data_type: TYPE_FP32 dims: [ 16 ] } ]
ensemble_scheduling { step [
  { model_name: "simple" model_version: -1 input_map { key: "INPUT0" value: "A" } input_map { key: "INPUT1" value: "B" }
    output_map { key: "OUTPUT0" value: "sum" } output_map { key: "OUTPUT1" value: "difference" } },
  { model_name: "queued" model_version: -1
    input_map { key: "INPUT0" value: "sum" } input_map { key: "INPUT1" value: "difference" }
    output_map { key: "OUTPUT0" value: "A2" } output_map { key: "OUTPUT1" value: "B2" } }
] }
"""
INITIAL = {"trace_file": "trace.json", "trace_level": ["TIMESTAMPS"], "trace_rate": "1", "trace_count": "-1",
           "log_frequency": "1", "trace_mode": "triton"}
SERVER_STAGES = ["REQUEST_START", "QUEUE_START", "COMPUTE_START", "COMPUTE_INPUT_END", "COMPUTE_OUTPUT_START",
                 "COMPUTE_END", "INFER_RESPONSE_COMPLETE", "REQUEST_END"]
HTTP_STAGES = ["HTTP_RECV_START", "HTTP_RECV_END", *SERVER_STAGES, "HTTP_SEND_START", "HTTP_SEND_END"]
GRPC_STAGES = ["GRPC_WAITREAD_START", "GRPC_WAITREAD_END", *SERVER_STAGES, "GRPC_SEND_START", "GRPC_SEND_END"]
CLEAR = {"trace_level": None, "trace_rate": None, "trace_count": None, "log_frequency": None}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repo = tmp_path_factory.mktemp("repo")
    write_model(repo, "simple", add_sub_model(), ADD_SUB_CONFIG)
    write_model(repo, "queued", add_sub_model(), QUEUED_CONFIG)
    (repo / "pair" / "1").mkdir(parents=True)
    (repo / "pair" / "config.pbtxt").write_text(PAIR_CONFIG)
    traces = tmp_path_factory.mktemp("traces")
    server = ServerProcess(repo, "--trace-config", f"triton,file={traces / 'trace.json'}",
                           "--trace-config", "triton,log-frequency=1", "--trace-config", "level=TIMESTAMPS",
                           "--trace-config", "rate=1").wait_ready()
    server.traces = traces  # type: ignore[attr-defined]
    yield server
    server.stop()


@pytest.fixture(scope="module")
def http(server: ServerProcess) -> httpclient.InferenceServerClient:
    return httpclient.InferenceServerClient(server.url)


@pytest.fixture(scope="module")
def grpc(server: ServerProcess) -> grpcclient.InferenceServerClient:
    return grpcclient.InferenceServerClient(server.grpc_url)


@pytest.fixture(autouse=True)
def cleared(http: httpclient.InferenceServerClient) -> Iterator[None]:
    """Each test starts and ends with the startup settings."""
    yield
    http.update_trace_settings("simple", CLEAR)
    http.update_trace_settings(settings=CLEAR)


def inputs(module: Any) -> list[Any]:
    data = np.arange(16, dtype=np.float32).reshape(1, 16)
    made = [module.InferInput(name, [1, 16], "FP32") for name in ("INPUT0", "INPUT1")]
    for tensor in made:
        tensor.set_data_from_numpy(data)
    return made


def trace_files(server: ServerProcess) -> set[Path]:
    return set(server.traces.glob("trace.json.*"))  # type: ignore[attr-defined]


def new_traces(server: ServerProcess, before: set[Path], expected: int) -> list[dict[str, Any]]:
    """The traces written since `before`, waiting (briefly) for the writer thread."""
    deadline = time.monotonic() + 10
    while len(trace_files(server) - before) < expected and time.monotonic() < deadline:
        time.sleep(0.02)
    time.sleep(0.1)  # a write past the expected one would show here
    records = [record for path in sorted(trace_files(server) - before) for record in json.loads(path.read_text())]
    return records


def test_server_metadata_lists_trace(http: httpclient.InferenceServerClient) -> None:
    assert "trace" in http.get_server_metadata()["extensions"]


def test_settings_round_trip_over_http(http: httpclient.InferenceServerClient) -> None:
    assert http.get_trace_settings() == INITIAL
    assert http.get_trace_settings("simple") == INITIAL
    model = http.update_trace_settings("simple", {"trace_rate": "5", "log_frequency": "7"})
    assert model == {**INITIAL, "trace_rate": "5", "log_frequency": "7"}
    both = ["TIMESTAMPS", "TENSORS"]
    assert http.update_trace_settings(settings={"trace_level": both, "trace_rate": "3"}) == {
        **INITIAL, "trace_level": both, "trace_rate": "3"}
    # The model keeps its own rate and follows the global level.
    assert http.get_trace_settings("simple") == {**INITIAL, "trace_level": both, "trace_rate": "5",
                                                 "log_frequency": "7"}
    # Cleared, a model's setting follows the global one again; a global one returns to the startup value.
    assert http.update_trace_settings("simple", {"trace_rate": None}) == {
        **INITIAL, "trace_level": both, "trace_rate": "3", "log_frequency": "7"}
    assert http.update_trace_settings(settings={"trace_rate": None, "trace_level": None}) == INITIAL
    assert http.get_trace_settings("queued") == INITIAL


def test_settings_round_trip_over_grpc(grpc: grpcclient.InferenceServerClient) -> None:
    def settings(answer: dict[str, Any]) -> dict[str, list[str]]:
        return {name: value["value"] for name, value in answer["settings"].items()}

    listed = {name: value if isinstance(value, list) else [value] for name, value in INITIAL.items()}
    assert settings(grpc.get_trace_settings(as_json=True)) == listed
    answer = grpc.update_trace_settings("simple", {"trace_count": "4", "trace_level": "OFF"}, as_json=True)
    assert settings(answer) == {**listed, "trace_count": ["4"], "trace_level": ["OFF"]}
    assert settings(grpc.get_trace_settings(as_json=True)) == listed
    answer = grpc.update_trace_settings("simple", {"trace_count": None, "trace_level": None}, as_json=True)
    assert settings(answer) == listed


@pytest.mark.parametrize(("settings", "status", "named"), [
    ({"trace_level": ["LOUD"]}, 400, "trace_level"),
    ({"trace_level": ["OFF", "TIMESTAMPS"]}, 400, "trace_level"),
    ({"trace_rate": "abc"}, 400, "trace_rate"),
    ({"trace_count": "-2"}, 400, "trace_count"),
    ({"log_frequency": ["1", "2"]}, 400, "log_frequency"),
    ({"trace_rate": 5}, 400, "trace_rate"),
    ({"trace_colour": "blue"}, 400, "trace_colour"),
    ({"trace_file": "/etc/passwd"}, 501, "trace_file"),
    ({"trace_mode": "opentelemetry"}, 501, "trace_mode"),
])
def test_bad_settings_are_refused_naming_the_setting(server: ServerProcess, http: httpclient.InferenceServerClient,
                                                     settings: dict[str, Any], status: int, named: str) -> None:
    for path in ("/v2/trace/setting", "/v2/models/simple/trace/setting"):
        answer = requests.post(server.base + path, json=settings, timeout=10)
        assert answer.status_code == status, answer.text
        assert named in answer.json()["error"]
    assert http.get_trace_settings() == INITIAL  # nothing changed
    assert http.get_trace_settings("simple") == INITIAL


def test_unknown_model_and_bad_grpc_value(server: ServerProcess, grpc: grpcclient.InferenceServerClient) -> None:
    answer = requests.get(server.base + "/v2/models/nope/trace/setting", timeout=10)
    assert answer.status_code == 404 and "nope" in answer.json()["error"]
    with pytest.raises(InferenceServerException) as raised:
        grpc.update_trace_settings(settings={"trace_rate": "-1"})
    assert raised.value.status() == "StatusCode.INVALID_ARGUMENT" and "trace_rate" in raised.value.message()
    with pytest.raises(InferenceServerException) as raised:
        grpc.get_trace_settings("nope")
    assert raised.value.status() == "StatusCode.NOT_FOUND"


def timestamps(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [record for record in records if "timestamps" in record]


def check_stages(trace: dict[str, Any], expected: list[str]) -> None:
    names = [stamp["name"] for stamp in trace["timestamps"]]
    stamps = {stamp["name"]: stamp["ns"] for stamp in trace["timestamps"]}
    assert sorted(names) == sorted(expected), names
    ordered = [stamps[name] for name in expected]
    # Each stage at or after the one before it (INFER_RESPONSE_COMPLETE and REQUEST_END are stamped together).
    assert ordered == sorted(ordered), list(zip(expected, ordered, strict=True))
    assert trace["timestamps"] == sorted(trace["timestamps"], key=lambda stamp: stamp["ns"])


@pytest.mark.parametrize("model", ["simple", "queued"])
def test_traced_requests_have_every_stage_in_order(server: ServerProcess, http: httpclient.InferenceServerClient,
                                                   grpc: grpcclient.InferenceServerClient, model: str) -> None:
    before = trace_files(server)
    http.infer(model, inputs(httpclient), request_id="7")
    grpc.infer(model, inputs(grpcclient))
    traces = timestamps(new_traces(server, before, 2))
    assert len(traces) == 2
    first, second = sorted(traces, key=lambda trace: trace["id"])
    assert (first["model_name"], first["model_version"], first["request_id"]) == (model, 1, "7")
    check_stages(first, HTTP_STAGES)
    check_stages(second, GRPC_STAGES)
    assert second["id"] > first["id"]


def test_rate_and_count_are_honoured(server: ServerProcess, http: httpclient.InferenceServerClient) -> None:
    http.update_trace_settings(settings={"trace_rate": "2", "trace_count": "3"})
    before = trace_files(server)
    for _ in range(10):
        http.infer("simple", inputs(httpclient))
    assert len(timestamps(new_traces(server, before, 3))) == 3  # requests 2, 4 and 6; then no traces left
    assert http.get_trace_settings()["trace_count"] == "0"
    # A model's own count is its own: 'simple' traces again while the global count stays spent.
    http.update_trace_settings("simple", {"trace_count": "1", "trace_rate": "1"})
    before = trace_files(server)
    http.infer("simple", inputs(httpclient))
    http.infer("simple", inputs(httpclient))
    http.infer("queued", inputs(httpclient))
    assert [trace["model_name"] for trace in timestamps(new_traces(server, before, 1))] == ["simple"]
    assert http.get_trace_settings("simple")["trace_count"] == "0"


def test_level_off_traces_nothing(server: ServerProcess, http: httpclient.InferenceServerClient) -> None:
    http.update_trace_settings(settings={"trace_level": "OFF"})
    before = trace_files(server)
    http.infer("queued", inputs(httpclient))
    assert new_traces(server, before, 0) == []


def test_level_tensors_writes_inputs_and_outputs(server: ServerProcess, http: httpclient.InferenceServerClient) -> None:
    http.update_trace_settings("simple", {"trace_level": ["TIMESTAMPS", "TENSORS"]})
    before = trace_files(server)
    http.infer("simple", inputs(httpclient))
    records = new_traces(server, before, 1)
    tensors = {(r["activity"], r["tensor"]["name"]): r["tensor"] for r in records if "activity" in r}
    assert sorted(tensors) == [("TENSOR_BACKEND_OUTPUT", "OUTPUT0"), ("TENSOR_BACKEND_OUTPUT", "OUTPUT1"),
                               ("TENSOR_QUEUE_INPUT", "INPUT0"), ("TENSOR_QUEUE_INPUT", "INPUT1")]
    doubled = ",".join(str(float(2 * i)) for i in range(16))
    assert tensors[("TENSOR_BACKEND_OUTPUT", "OUTPUT0")] == {"name": "OUTPUT0", "data": doubled, "shape": "1,16",
                                                             "dtype": "FP32"}
    assert {r["id"] for r in records} == {timestamps(records)[0]["id"]}


def test_an_ensembles_steps_are_traced_under_it(server: ServerProcess, http: httpclient.InferenceServerClient) -> None:
    data = np.arange(16, dtype=np.float32).reshape(1, 16)
    pair = [httpclient.InferInput(name, [1, 16], "FP32").set_data_from_numpy(data) for name in ("A", "B")]
    before = trace_files(server)
    result = http.infer("pair", pair)
    np.testing.assert_array_equal(result.as_numpy("A2"), 2 * data)
    traces = {trace["model_name"]: trace for trace in timestamps(new_traces(server, before, 1))}
    assert sorted(traces) == ["pair", "queued", "simple"]
    ensemble = traces.pop("pair")
    check_stages(ensemble, ["HTTP_RECV_START", "HTTP_RECV_END", "REQUEST_START", "INFER_RESPONSE_COMPLETE",
                            "REQUEST_END", "HTTP_SEND_START", "HTTP_SEND_END"])
    start, end = (next(s["ns"] for s in ensemble["timestamps"] if s["name"] == n) for n in ("REQUEST_START",
                                                                                         "REQUEST_END"))
    for step in traces.values():
        assert step["parent_id"] == ensemble["id"] and step["model_version"] == 1
        check_stages(step, SERVER_STAGES[:-2] + ["REQUEST_END"])
        assert start <= step["timestamps"][0]["ns"] and step["timestamps"][-1]["ns"] <= end
    assert traces["simple"]["timestamps"][-1]["ns"] <= traces["queued"]["timestamps"][0]["ns"]
