"""Hostile requests against a live server, over every front-end, with real clients: each is a 4xx in the
protocol's own error shape naming the tensor and the problem, nothing is allocated on the request's word,
undecodable gRPC messages are INVALID_ARGUMENT with at most a rate-limited log line, and no error shows a
server file path.

One server (module scope) serves `scale` (INPUT0 FP32 [batch, 4] -> OUTPUT0 = 2 x INPUT0) with small
limits: --max-request-elements 1000, --max-output-bytes 48 (three rows of OUTPUT0), and
--client-log-lines-per-second 2.
"""

from __future__ import annotations

import io
import json
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
import requests
import tritonclient.grpc as grpcclient
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from modelhost.client_log import BURST
from tests.helpers import assert_error
from tests.onnx_models import scale_model, write_model
from tests.server import ServerProcess

HEADER_LENGTH = "Inference-Header-Content-Length"
SERVICE = "inference.GRPCInferenceService"
# Every unary RPC of the service and the message it takes.
UNARY = {
    "ServerLive": service_pb2.ServerLiveRequest, "ServerReady": service_pb2.ServerReadyRequest,
    "ModelReady": service_pb2.ModelReadyRequest, "ServerMetadata": service_pb2.ServerMetadataRequest,
    "ModelMetadata": service_pb2.ModelMetadataRequest, "ModelInfer": service_pb2.ModelInferRequest,
    "ModelConfig": service_pb2.ModelConfigRequest, "ModelStatistics": service_pb2.ModelStatisticsRequest,
    "RepositoryIndex": service_pb2.RepositoryIndexRequest,
    "RepositoryModelLoad": service_pb2.RepositoryModelLoadRequest,
    "RepositoryModelUnload": service_pb2.RepositoryModelUnloadRequest,
}
GARBAGE = b"\xff\xff\xff\xff\xff"  # a field tag whose varint never ends


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repo = tmp_path_factory.mktemp("repo")
    write_model(repo, "scale", scale_model(2.0), None)
    process = ServerProcess(repo, "--max-request-elements", "1000", "--max-output-bytes", "48",
                            "--client-log-lines-per-second", "2", cache_dir=tmp_path_factory.mktemp("cache"))
    yield process.wait_ready()
    process.stop()


@pytest.fixture(scope="module")
def channel(server: ServerProcess) -> Iterator[grpc.Channel]:
    with grpc.insecure_channel(server.grpc_url) as opened:
        yield opened


def assert_serving(server: ServerProcess) -> None:
    rows = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 4], "data": [1, 2, 3, 4]}]}
    response = requests.post(f"{server.base}/v2/models/scale/infer", json=rows, timeout=10)
    assert response.status_code == 200, response.text
    assert response.json()["outputs"][0]["data"] == [2.0, 4.0, 6.0, 8.0]


def v2_json(shape: list[int], data: Any, datatype: str = "FP32", **extra: Any) -> bytes:
    return json.dumps({"inputs": [{"name": "INPUT0", "datatype": datatype, "shape": shape, "data": data}],
                       **extra}).encode()


def v2_binary(shape: list[int], data: bytes, datatype: str = "FP32") -> tuple[bytes, dict[str, str]]:
    header = json.dumps({"inputs": [{"name": "INPUT0", "datatype": datatype, "shape": shape,
                                     "parameters": {"binary_data_size": len(data)}}]}).encode()
    return header + data, {HEADER_LENGTH: str(len(header))}


def nested(depth: int, leaf: Any) -> Any:
    for _ in range(depth):
        leaf = [leaf]
    return leaf


HUGE = [0, 2**40, 2**40]
V2_CASES: dict[str, tuple[bytes, dict[str, str], tuple[str, ...]]] = {
    "json-65-dims": (v2_json([1] * 65, [1.0]), {}, ("'INPUT0'", "65 dimensions")),
    "json-overflowing-shape": (v2_json(HUGE, []), {}, ("'INPUT0'", "[0,1099511627776,1099511627776]",
                                                       "--max-request-elements")),
    "json-int-nested-70-deep": (v2_json([1], nested(70, 1), "INT64"), {}, ("'INPUT0'", "70 lists deep",
                                                                           "--json-max-depth")),
    "json-over-element-limit": (v2_json([251, 4], [0.5] * 1004), {}, ("'INPUT0'", "1004 elements", "1000")),
    "binary-65-dims": (*v2_binary([1] * 65, bytes(4)), ("'INPUT0'", "65 dimensions")),
    "binary-overflowing-shape": (*v2_binary(HUGE, b""), ("'INPUT0'", "--max-request-elements")),
    "binary-bytes-overflowing-shape": (*v2_binary(HUGE, b"", "BYTES"), ("'INPUT0'", "--max-request-elements")),
    "duplicate-output": (v2_json([1, 4], [1, 2, 3, 4], outputs=[{"name": "OUTPUT0"}, {"name": "OUTPUT0"}]), {},
                         ("'OUTPUT0'", "twice")),
    "output-over-limit": (v2_json([4, 4], [1.0] * 16), {}, ("'OUTPUT0'", "[4,4]", "48 bytes", "--max-output-bytes")),
}


