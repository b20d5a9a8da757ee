"""KServe V2 over gRPC through Triton's own clients: health, metadata, config, repository, inference,
every datatype raw and typed."""

from __future__ import annotations

from functools import partial

import grpc
import numpy as np
import pytest
import requests
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from google.protobuf import json_format
from tritonclient.grpc import model_config_pb2, service_pb2, service_pb2_grpc

from tests.datatype_values import extremes
from tests.protocols.grpc.models import (
    DATATYPES,
    UNKNOWN,
    S,
    Served,
    assert_same,
    grpc_error,
    pair,
    simple_inputs,
)

# --------------------------------------------------------------------------- health, metadata, config, repository


def test_health(client: grpcclient.InferenceServerClient) -> None:
    assert client.is_server_live() is True
    assert client.is_server_ready() is True  # --strict-readiness: every model loaded
    assert client.is_model_ready("simple") is True
    assert client.is_model_ready("simple", "1") is True
    assert client.is_model_ready("simple", "2") is False
    assert client.is_model_ready("nope") is False


def test_server_metadata(client: grpcclient.InferenceServerClient, served: Served) -> None:
    metadata = client.get_server_metadata()
    http = requests.get(served.server.base + "/v2", timeout=5).json()
    assert (metadata.name, metadata.version, list(metadata.extensions)) == (
        http["name"], http["version"], http["extensions"])
    assert metadata.name == "modelhost" and "statistics" in metadata.extensions
    assert client.get_server_metadata(as_json=True)["name"] == "modelhost"


def test_model_metadata(client: grpcclient.InferenceServerClient) -> None:
    metadata = client.get_model_metadata("simple")
    assert metadata == client.get_model_metadata("simple", "1")
    assert (metadata.name, list(metadata.versions), metadata.platform) == ("simple", ["1"], "onnxruntime_onnx")
    assert [(t.name, t.datatype, list(t.shape)) for t in metadata.inputs] == [
        ("INPUT0", "FP32", [-1, 16]), ("INPUT1", "FP32", [-1, 16])]
    assert [(t.name, t.datatype, list(t.shape)) for t in metadata.outputs] == [
        ("OUTPUT0", "FP32", [-1, 16]), ("OUTPUT1", "FP32", [-1, 16])]
    error = grpc_error(lambda: client.get_model_metadata("nope"))
    assert error.status() == "StatusCode.NOT_FOUND" and UNKNOWN in error.message()
    assert grpc_error(lambda: client.get_model_metadata("simple", "2")).status() == "StatusCode.NOT_FOUND"


def test_model_config_is_the_http_config(client: grpcclient.InferenceServerClient, served: Served) -> None:
    config = client.get_model_config("slow").config
    assert (config.name, config.max_batch_size) == ("slow", 4)
    assert [(i.name, i.data_type, list(i.dims)) for i in config.input] == [
        ("X", model_config_pb2.TYPE_FP32, [S, S]), ("ITERATIONS", model_config_pb2.TYPE_INT64, [1])]
    assert config.dynamic_batching.default_queue_policy.max_queue_size == 1
    http = requests.get(served.server.base + "/v2/models/slow/config", timeout=5).json()
    assert config == json_format.ParseDict(http, model_config_pb2.ModelConfig())  # Triton's own message
    assert client.get_model_config("slow", as_json=True)["config"]["name"] == "slow"
    error = grpc_error(lambda: client.get_model_config("nope"))
    assert error.status() == "StatusCode.NOT_FOUND" and UNKNOWN in error.message()


def test_repository_index(client: grpcclient.InferenceServerClient) -> None:
    index = client.get_model_repository_index()
    names = {model.name for model in index.models}
    assert {"simple", "shared", "slow", "double", "identity_bytes"} <= names
    assert all((model.version, model.state) == ("1", "READY") for model in index.models)


def test_statistics_are_the_http_statistics(client: grpcclient.InferenceServerClient, served: Served) -> None:
    array = np.array([[1, 2, 3]], np.int8)
    infer_input = grpcclient.InferInput("INPUT0", [1, 3], "INT8").set_data_from_numpy(array)
    client.infer("identity_int8", [infer_input])
    stats = client.get_inference_statistics("identity_int8")
    (stat,) = stats.model_stats
    assert (stat.name, stat.version) == ("identity_int8", "1")
    assert stat.inference_stats.success.count >= 1 and stat.inference_count >= 1
    http = requests.get(served.server.base + "/v2/models/identity_int8/stats", timeout=5).json()
    assert stats == json_format.ParseDict(http, service_pb2.ModelStatisticsResponse())
    every = client.get_inference_statistics()
    assert {s.name for s in every.model_stats} >= {"simple", "slow", "identity_int8"}
    error = grpc_error(lambda: client.get_inference_statistics("nope"))
    assert error.status() == "StatusCode.NOT_FOUND" and UNKNOWN in error.message()


