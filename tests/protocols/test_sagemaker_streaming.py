"""InvokeEndpointWithResponseStream through boto3 against one real server (module scope): a decoupled Python model's
responses as one PayloadPart each, an error mid-stream as a ModelStreamError event, a TorchServe handler's
intermediate responses as parts (and the custom attributes it sets), an ONNX model's answer as one part; the
event-stream framing checked against botocore's own decoder; and a KIND_GPU config on this GPU-less host:
refused with a message naming the group (so /ping is 503), served on CPU with one warning when allowed."""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest
import requests
from botocore.eventstream import EventStreamBuffer, EventStreamError

from modelhost.protocols.sagemaker import event_stream
from tests.backends.torchserve_archives import STREAMING, make_archive
from tests.onnx_models import scale_model, write_model
from tests.protocols.test_sagemaker_server import runtime_client, wait_for_state
from tests.server import ServerProcess

PARTS_CONFIG = """
backend: "python"
max_batch_size: 0
model_transaction_policy { decoupled: true }
input [ { name: "IN" data_type: TYPE_INT32 dims: [ -1 ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
"""
# One response per element of IN; an element 0 is answered with an error response (mid-stream); more than 4
# elements fail the request before any response.
PARTS = """
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            values = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            if values.size > 4:
                raise pb_utils.TritonError("IN holds at most 4 values", pb_utils.TritonError.INVALID_ARG)
            sender = request.get_response_sender()
            for value in values:
                if value == 0:
                    sender.send(pb_utils.InferenceResponse(error=pb_utils.TritonError("0 cannot be repeated")))
                    break
                sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([value], np.int32))]))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
"""
# TorchServe's streaming handler, setting the response's custom attributes as a TorchServe handler sets a header.
STREAMING_ATTRIBUTES = STREAMING.replace('"x-batch", str(len(data))',
                                         '"X-Amzn-SageMaker-Custom-Attributes", f"batch={len(data)}"')
GPU_CONFIG = 'instance_group [ { count: 1 kind: KIND_GPU } ]\n'


def gpu_repository(root: Path) -> Path:
    write_model(root, "gpu", scale_model(3.0), GPU_CONFIG)
    return root


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repo = gpu_repository(tmp_path_factory.mktemp("streaming"))
    write_model(repo, "scale", scale_model(2.0), None)
    (repo / "parts" / "1").mkdir(parents=True)
    (repo / "parts" / "config.pbtxt").write_text(PARTS_CONFIG)
    (repo / "parts" / "1" / "model.py").write_text(PARTS)
    archive = make_archive(tmp_path_factory.mktemp("archives"), "torchstream", STREAMING_ATTRIBUTES)
    (repo / "torchstream" / "1").mkdir(parents=True)
    shutil.move(archive, repo / "torchstream" / "1" / "model.mar")
    process = ServerProcess(repo).wait_ready(path="/v2/health/live")
    for name, state in (("parts", "READY"), ("scale", "READY"), ("torchstream", "READY"), ("gpu", "UNAVAILABLE")):
        wait_for_state(process, name, state)
    yield process
    process.stop()


def stream(server: ServerProcess, model: str, body: bytes, content_type: str = "application/json") -> Any:
    return runtime_client(server).invoke_endpoint_with_response_stream(
        EndpointName="local", Body=body, ContentType=content_type, Accept="application/json",
        CustomAttributes=f"tfs-model-name={model}")


def v2_int32(values: list[int]) -> bytes:
    return orjson.dumps({"inputs": [{"name": "IN", "datatype": "INT32", "shape": [len(values)], "data": values}]})


def out(part: dict[str, Any]) -> list[int]:
    return orjson.loads(part["PayloadPart"]["Bytes"])["outputs"][0]["data"]  # type: ignore[no-any-return]


def test_a_decoupled_model_streams_one_part_per_response(server: ServerProcess) -> None:
    response = stream(server, "parts", v2_int32([5, 6, 7]))
    assert response["ContentType"] == "application/json"
    assert response["InvokedProductionVariant"] == "AllTraffic"
    assert [out(part) for part in response["Body"]] == [[5], [6], [7]]


def test_an_error_mid_stream_is_a_model_stream_error_event(server: ServerProcess) -> None:
    parts: list[Any] = []
    with pytest.raises(EventStreamError) as failed:
        for part in stream(server, "parts", v2_int32([1, 0, 2]))["Body"]:
            parts.append(part)
    assert [out(part) for part in parts] == [[1]]
    error = failed.value.response["Error"]
    assert error["Code"] == "ModelStreamError" and "0 cannot be repeated" in error["Message"]
    # A failure before the first part is the call's error, as InvokeEndpoint answers it.
    client = runtime_client(server)
    with pytest.raises(client.exceptions.ModelError) as refused:
        stream(server, "parts", v2_int32([1, 2, 3, 4, 5]))
    assert "at most 4 values" in refused.value.response["Error"]["Message"]