@pytest.mark.parametrize("case", V2_CASES.values(), ids=V2_CASES.keys())
def test_v2_http_hostile_shapes_are_400(server: ServerProcess, case: tuple[bytes, dict[str, str], tuple[str, ...]]
                                        ) -> None:
    body, headers, fragments = case
    response = requests.post(f"{server.base}/v2/models/scale/infer", data=body, headers=headers, timeout=30)
    assert_error(response, 400, *fragments)
    assert_serving(server)


def test_output_at_the_limit_is_served(server: ServerProcess) -> None:
    response = requests.post(f"{server.base}/v2/models/scale/infer", data=v2_json([3, 4], [1.0] * 12), timeout=10)
    assert response.status_code == 200, response.text


def npy_header(shape: str, descr: str = "<f4") -> bytes:
    header = f"{{'descr': '{descr}', 'fortran_order': False, 'shape': {shape}, }}".encode()
    header += b" " * (63 - (len(header) + 10) % 64) + b"\n"
    return b"\x93NUMPY\x01\x00" + len(header).to_bytes(2, "little") + header


NPY_CASES = {
    # numpy's own loader allocates the declared 16 TiB before reading a byte of data.
    "declares-16-TiB": (npy_header("(1099511627776, 4)"), ("'INPUT0'", "[1099511627776,4]",
                                                           "--max-request-elements")),
    "65-dims": (npy_header("(" + "1, " * 65 + ")") + bytes(4), ("'INPUT0'", "65 dimensions")),
    "overflowing-shape": (npy_header("(0, 1099511627776, 1099511627776)"), ("'INPUT0'", "--max-request-elements")),
    "short-data": (npy_header("(2, 4)") + bytes(16), ("16 bytes of data", "32")),
}


@pytest.mark.parametrize("case", NPY_CASES.values(), ids=NPY_CASES.keys())
def test_sagemaker_npy_header_is_checked_before_allocating(server: ServerProcess,
                                                           case: tuple[bytes, tuple[str, ...]]) -> None:
    body, fragments = case
    response = requests.post(f"{server.sagemaker}/invocations", data=body,
                             headers={"Content-Type": "application/x-npy"}, timeout=30)
    assert_error(response, 400, *fragments)
    buffer = io.BytesIO()
    np.save(buffer, np.ones((2, 4), np.float32))
    good = requests.post(f"{server.sagemaker}/invocations", data=buffer.getvalue(),
                         headers={"Content-Type": "application/x-npy", "Accept": "application/json"}, timeout=30)
    assert good.status_code == 200, good.text


def infer_message(shape: list[int], raw: bytes | None = None) -> service_pb2.ModelInferRequest:
    message = service_pb2.ModelInferRequest(model_name="scale")
    message.inputs.add(name="INPUT0", datatype="FP32", shape=shape)
    message.raw_input_contents.append(raw if raw is not None else bytes(4 * int(np.prod(shape))))
    return message


@pytest.mark.parametrize(("shape", "fragment"), [([1] * 65, "65 dimensions"), (HUGE, "--max-request-elements")],
                         ids=["65-dims", "overflowing-shape"])
def test_grpc_hostile_shapes_are_invalid_argument(server: ServerProcess, channel: grpc.Channel, shape: list[int],
                                                  fragment: str) -> None:
    stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
    with pytest.raises(grpc.RpcError) as raised:
        stub.ModelInfer(infer_message(shape, b"" if 0 in shape else None), timeout=10)
    assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT, raised.value.details()
    assert "'INPUT0'" in raised.value.details() and fragment in raised.value.details()


def test_grpc_duplicate_output_is_invalid_argument(server: ServerProcess) -> None:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    inputs = [grpcclient.InferInput("INPUT0", [1, 4], "FP32")]
    inputs[0].set_data_from_numpy(np.ones((1, 4), np.float32))
    outputs = [grpcclient.InferRequestedOutput("OUTPUT0"), grpcclient.InferRequestedOutput("OUTPUT0")]
    with pytest.raises(InferenceServerException) as raised:
        client.infer("scale", inputs, outputs=outputs)
    assert raised.value.status() == "StatusCode.INVALID_ARGUMENT", raised.value
    assert "'OUTPUT0'" in raised.value.message() and "twice" in raised.value.message()
    assert client.infer("scale", inputs).as_numpy("OUTPUT0").tolist() == [[2.0] * 4]
    client.close()


def raw_call(channel: grpc.Channel, method: str, data: bytes) -> grpc.RpcError:
    call = channel.unary_unary(f"/{SERVICE}/{method}")  # no serializers: bytes out, bytes in
    with pytest.raises(grpc.RpcError) as raised:
        call(data, timeout=10)
    return raised.value