def test_load_and_unload_are_unimplemented_with_the_http_message(client: grpcclient.InferenceServerClient,
                                                                  served: Served) -> None:
    http = httpclient.InferenceServerClient(served.server.url)
    try:
        for grpc_call, http_call in ((client.load_model, http.load_model), (client.unload_model, http.unload_model)):
            error = grpc_error(partial(grpc_call, "simple"))
            assert error.status() == "StatusCode.UNAVAILABLE"  # Triton's status and words
            assert error.message().startswith("explicit model load / unload is not allowed if polling is enabled")
            assert "model control mode is 'none'" in error.message()
            assert error.message() == grpc_error(partial(http_call, "simple")).message()
    finally:
        http.close()
    assert client.is_model_ready("simple")


# --------------------------------------------------------------------------- inference


def test_infer_with_request_id_parameters_and_every_output(client: grpcclient.InferenceServerClient) -> None:
    a, b = pair(1, rows=3)
    result = client.infer("simple", simple_inputs(a, b), request_id="req-7", parameters={"note": "kept", "n": 3},
                          priority=1)
    response = result.get_response()
    assert (response.model_name, response.model_version, response.id) == ("simple", "1", "req-7")
    assert [o.name for o in response.outputs] == ["OUTPUT0", "OUTPUT1"]
    assert all(len(raw) == 3 * 16 * 4 for raw in response.raw_output_contents)  # tritonclient reads raw only
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)


def test_requested_outputs(client: grpcclient.InferenceServerClient) -> None:
    a, b = pair(2)
    result = client.infer("simple", simple_inputs(a, b), model_version="1",
                          outputs=[grpcclient.InferRequestedOutput("OUTPUT1")])
    assert [o.name for o in result.get_response().outputs] == ["OUTPUT1"]
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)
    assert result.as_numpy("OUTPUT0") is None


@pytest.mark.parametrize("algorithm", ["gzip", "deflate"])
def test_compressed_messages(client: grpcclient.InferenceServerClient, algorithm: str) -> None:
    a, b = pair(4, rows=8)
    result = client.infer("simple", simple_inputs(a, b), compression_algorithm=algorithm)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)


@pytest.mark.parametrize("datatype", list(DATATYPES))
def test_every_datatype_raw(client: grpcclient.InferenceServerClient, datatype: str) -> None:
    array = extremes(datatype)
    infer_input = grpcclient.InferInput("INPUT0", list(array.shape), datatype).set_data_from_numpy(array)
    result = client.infer(f"identity_{datatype.lower()}", [infer_input])
    (output,) = result.get_response().outputs
    assert (output.name, output.datatype, list(output.shape)) == ("OUTPUT0", datatype, list(array.shape))
    assert_same(result.as_numpy("OUTPUT0"), array)


def typed_request(datatype: str, array: np.ndarray, field: str) -> service_pb2.ModelInferRequest:
    request = service_pb2.ModelInferRequest(model_name=f"identity_{datatype.lower()}", id="typed")
    tensor = request.inputs.add(name="INPUT0", datatype=datatype, shape=array.shape)
    getattr(tensor.contents, field).extend(array.ravel().tolist())
    return request


@pytest.mark.parametrize("datatype", [d for d, (_, _, field) in DATATYPES.items() if field])
def test_every_datatype_typed(stub: service_pb2_grpc.GRPCInferenceServiceStub, datatype: str) -> None:
    array = extremes(datatype)
    response = stub.ModelInfer(typed_request(datatype, array, DATATYPES[datatype][2] or ""), timeout=10)
    assert response.id == "typed" and len(response.raw_output_contents) == 1
    assert_same(grpcclient.InferResult(response).as_numpy("OUTPUT0"), array)


@pytest.mark.parametrize("datatype, field, words", [
    ("FP16", "fp32_contents", "raw_input_contents"),  # FP16 has no typed field
    ("INT32", "fp32_contents", "int_contents"),  # the wrong field for the datatype
    ("INT8", "int_contents", "range of INT8"),  # a value past the datatype's range
])
def test_bad_typed_contents_are_invalid(stub: service_pb2_grpc.GRPCInferenceServiceStub, datatype: str, field: str,
                                        words: str) -> None:
    array = np.array([[1.0, 2.0]]) if datatype != "INT8" else np.array([[1, 300]])
    with pytest.raises(grpc.RpcError) as caught:
        stub.ModelInfer(typed_request(datatype, array, field), timeout=10)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert words in caught.value.details() and "INPUT0" in caught.value.details()


def test_a_large_request_passes_the_default_limit(client: grpcclient.InferenceServerClient) -> None:
    """8 MB, twice grpc's own 4 MiB default (500 candidates x 4 KB is 2 MB)."""
    array = np.arange(2 * 1_000_000, dtype=np.float32).reshape(2, 1_000_000)
    infer_input = grpcclient.InferInput("INPUT0", list(array.shape), "FP32").set_data_from_numpy(array)
    assert_same(client.infer("identity_fp32", [infer_input]).as_numpy("OUTPUT0"), array)


