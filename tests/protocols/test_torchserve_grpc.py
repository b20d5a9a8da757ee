"""TorchServe's gRPC APIs (tsfs §A4) on `modelhost torchserve`: the inference service on its port and the
management service on its own, called through stubs over the protos' messages as TorchServe's clients call them."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import grpc
import pytest
from google.protobuf import empty_pb2

from modelhost.protocols.torchserve import inference_pb2 as ipb
from modelhost.protocols.torchserve import management_pb2 as mpb
from tests.backends.torchserve_archives import BEHAVING, MODULE_HANDLE, make_archive
from tests.server import TorchServeProcess

pytest.importorskip("ts")

INFERENCE = "/org.pytorch.serve.grpc.inference.InferenceAPIsService/"
MANAGEMENT = "/org.pytorch.serve.grpc.management.ManagementAPIsService/"


class Stub:
    """What grpcio's generated stubs do: one callable per method path, over the messages' own serializers."""

    def __init__(self, channel: grpc.Channel, prefix: str, metadata: tuple[tuple[str, str], ...] = ()) -> None:
        self.channel, self.prefix, self.metadata = channel, prefix, metadata

    def unary(self, method: str, request: Any, response_type: Any) -> Any:
        call = self.channel.unary_unary(self.prefix + method, request_serializer=type(request).SerializeToString,
                                        response_deserializer=response_type.FromString)
        return call(request, timeout=60, metadata=self.metadata)

    def server_stream(self, method: str, request: Any, response_type: Any) -> list[Any]:
        call = self.channel.unary_stream(self.prefix + method, request_serializer=type(request).SerializeToString,
                                         response_deserializer=response_type.FromString)
        return list(call(request, timeout=60, metadata=self.metadata))

    def stream(self, method: str, requests: list[Any], response_type: Any) -> list[Any]:
        call = self.channel.stream_stream(self.prefix + method,
                                          request_serializer=type(requests[0]).SerializeToString,
                                          response_deserializer=response_type.FromString)
        return list(call(iter(requests), timeout=60, metadata=self.metadata))


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TorchServeProcess]:
    root = tmp_path_factory.mktemp("torchserve_grpc")
    store = root / "store"
    store.mkdir()
    make_archive(store, "echo", BEHAVING, config="minWorkers: 1\nbatchSize: 4\nmaxBatchDelay: 10\n")
    make_archive(store, "lengths", MODULE_HANDLE)
    process = TorchServeProcess(root, "--model-store", str(store), "--models", "echo.mar",
                                properties="disable_token_authorization=true\nenable_model_api=true\n"
                                           "default_workers_per_model=1\n")
    process.wait_ready()
    yield process
    process.stop()


@contextmanager
def inference_stub(server: TorchServeProcess) -> Iterator[Stub]:
    """A stub of `server`'s gRPC inference service."""
    with grpc.insecure_channel(f"127.0.0.1:{server.grpc_inference_port}") as channel:
        yield Stub(channel, INFERENCE)


@pytest.fixture()
def inference(server: TorchServeProcess) -> Iterator[Stub]:
    with inference_stub(server) as stub:
        yield stub


@pytest.fixture()
def management(server: TorchServeProcess) -> Iterator[Stub]:
    with grpc.insecure_channel(f"127.0.0.1:{server.grpc_management_port}") as channel:
        yield Stub(channel, MANAGEMENT)


def predictions(name: str, body: bytes, version: str = "") -> ipb.PredictionsRequest:
    return ipb.PredictionsRequest(model_name=name, model_version=version, input={"data": body})


def test_ping_and_predictions(inference: Stub) -> None:
    health = inference.unary("Ping", empty_pb2.Empty(), ipb.TorchServeHealthResponse)
    assert json.loads(health.health) == {"status": "Healthy"}
    answer = inference.unary("Predictions", predictions("echo", b"hello"), ipb.PredictionResponse)
    assert json.loads(answer.prediction)["echo"] == "hello"
    (streamed,) = inference.server_stream("StreamPredictions", predictions("echo", b"s"), ipb.PredictionResponse)
    assert json.loads(streamed.prediction)["echo"] == "s"