def test_a_torchserve_handler_streams_its_intermediate_responses(server: ServerProcess) -> None:
    answer = stream(server, "torchstream", b"go", "application/octet-stream")
    assert answer["CustomAttributes"] == "batch=1" and answer["ContentType"] == "text/plain"
    arrivals = [(part["PayloadPart"]["Bytes"], time.monotonic()) for part in answer["Body"]]
    assert [part for part, _ in arrivals] == [b"go:0;", b"go:1;", b"go:2;", b"go:done"]
    assert arrivals[-1][1] - arrivals[0][1] > 0.5  # parts come as the handler sends them (0.3 s apart), unbuffered
    parts = []
    with pytest.raises(EventStreamError) as failed:
        for part in stream(server, "torchstream", b"fail", "application/octet-stream")["Body"]:
            parts.append(part["PayloadPart"]["Bytes"])
    assert parts == [b"fail:0;"]
    error = failed.value.response["Error"]
    assert error["Code"] == "ModelStreamError" and "asked to fail mid-stream" in error["Message"]


def test_a_model_that_does_not_stream_answers_one_part(server: ServerProcess) -> None:
    body = b"1,2,3,4\n"
    parts = list(stream(server, "scale", body, "text/csv")["Body"])
    whole = runtime_client(server).invoke_endpoint(EndpointName="local", Body=body, ContentType="text/csv",
                                                   Accept="application/json", CustomAttributes="tfs-model-name=scale")
    assert len(parts) == 1 and parts[0]["PayloadPart"]["Bytes"] == whole["Body"].read()
    assert orjson.loads(parts[0]["PayloadPart"]["Bytes"]) == {"predictions": [[2.0, 4.0, 6.0, 8.0]]}


def test_event_stream_messages_decode_with_botocores_parser() -> None:
    payload = bytes(range(256)) * 3
    buffer = EventStreamBuffer()
    buffer.add_data(b"".join(event_stream.payload_parts(payload)))
    buffer.add_data(event_stream.stream_error("ModelStreamError", "it broke", "ModelInvocationTimeExceeded"))
    part, error = list(buffer)
    assert part.payload == payload and part.headers == {
        ":event-type": "PayloadPart", ":message-type": "event", ":content-type": "application/octet-stream"}
    assert error.headers[":message-type"] == "exception" and error.headers[":exception-type"] == "ModelStreamError"
    assert orjson.loads(error.payload) == {"Message": "it broke", "ErrorCode": "ModelInvocationTimeExceeded"}
    corrupted = bytearray(event_stream.message({":event-type": "PayloadPart"}, b"abc"))
    corrupted[-5] ^= 1  # the payload's last byte: the message CRC no longer matches
    broken = EventStreamBuffer()
    broken.add_data(bytes(corrupted))
    with pytest.raises(Exception, match="[Cc]hecksum|CRC"):
        list(broken)


def test_a_gpu_config_without_a_gpu_is_refused_naming_the_group(server: ServerProcess) -> None:
    assert requests.get(server.sagemaker + "/ping", timeout=5).status_code == 503
    index = requests.post(server.base + "/v2/repository/index", json={}, timeout=5).json()
    reason = next(entry["reason"] for entry in index if entry["name"] == "gpu")
    assert "instance group gpu_0" in reason and "KIND_GPU" in reason and "no GPU" in reason
    assert "--gpu-fallback cpu" in reason and "SAGEMAKER_GPU_FALLBACK=cpu" in reason


def test_a_gpu_config_runs_on_cpu_when_the_fallback_is_allowed(tmp_path: Path, start_server: Any) -> None:
    fallback = start_server(gpu_repository(tmp_path), env={"SAGEMAKER_GPU_FALLBACK": "cpu"})
    assert requests.get(fallback.sagemaker + "/ping", timeout=5).status_code == 200
    answer = requests.post(fallback.sagemaker + "/invocations", data=b"1,2,3,4\n",
                           headers={"Content-Type": "text/csv"}, timeout=10)
    assert answer.json() == {"predictions": [[3.0, 6.0, 9.0, 12.0]]}
    config = requests.get(fallback.base + "/v2/models/gpu/config", timeout=5).json()
    assert [group["kind"] for group in config["instance_group"]] == ["KIND_CPU"]
    warnings = [line for line in fallback.printed.splitlines() if "asked for KIND_GPU" in line]
    assert len(warnings) == 1 and "gpu_0" in warnings[0] and "running on CPU" in warnings[0]
    assert np.isfinite(answer.json()["predictions"][0]).all()
