"""The SageMaker Triton container's ways in, against one real server started as that container is configured
(a Triton repository of two models, SAGEMAKER_TRITON_* variables): V2 JSON as application/octet-stream and
binary+json;json-header-size through boto3 and the SageMaker SDK's Predictor, answers checked against
onnxruntime; application/x-npz and text/libsvm rows; what each variable did, or the warning saying why not."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from typing import Any

import numpy as np
import onnx
import pytest
import requests
import scipy.sparse
from onnx import TensorProto, helper, numpy_helper

from tests.onnx_models import add_sub_model, write_model
from tests.protocols.sagemaker_triton import (
    BINARY,
    OCTET_STREAM,
    binary_request,
    expected,
    parse_answer,
    predictor,
    v2_json,
)
from tests.protocols.test_sagemaker_server import runtime_client
from tests.server import ServerProcess

WIDTH = 6
ROWS = np.random.default_rng(3).standard_normal((3, WIDTH)).astype(np.float32)
ENVIRONMENT = {
    "SAGEMAKER_TRITON_DEFAULT_MODEL_NAME": "dense",  # two models served: /invocations runs this one
    "SAGEMAKER_TRITON_LOG_INFO": "false",  # the log starts at WARNING
    "SAGEMAKER_TRITON_THREAD_COUNT": "8",
    "SAGEMAKER_TRITON_SHM_DEFAULT_BYTE_SIZE": "33554432",
    "SAGEMAKER_TRITON_INFERENCE_TYPE": "generate",
    "TS_CONFIG_FILE": "/opt/ml/model/config.properties",
}


def dense_model() -> onnx.ModelProto:
    """INPUT0 FP32 [batch, WIDTH] -> OUTPUT0 = INPUT0 @ W + B, [batch, 3]."""
    rng = np.random.default_rng(11)
    weights = numpy_helper.from_array(rng.standard_normal((WIDTH, 3)).astype(np.float32), "W")
    bias = numpy_helper.from_array(rng.standard_normal(3).astype(np.float32), "B")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["INPUT0", "W"], ["product"]), helper.make_node("Add", ["product", "B"],
                                                                                     ["OUTPUT0"])], "dense",
        [helper.make_tensor_value_info("INPUT0", TensorProto.FLOAT, ["batch", WIDTH])],
        [helper.make_tensor_value_info("OUTPUT0", TensorProto.FLOAT, ["batch", 3])], initializer=[weights, bias])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


DENSE = dense_model()


@pytest.fixture(scope="module")
def triton(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("opt_ml_model")
    write_model(root, "dense", DENSE, None)
    write_model(root, "pair", add_sub_model(), None)
    server = ServerProcess(root, cache_dir=tmp_path_factory.mktemp("cache"), env=ENVIRONMENT)
    server.wait_ready(path=server.sagemaker + "/ping")
    yield server
    server.stop()


def post(server: ServerProcess, body: bytes, content_type: str, model: str = "") -> requests.Response:
    headers = {"Content-Type": content_type}
    if model:
        headers["X-Amzn-SageMaker-Custom-Attributes"] = f"tfs-model-name={model}"
    return requests.post(server.sagemaker + "/invocations", data=body, headers=headers, timeout=30)


def test_boto3_octet_stream_v2_json_runs_the_default_model(triton: ServerProcess) -> None:
    answer = runtime_client(triton).invoke_endpoint(EndpointName="triton", ContentType=OCTET_STREAM,
                                                    Body=v2_json({"INPUT0": ROWS}))
    assert answer["ContentType"] == "application/json"
    result = parse_answer(answer["Body"].read(), answer["ContentType"])
    np.testing.assert_allclose(result.as_numpy("OUTPUT0"), expected(DENSE, {"INPUT0": ROWS})["OUTPUT0"], rtol=1e-5)
    assert result.get_response()["model_name"] == "dense"


def test_boto3_binary_json_answers_binary_where_asked(triton: ServerProcess) -> None:
    client = runtime_client(triton)
    want = expected(DENSE, {"INPUT0": ROWS})["OUTPUT0"]
    for outputs, answer_type in ((None, f"{BINARY};json-header-size="), ({"OUTPUT0": False}, "application/json")):
        body, content_type = binary_request({"INPUT0": ROWS}, outputs)
        answer = client.invoke_endpoint(EndpointName="triton", ContentType=content_type, Body=body)
        assert answer["ContentType"].startswith(answer_type)
        np.testing.assert_array_equal(parse_answer(answer["Body"].read(), answer["ContentType"]).as_numpy("OUTPUT0"),
                                      want)
    # As the container does (Triton's qa/L0_sagemaker): a V2 body sent as application/json asking for binary outputs.
    body, _ = binary_request({"INPUT0": ROWS}, binary_inputs=False)
    answer = client.invoke_endpoint(EndpointName="triton", ContentType="application/json", Body=body)
    assert answer["ContentType"].startswith(f"{BINARY};json-header-size=")
    np.testing.assert_array_equal(parse_answer(answer["Body"].read(), answer["ContentType"]).as_numpy("OUTPUT0"), want)


def test_predictor_sends_both_triton_types(triton: ServerProcess) -> None:
    sdk = predictor(runtime_client(triton))
    want = expected(DENSE, {"INPUT0": ROWS})["OUTPUT0"]
    answer = sdk.predict(v2_json({"INPUT0": ROWS}))  # IdentitySerializer: application/octet-stream
    np.testing.assert_allclose(parse_answer(answer, "application/json").as_numpy("OUTPUT0"), want, rtol=1e-5)
    body, content_type = binary_request({"INPUT0": ROWS}, {"OUTPUT0": True})
    header = json.loads(body[:int(content_type.rsplit("=", 1)[1])])
    answer = sdk.predict(body, initial_args={"ContentType": content_type})
    assert header["outputs"] == [{"name": "OUTPUT0", "parameters": {"binary_data": True}}]
    length = answer.index(b"}]}") + 3  # the JSON header; BytesDeserializer drops the Content-Type
    np.testing.assert_array_equal(parse_answer(answer, f"{BINARY};json-header-size={length}").as_numpy("OUTPUT0"),
                                  want)


def test_two_binary_inputs_to_a_model_chosen_by_custom_attributes(triton: ServerProcess) -> None:
    pair = {"INPUT0": np.arange(32, dtype=np.float32).reshape(2, 16), "INPUT1": np.ones((2, 16), np.float32)}
    body, content_type = binary_request(pair, {"OUTPUT0": False, "OUTPUT1": True})
    answer = runtime_client(triton).invoke_endpoint(EndpointName="triton", ContentType=content_type, Body=body,
                                                    CustomAttributes="tfs-model-name=pair")
    result = parse_answer(answer["Body"].read(), answer["ContentType"])
    want = expected(add_sub_model(), pair)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), want["OUTPUT0"])  # JSON: not asked for as binary
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), want["OUTPUT1"])


@pytest.mark.parametrize(("parameter", "problem"), [
    ("json-header-size=100000", "outside the request body"), ("json-header-size=ten", "got 'ten'"),
    ("json-header-size=-4", "got '-4'"), ("json-header-size=0", "outside the request body"),
    ("charset=utf-8", "needs the parameter json-header-size"),
])
def test_a_bad_json_header_size_is_a_400_naming_it(triton: ServerProcess, parameter: str, problem: str) -> None:
    body, _ = binary_request({"INPUT0": ROWS})
    response = post(triton, body, f"{BINARY};{parameter}")
    assert response.status_code == 400 and "json-header-size" in response.json()["error"], response.text
    assert problem in response.json()["error"]


def test_the_runtime_api_shows_the_header_size_error_and_the_core_checks_the_v2_body(triton: ServerProcess) -> None:
    client = runtime_client(triton)
    with pytest.raises(client.exceptions.ModelError) as refused:
        client.invoke_endpoint(EndpointName="triton", ContentType=f"{BINARY};json-header-size=x", Body=b"{}")
    assert refused.value.response["OriginalStatusCode"] == 400
    assert "json-header-size" in refused.value.response["OriginalMessage"]
    response = post(triton, v2_json({"INPUT0": np.ones((1, WIDTH + 1), np.float32)}), OCTET_STREAM)
    assert response.status_code == 400 and "INPUT0" in response.json()["error"], response.text


def sparse_rows() -> scipy.sparse.csr_matrix:
    return scipy.sparse.csr_matrix(np.where(np.abs(ROWS) > 0.8, ROWS, 0))


def test_npz_from_the_sdk_and_libsvm_fill_the_dense_input(triton: ServerProcess) -> None:
    from sagemaker.deserializers import JSONDeserializer
    from sagemaker.serializers import SparseMatrixSerializer

    sparse = sparse_rows()
    want = expected(DENSE, {"INPUT0": sparse.toarray()})["OUTPUT0"]
    sdk = predictor(runtime_client(triton))
    sdk.serializer, sdk.deserializer = SparseMatrixSerializer(), JSONDeserializer()
    np.testing.assert_allclose(sdk.predict(sparse.tocsc())["predictions"], want, rtol=1e-5)
    lines = ["0 " + " ".join(f"{c}:{v!r}" for c, v in zip(row.indices, row.data.tolist())) for row in sparse]
    response = post(triton, "\n".join(lines).encode(), "text/libsvm")
    assert response.status_code == 200, response.text
    np.testing.assert_allclose(response.json()["predictions"], want, rtol=1e-5)


def npz(matrix: Any) -> bytes:
    buffer = io.BytesIO()
    scipy.sparse.save_npz(buffer, matrix)
    return buffer.getvalue()


def test_sparse_payloads_a_model_cannot_take_are_415_listing_what_it_accepts(triton: ServerProcess) -> None:
    response = post(triton, npz(sparse_rows()), "application/x-npz", model="pair")
    assert response.status_code == 415
    message = response.json()["error"]
    assert "'INPUT1' FP32" in message and OCTET_STREAM in message and BINARY in message
    assert "text/csv" not in message.split("accepts:")[1] and "text/libsvm" not in message.split("accepts:")[1]
    narrow = post(triton, npz(scipy.sparse.csr_matrix(np.ones((1, WIDTH + 2), np.float32))), "application/x-npz")
    assert narrow.status_code == 400 and f"takes {WIDTH} per row" in narrow.json()["error"]
    outside = post(triton, f"1 {WIDTH}:1.0".encode(), "text/libsvm")
    assert outside.status_code == 400 and f"feature index {WIDTH}" in outside.json()["error"]
    assert post(triton, b"PK\x03\x04 not a zip", "application/x-npz").status_code == 400


def test_each_variable_took_effect_or_was_named_at_start(triton: ServerProcess) -> None:
    log = triton.printed
    assert " INFO " not in log, log  # SAGEMAKER_TRITON_LOG_INFO=false
    for name in ("SAGEMAKER_TRITON_THREAD_COUNT", "SAGEMAKER_TRITON_SHM_DEFAULT_BYTE_SIZE",
                 "SAGEMAKER_TRITON_INFERENCE_TYPE=generate", "TS_CONFIG_FILE"):
        assert f"{name} is set but not used: " in log, name
    assert "SAGEMAKER_TRITON_DEFAULT_MODEL_NAME" not in log  # it had its effect: the other tests ran "dense"