@pytest.mark.parametrize(("request_", "code", "message"), [
    (predictions("nope", b"x"), grpc.StatusCode.INTERNAL, "Model not found: nope"),
    (predictions("", b"x"), grpc.StatusCode.INTERNAL, "Parameter model_name is required."),
    (predictions("echo", b"x", "9.9"), grpc.StatusCode.INTERNAL, "Model version: 9.9 does not exist for model: echo"),
    (predictions("echo", b"raise"), grpc.StatusCode.UNAVAILABLE, "Prediction failed: handler 'handler.py' of model "
                                                                 "'echo' raised ValueError: asked to raise"),
    (predictions("echo", b"missing"), grpc.StatusCode.NOT_FOUND, "no such item"),
])
def test_errors_have_torchserves_codes(inference: Stub, request_: ipb.PredictionsRequest, code: grpc.StatusCode,
                                       message: str) -> None:
    with pytest.raises(grpc.RpcError) as caught:
        inference.unary("Predictions", request_, ipb.PredictionResponse)
    assert caught.value.code() == code
    assert caught.value.details() == message


def test_the_bidirectional_stream_answers_each_request_and_carries_errors(inference: Stub) -> None:
    first, failed = inference.stream("StreamPredictions2", [
        ipb.PredictionsRequest(model_name="echo", input={"data": b"one"}, sequence_id="s1"),
        ipb.PredictionsRequest(model_name="nope", input={"data": b"two"}, sequence_id="s1"),
    ], ipb.PredictionResponse)
    assert json.loads(first.prediction)["echo"] == "one" and first.sequence_id == "s1"
    assert failed.status.code == grpc.StatusCode.INTERNAL.value[0]
    assert failed.status.message == "Model not found: nope" and failed.sequence_id == "s1"


def test_management_service(management: Stub, inference: Stub) -> None:
    def call(method: str, request: Any) -> Any:
        return json.loads(management.unary(method, request, mpb.ManagementResponse).msg)

    assert call("RegisterModel", mpb.RegisterModelRequest(url="lengths.mar", initial_workers=1, synchronous=True)) == {
        "status": 'Model "lengths" Version: 1.0 registered with 1 initial workers'}
    assert json.loads(inference.unary("Predictions", predictions("lengths", b"abcd"),
                                      ipb.PredictionResponse).prediction)["length"] == 4
    listed = call("ListModels", mpb.ListModelsRequest())
    assert [m["modelName"] for m in listed["models"]] == ["echo", "lengths"]
    paged = call("ListModels", mpb.ListModelsRequest(limit=1))
    assert (paged["nextPageToken"], [m["modelName"] for m in paged["models"]]) == ("1", ["echo"])
    (described,) = call("DescribeModel", mpb.DescribeModelRequest(model_name="lengths"))
    assert described["minWorkers"] == 1 and len(described["workers"]) == 1
    assert call("ScaleWorker", mpb.ScaleWorkerRequest(model_name="lengths", min_worker=2, synchronous=True)) == {
        "status": "Workers scaled to 2 for model: lengths"}
    assert call("SetDefault", mpb.SetDefaultRequest(model_name="lengths", model_version="1.0"))["status"].startswith(
        "Default version successfully updated")
    assert call("UnregisterModel", mpb.UnregisterModelRequest(model_name="lengths")) == {
        "status": 'Model "lengths" unregistered'}
    with pytest.raises(grpc.RpcError) as caught:
        call("DescribeModel", mpb.DescribeModelRequest(model_name="lengths"))
    assert caught.value.code() == grpc.StatusCode.NOT_FOUND
    with pytest.raises(grpc.RpcError) as caught:
        call("RegisterModel", mpb.RegisterModelRequest())
    assert (caught.value.code(), caught.value.details()) == (grpc.StatusCode.INVALID_ARGUMENT,
                                                             "Parameter url is required.")
