"""Triton's logging extension over HTTP and gRPC (tritonclient's get/update_log_settings), and its effect on
the server's log. One server with --logging-updates, in explicit mode so that a load makes log lines on demand
(`loading model` is a DEBUG line, `loaded`/`reloaded model` an INFO one)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import grpc
import pytest
import requests
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from onnx import TensorProto
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from tests.helpers import assert_error
from tests.onnx_models import identity_model, write_model
from tests.server import ServerProcess, wait_for

DEFAULTS = {"log_file": "", "log_info": True, "log_warning": True, "log_error": True, "log_verbose_level": 0,
            "log_format": "default"}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repo = tmp_path_factory.mktemp("logging")
    write_model(repo, "ident", identity_model(TensorProto.FLOAT, batch=False, dims=(2,)), None)
    process = ServerProcess(repo, "--logging-updates", "--model-control-mode", "explicit").wait_ready()
    yield process
    process.stop()


@pytest.fixture
def http(server: ServerProcess) -> Iterator[httpclient.InferenceServerClient]:
    client = httpclient.InferenceServerClient(server.url)
    yield client
    client.update_log_settings(DEFAULTS)  # each test starts from the defaults
    client.close()


def grpc_settings(answer: Any) -> dict[str, Any]:
    """tritonclient.grpc's as_json answer: {"settings": {name: {"boolParam"|"uint32Param"|"stringParam": v}}}."""
    return {name: next(iter(value.values()), "") for name, value in answer["settings"].items()}


def logged_after(server: ServerProcess, mark: str) -> str:
    """What the server printed from the last line holding `mark` on, once that line is out."""
    wait_for(lambda: mark in server.printed, 10, mark)
    return server.printed[server.printed.rindex(mark):]


def test_round_trip_over_http_and_grpc(server: ServerProcess, http: httpclient.InferenceServerClient) -> None:
    assert http.get_log_settings() == DEFAULTS
    assert http.update_log_settings({"log_verbose_level": 2, "log_format": "ISO8601"}) == {
        **DEFAULTS, "log_verbose_level": 2, "log_format": "ISO8601"}
    client = grpcclient.InferenceServerClient(server.grpc_url)
    assert grpc_settings(client.get_log_settings(as_json=True)) == {**DEFAULTS, "log_verbose_level": 2,
                                                                   "log_format": "ISO8601"}
    answer = client.update_log_settings({"log_warning": False, "log_verbose_level": 0}, as_json=True)
    assert grpc_settings(answer) == {**DEFAULTS, "log_warning": False, "log_format": "ISO8601"}
    assert http.get_log_settings()["log_warning"] is False
    # A null (HTTP) changes nothing, as in Triton; log_file may be sent back unchanged.
    response = requests.post(f"{server.base}/v2/logging", json={"log_info": None, "log_file": ""}, timeout=10)
    assert response.json()["log_info"] is True


def test_verbose_lines_appear_and_info_lines_go(server: ServerProcess, http: httpclient.InferenceServerClient) -> None:
    http.load_model("ident")
    assert "loading model ident" not in server.printed  # DEBUG: not written at log_verbose_level 0
    http.update_log_settings({"log_verbose_level": 1, "log_info": False})
    http.load_model("ident")  # a reload: a DEBUG line, and an INFO one that log_info false drops
    http.update_log_settings({"log_format": "ISO8601"})  # its WARNING line marks the end of what the reload wrote
    tail = logged_after(server, "log_verbose_level=1")
    assert "DEBUG modelhost.manager: loading model ident version 1" in tail
    assert "reloaded model ident" not in tail
    http.update_log_settings({"log_info": True})
    http.load_model("ident")
    wait_for(lambda: "reloaded model ident" in logged_after(server, "log_info=True"), 10, "the INFO line")
    iso8601 = r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ INFO modelhost.manager: reloaded model ident"
    assert re.search(iso8601, logged_after(server, "log_info=True"), re.MULTILINE)


@pytest.mark.parametrize(("settings", "fragments"), [
    ({"log_info": "yes"}, ("'log_info'", "true or false")),
    ({"log_verbose_level": -1}, ("'log_verbose_level'", "integer")),
    ({"log_format": "json"}, ("'log_format'", "default, ISO8601")),
    ({"log_file": "/tmp/elsewhere.log"}, ("'log_file'", "log file location can not be updated")),
    ({"log_colour": True}, ("unknown log setting 'log_colour'",)),
    ({"log_info": False, "log_error": 1}, ("'log_error'",)),  # nothing changes unless every value is good
])
def test_bad_settings_are_a_400(server: ServerProcess, http: httpclient.InferenceServerClient,
                                settings: dict[str, Any], fragments: tuple[str, ...]) -> None:
    assert_error(requests.post(f"{server.base}/v2/logging", json=settings, timeout=10), 400, *fragments)
    assert http.get_log_settings() == DEFAULTS


def test_bad_settings_over_grpc(server: ServerProcess, http: httpclient.InferenceServerClient) -> None:
    # tritonclient picks each value's field by the setting's name; a raw stub can send the wrong one.
    value = service_pb2.LogSettingsRequest.SettingValue(uint32_param=1)
    with grpc.insecure_channel(server.grpc_url) as channel:
        with pytest.raises(grpc.RpcError) as info:
            service_pb2_grpc.GRPCInferenceServiceStub(channel).LogSettings(
                service_pb2.LogSettingsRequest(settings={"log_info": value}), timeout=10)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "'log_info' must be true or false" in (info.value.details() or "")
    client = grpcclient.InferenceServerClient(server.grpc_url)
    with pytest.raises(InferenceServerException, match="'log_file': log file location can not be updated"):
        client.update_log_settings({"log_file": "/tmp/elsewhere.log"})
    assert http.get_log_settings() == DEFAULTS
