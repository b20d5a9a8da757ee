"""What Triton's clients and tools check, on one server started as tools that want Triton start it:
`--server-name triton`, explicit model control, Triton's `logging` API group restricted, log updates off
(the default). (Triton's words for load/unload refusals and failures are
held in tests/test_model_control.py, deep JSON in test_bad_requests.py.)"""

from __future__ import annotations

from collections.abc import Iterator

import grpc
import pytest
import requests
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from onnx import TensorProto
from tritonclient.grpc import service_pb2, service_pb2_grpc

from tests.helpers import assert_error
from tests.onnx_models import identity_model, write_model
from tests.server import ServerProcess

NOT_SUPPORTED = "'repository_name' specification is not supported"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repo = tmp_path_factory.mktemp("compat")
    write_model(repo, "ident", identity_model(TensorProto.FLOAT, batch=False, dims=(2,)), None)
    process = ServerProcess(repo, "--server-name", "triton", "--model-control-mode", "explicit",
                            "--load-model", "ident", "--http-restricted-api", "logging:admin-key=s3cret-logging-key",
                            ).wait_ready()
    yield process
    process.stop()


def test_server_name_as_triton_reports_it(server: ServerProcess) -> None:
    assert httpclient.InferenceServerClient(server.url).get_server_metadata()["name"] == "triton"
    assert grpcclient.InferenceServerClient(server.grpc_url).get_server_metadata().name == "triton"


@pytest.mark.parametrize("path", ["main/index", "main/models/ident/load", "main/models/ident/unload"])
def test_named_repository_routes_are_refused_in_tritons_words(server: ServerProcess, path: str) -> None:
    response = requests.post(f"{server.base}/v2/repository/{path}", timeout=10)
    assert_error(response, 501, NOT_SUPPORTED, "'main'")
    assert requests.get(f"{server.base}/v2/models/ident/ready", timeout=10).status_code == 200  # still loaded


def test_unnamed_repository_routes_still_work(server: ServerProcess) -> None:
    index = requests.post(f"{server.base}/v2/repository/index", timeout=10).json()
    assert {"name": "ident", "version": "1", "state": "READY"} in index
    assert requests.post(f"{server.base}/v2/repository/models/ident/load", timeout=30).status_code == 200


def test_named_repository_over_grpc(server: ServerProcess) -> None:
    with grpc.insecure_channel(server.grpc_url) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        for call, request in (
            (stub.RepositoryIndex, service_pb2.RepositoryIndexRequest(repository_name="main")),
            (stub.RepositoryModelLoad, service_pb2.RepositoryModelLoadRequest(repository_name="main",
                                                                              model_name="ident")),
        ):
            with pytest.raises(grpc.RpcError) as info:
                call(request, timeout=10)
            assert info.value.code() == grpc.StatusCode.UNIMPLEMENTED
            assert NOT_SUPPORTED in (info.value.details() or "")


def test_log_settings_are_tritons_logging_group_and_read_only_by_default(server: ServerProcess) -> None:
    url, key = f"{server.base}/v2/logging", {"admin-key": "s3cret-logging-key"}
    assert requests.get(url, timeout=10).status_code == 401  # the group Triton's --http-restricted-api names
    assert requests.get(url, headers=key, timeout=10).json()["log_verbose_level"] == 0
    response = requests.post(url, json={"log_verbose_level": 1}, headers=key, timeout=10)
    assert_error(response, 501, "--logging-updates")
    assert requests.post(url, json={"log_verbose_level": 0}, headers=key, timeout=10).status_code == 200  # no change
