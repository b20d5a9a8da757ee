"""Triton's --http-header-forward-pattern and --grpc-header-forward-pattern (its qa/L0_parameters): headers whose
names match reach the model as request parameters; the reserved ones are refused."""

from __future__ import annotations

import queue
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from modelhost.errors import ModelhostError
from modelhost.protocols.header_forwarding import HeaderForwarding
from tests.backends.test_python_server import write_model
from tests.backends.test_triton_python_api import PARAMETERS, PARAMETERS_CONFIG
from tests.server import ServerProcess

VALUES = """
import json
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        pairs = [sorted(json.loads(request.parameters()).items()) for request in requests]
        return [pb_utils.InferenceResponse([pb_utils.Tensor("KEYS", np.array([f"{k}={v}" for k, v in p] or [""],
                                                                             dtype=object))]) for p in pairs]
"""


def test_pattern_matches_part_of_a_name_case_insensitively_unless_asked() -> None:
    headers = [("my_header_1", "a"), ("MY_HEADER_2", "b"), ("other", "c"), ("x-my_header", "d")]
    assert HeaderForwarding("MY_HEADER.*").parameters(headers) == {"my_header_1": "a", "MY_HEADER_2": "b",
                                                                   "x-my_header": "d"}
    assert HeaderForwarding("(?-i)MY_HEADER.*").parameters(headers) == {"MY_HEADER_2": "b"}
    assert HeaderForwarding("^my_").parameters(headers) == {"my_header_1": "a", "MY_HEADER_2": "b"}
    assert HeaderForwarding(None).parameters(headers) == {} and not HeaderForwarding("").active


@pytest.mark.parametrize("name", ["priority", "sequence_id", "binary_data_output", "triton_anything"])
def test_reserved_names_are_refused_in_tritons_words(name: str) -> None:
    with pytest.raises(ModelhostError, match=f"Header '{name}' is reserved for Triton usage and cannot be forwarded"):
        HeaderForwarding(".*").parameters([(name, "1")])


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repo: Path = tmp_path_factory.mktemp("forwarding")
    write_model(repo, "values", PARAMETERS_CONFIG, VALUES)
    write_model(repo, "parameters", PARAMETERS_CONFIG, PARAMETERS)
    process = ServerProcess(repo, "--http-header-forward-pattern", "MY_HEADER.*",
                            "--grpc-header-forward-pattern", "(?-i)my_header.*")
    try:
        yield process.wait_ready()
    finally:
        process.stop()


def _inputs(module: Any) -> list[Any]:
    tensor = module.InferInput("INPUT0", [1], "FP32")
    tensor.set_data_from_numpy(np.ones(1, np.float32))
    return [tensor]


HEADERS = {"my_header_1": "one", "MY_HEADER_2": 'a "quoted" value\\ ', "header_3": "three"}


def test_http_headers_reach_the_model(server: ServerProcess) -> None:
    client = httpclient.InferenceServerClient(server.url)
    result = client.infer("values", _inputs(httpclient), headers=HEADERS, parameters={"key": 1})
    assert result.as_numpy("KEYS").tolist() == [b"key=1", b"my_header_1=one", b'my_header_2=a "quoted" value\\ ']


def test_grpc_metadata_reaches_the_model_unary_and_streamed(server: ServerProcess) -> None:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    headers = {"my_header_1": "one", "header_3": "three"}  # gRPC metadata names are lower case
    result = client.infer("values", _inputs(grpcclient), headers=headers)
    assert result.as_numpy("KEYS").tolist() == [b"my_header_1=one"]
    answers: queue.Queue[Any] = queue.Queue()
    client.start_stream(callback=lambda result, error: answers.put(error or result), headers=headers)
    try:
        client.async_stream_infer("values", _inputs(grpcclient))
        streamed = answers.get(timeout=30)
    finally:
        client.stop_stream()
    assert not isinstance(streamed, Exception), streamed
    assert streamed.as_numpy("KEYS").tolist() == [b"my_header_1=one"]


def test_a_forwarded_header_with_a_reserved_name_is_a_400(server: ServerProcess) -> None:
    # The patterns match anywhere in a name: 'triton_my_header' matches them, and 'triton_' is reserved.
    client = httpclient.InferenceServerClient(server.url)
    with pytest.raises(InferenceServerException, match="Header 'triton_my_header' is reserved") as refused:
        client.infer("values", _inputs(httpclient), headers={"triton_my_header": "x"})
    assert refused.value.status() == "400"
    grpc = grpcclient.InferenceServerClient(server.grpc_url)
    with pytest.raises(InferenceServerException, match="Header 'triton_my_header' is reserved") as refused:
        grpc.infer("values", _inputs(grpcclient), headers={"triton_my_header": "x"})
    assert refused.value.status() == "StatusCode.INVALID_ARGUMENT"