def test_undecodable_grpc_messages_are_invalid_argument_and_logged_at_a_limited_rate(
        server: ServerProcess, channel: grpc.Channel) -> None:
    started = time.monotonic()
    truncated = infer_message([1, 4]).SerializeToString()[:-7]  # cut inside raw_input_contents
    sent = 0
    for method in UNARY:
        for data in (GARBAGE, b"\x0a\x05ab", truncated if method == "ModelInfer" else GARBAGE[:3]):
            error = raw_call(channel, method, data)
            sent += 1
            assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, (method, data, error.details())
            assert "not a valid" in error.details() and UNARY[method].DESCRIPTOR.name in error.details()
            assert "\n" not in error.details()
    assert_serving(server)
    elapsed = time.monotonic() - started
    log = server.printed
    assert "Traceback" not in log
    lines = log.count("undecodable")
    assert sent > BURST + 2 * elapsed + 1
    assert 1 <= lines <= BURST + 2 * elapsed + 1, (lines, sent, elapsed)
    # The next line let through says how many were dropped.
    time.sleep(0.6)
    raw_call(channel, "ServerLive", GARBAGE)
    deadline = time.monotonic() + 5
    while not re.search(r"suppressed \d+ similar messages \(grpc-undecodable\)", server.printed):
        assert time.monotonic() < deadline, server.printed[-2000:]
        time.sleep(0.05)


def test_messages_of_other_types_are_answered_as_what_they_decode_to(server: ServerProcess,
                                                                     channel: grpc.Channel) -> None:
    """Protobuf reads one message's bytes as another's fields: the server answers those, never UNKNOWN."""
    metadata = service_pb2.ModelMetadataRequest(name="scale").SerializeToString()
    error = raw_call(channel, "ModelInfer", metadata)  # model_name "scale", no inputs
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, error.details()
    assert "'INPUT0'" in error.details()
    infer = infer_message([1, 4]).SerializeToString()  # as ModelMetadataRequest: name "scale", the rest unknown
    answer = channel.unary_unary(f"/{SERVICE}/ModelMetadata")(infer, timeout=10)
    assert service_pb2.ModelMetadataResponse.FromString(answer).name == "scale"
    assert_serving(server)


def test_stream_answers_an_undecodable_message_and_goes_on(server: ServerProcess, channel: grpc.Channel) -> None:
    stream = channel.stream_stream(f"/{SERVICE}/ModelStreamInfer",
                                   response_deserializer=service_pb2.ModelStreamInferResponse.FromString)
    good = service_pb2.ModelInferRequest(model_name="scale", id="good")
    good.inputs.add(name="INPUT0", datatype="FP32", shape=[1, 4])
    good.raw_input_contents.append(np.ones((1, 4), np.float32).tobytes())
    responses = list(stream(iter([GARBAGE, good.SerializeToString()]), timeout=10))
    errors = [r.error_message for r in responses if r.error_message]
    answered = [r.infer_response.id for r in responses if not r.error_message]
    assert len(errors) == 1 and "not a valid" in errors[0], responses
    assert answered == ["good"]


# --- no server file paths in error bodies ---------------------------------------------------------


def test_errors_show_no_server_paths(tmp_path: Path, start_server: Any) -> None:
    """A model whose file is not ONNX fails to load: onnxruntime's reason names the file's absolute path.
    The index (HTTP and gRPC) and the load error show it relative to the repository; the log has it whole."""
    repo = tmp_path / "models"
    write_model(repo, "scale", scale_model(2.0), None)
    broken = repo / "broken" / "1"
    broken.mkdir(parents=True)
    (broken / "model.onnx").write_bytes(b"this is not an ONNX model")
    (repo / "broken" / "config.pbtxt").write_text(
        'backend: "onnxruntime"\nmax_batch_size: 0\n'
        'input [{ name: "x", data_type: TYPE_FP32, dims: [4] }]\n'
        'output [{ name: "y", data_type: TYPE_FP32, dims: [4] }]\n')
    server = start_server(repo, "--model-control-mode", "explicit", "--load-model", "scale")
    root = str(tmp_path)

    response = requests.post(f"{server.base}/v2/repository/models/broken/load", timeout=60)
    message = assert_error(response, 503, "broken")
    index = requests.post(f"{server.base}/v2/repository/index", json={}, timeout=10).json()
    [entry] = [e for e in index if e["name"] == "broken"]
    client = grpcclient.InferenceServerClient(server.grpc_url)
    grpc_reasons = [m.reason for m in client.get_model_repository_index().models if m.name == "broken"]
    client.close()
    for text in (message, entry["reason"], *grpc_reasons):
        assert root not in text and "/models/" not in text, text
        assert "model.onnx" in text, text
    assert str(broken) in server.printed  # the operator still sees where
