"""TF Serving's REST and gRPC APIs end to end: one server for the module, TF Serving's official client stubs
(`tensorflow-serving-api`) over gRPC and `requests` over REST, on a SavedModel in TF Serving's own layout with
predict, classify and regress signatures (tests/protocols/tfserving_models.py) and on an ONNX and a Python model,
which TF Serving itself cannot serve. Answers are checked against the SavedModel's arithmetic."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import requests

pytest.importorskip("tensorflow_serving")

import grpc  # noqa: E402
import tensorflow as tf  # noqa: E402
from tensorflow.core.example import example_pb2, feature_pb2  # noqa: E402
from tensorflow.core.framework import tensor_pb2, tensor_shape_pb2, types_pb2  # noqa: E402
from tensorflow_serving.apis import (  # noqa: E402
    classification_pb2,
    get_model_metadata_pb2,
    get_model_status_pb2,
    inference_pb2,
    model_service_pb2_grpc,
    predict_pb2,
    prediction_log_pb2,
    prediction_service_pb2_grpc,
    regression_pb2,
)

from tests.backends.test_torch_server import AFFINE_CONFIG, Affine, torch_run  # noqa: E402
from tests.backends.test_torch_server import write as write_torch  # noqa: E402
from tests.onnx_models import ADD_SUB_CONFIG, add_sub_model, write_model  # noqa: E402
from tests.protocols.tfserving_models import WEIGHTS, expected_scores, expected_y, save_recommender  # noqa: E402
from tests.server import ServerProcess  # noqa: E402

# A Python model behind TF Serving's API: its config's [1] dims reshaped to [] are [batch]-shaped tensors.
PY_STRINGS_CONFIG = """
backend: "python"
max_batch_size: 8
input [ { name: "text" data_type: TYPE_STRING dims: [ 1 ] reshape: { shape: [ ] } } ]
output [
  { name: "length" data_type: TYPE_INT32 dims: [ 1 ] reshape: { shape: [ ] } },
  { name: "shout" data_type: TYPE_STRING dims: [ 1 ] reshape: { shape: [ ] } }
]
"""
PY_STRINGS = """
import numpy as np

class Model:
    def execute(self, inputs):
        text = inputs["text"]
        return {"length": np.array([len(t) for t in text], np.int32),
                "shout": np.array([t.upper() + b"!" for t in text], dtype=object)}
"""


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    repository = tmp_path_factory.mktemp("tfs-repository")
    write_warmup_requests(save_recommender(repository / "recommender" / "1"))
    write_model(repository, "add_sub", add_sub_model(), ADD_SUB_CONFIG)
    write_torch(repository, "affine", AFFINE_CONFIG, Affine())
    (repository / "py_strings" / "1").mkdir(parents=True)
    (repository / "py_strings" / "config.pbtxt").write_text(PY_STRINGS_CONFIG)
    (repository / "py_strings" / "1" / "model.py").write_text(PY_STRINGS)
    # A warmup record that cannot run (an input the signature lacks): that version never serves.
    save_recommender(repository / "broken_warmup" / "1")
    write_warmup_requests(repository / "broken_warmup" / "1", input_name="nope")
    return repository


@pytest.fixture(scope="module")
def server(repository: Path) -> Iterator[ServerProcess]:
    server = ServerProcess(repository).wait_ready(timeout=120)
    yield server
    server.stop()


def write_warmup_requests(version_dir: Path, input_name: str = "x") -> None:
    """assets.extra/tf_serving_warmup_requests as TF Serving's docs write it: tf.io.TFRecordWriter and
    PredictionLog records (a predict log, and a classify log for the "classify" signature)."""
    (version_dir / "assets.extra").mkdir()
    predict = predict_pb2.PredictRequest()
    predict.model_spec.name = "recommender"
    predict.inputs[input_name].CopyFrom(tf.make_tensor_proto(np.ones(3, np.float32)))
    classify = classification_pb2.ClassificationRequest()
    classify.model_spec.signature_name = "classify"
    classify.input.example_list.examples.extend([example(f=1.0)])
    with tf.io.TFRecordWriter(str(version_dir / "assets.extra" / "tf_serving_warmup_requests")) as writer:
        writer.write(prediction_log_pb2.PredictionLog(
            predict_log=prediction_log_pb2.PredictLog(request=predict)).SerializeToString())
        writer.write(prediction_log_pb2.PredictionLog(
            classify_log=prediction_log_pb2.ClassifyLog(request=classify)).SerializeToString())


@pytest.fixture(scope="module")
def channel(server: ServerProcess) -> Iterator[grpc.Channel]:
    with grpc.insecure_channel(server.grpc_url) as channel:
        yield channel


@pytest.fixture(scope="module")
def stub(channel: grpc.Channel) -> prediction_service_pb2_grpc.PredictionServiceStub:
    return prediction_service_pb2_grpc.PredictionServiceStub(channel)


def post(server: ServerProcess, path: str, body: Any) -> requests.Response:
    return requests.post(f"{server.base}{path}", json=body, timeout=30)


def error_of(response: requests.Response, status: int) -> str:
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/json"
    return str(response.json()["error"])


def rpc_error(call: Any, code: grpc.StatusCode) -> str:
    with pytest.raises(grpc.RpcError) as info:
        call()
    assert info.value.code() == code, info.value.details()
    return str(info.value.details())


def example(**features: Any) -> example_pb2.Example:
    result = example_pb2.Example()
    for name, value in features.items():
        if isinstance(value, float):
            result.features.feature[name].CopyFrom(feature_pb2.Feature(float_list=feature_pb2.FloatList(value=[value])))
        else:
            result.features.feature[name].CopyFrom(feature_pb2.Feature(int64_list=feature_pb2.Int64List(value=[value])))
    return result


# warmup


def test_warmup_requests_are_replayed_before_the_version_serves(server: ServerProcess) -> None:
    assert "model recommender:1: 2 warmup run(s)" in server.printed


def test_a_warmup_request_that_fails_keeps_the_version_from_serving(server: ServerProcess) -> None:
    (status,) = requests.get(f"{server.base}/v1/models/broken_warmup", timeout=10).json()["model_version_status"]
    assert (status["version"], status["state"], status["status"]["error_code"]) == ("1", "END", "UNKNOWN")
    assert "assets.extra/tf_serving_warmup_requests record 1" in status["status"]["error_message"]
    assert "'nope'" in status["status"]["error_message"]


# REST: status and metadata


def test_rest_status_lists_the_available_version(server: ServerProcess) -> None:
    expected = {"model_version_status": [
        {"version": "1", "state": "AVAILABLE", "status": {"error_code": "OK", "error_message": ""}}]}
    assert requests.get(f"{server.base}/v1/models/recommender", timeout=10).json() == expected
    assert requests.get(f"{server.base}/v1/models/recommender/versions/1", timeout=10).json() == expected


def test_rest_status_errors(server: ServerProcess) -> None:
    assert error_of(requests.get(f"{server.base}/v1/models/nope", timeout=10), 404) == (
        "Could not find any versions of model nope")
    assert error_of(requests.get(f"{server.base}/v1/models/recommender/versions/7", timeout=10), 404) == (
        "Could not find version 7 of model recommender")
    assert error_of(requests.get(f"{server.base}/v1/models/recommender/labels/stable", timeout=10), 400) == (
        "Unrecognized servable version label: stable")
    assert error_of(requests.get(f"{server.base}/v1/models", timeout=10), 400) == "Missing model name in request."


def test_rest_metadata_is_the_signature_def_map(server: ServerProcess) -> None:
    document = requests.get(f"{server.base}/v1/models/recommender/metadata", timeout=10).json()
    assert document["model_spec"] == {"name": "recommender", "signature_name": "", "version": "1"}
    signatures = document["metadata"]["signature_def"]["signature_def"]
    assert set(signatures) == {"serving_default", "dense", "pair", "strings", "classify", "regress"}
    assert signatures["classify"]["method_name"] == "tensorflow/serving/classify"
    assert signatures["regress"]["method_name"] == "tensorflow/serving/regress"
    dense = signatures["dense"]
    assert dense["method_name"] == "tensorflow/serving/predict"
    assert dense["inputs"]["features"] == {
        "name": "features", "dtype": "DT_FLOAT",
        "tensor_shape": {"dim": [{"size": "-1", "name": ""}, {"size": "3", "name": ""}], "unknown_rank": False}}
    assert signatures["strings"]["outputs"]["upper"]["dtype"] == "DT_STRING"
    assert signatures["serving_default"]["inputs"]["x"]["tensor_shape"]["dim"] == [{"size": "-1", "name": ""}]


def test_rest_metadata_of_an_onnx_model_is_one_predict_signature(server: ServerProcess) -> None:
    document = requests.get(f"{server.base}/v1/models/add_sub/versions/1/metadata", timeout=10).json()
    (name, signature), = document["metadata"]["signature_def"]["signature_def"].items()
    assert name == "serving_default" and signature["method_name"] == "tensorflow/serving/predict"
    assert sorted(signature["inputs"]) == ["INPUT0", "INPUT1"]
    assert signature["outputs"]["OUTPUT0"]["tensor_shape"]["dim"] == [{"size": "-1", "name": ""},
                                                                      {"size": "16", "name": ""}]


# REST: predict


def test_rest_predict_takes_scalars_per_instance_as_in_tf_servings_readme(server: ServerProcess) -> None:
    response = post(server, "/v1/models/recommender:predict", {"instances": [1.0, 2.0, 5.0]})
    assert response.json() == {"predictions": [3.0, 5.0, 11.0]}
    columnar = post(server, "/v1/models/recommender/versions/1:predict", {"inputs": {"x": [0.5, -1.0]}})
    assert columnar.json() == {"outputs": [2.0, -1.0]}


def test_rest_predict_500_rows_with_no_batch_cap(server: ServerProcess) -> None:
    x = np.linspace(-3, 3, 500, dtype=np.float32)
    response = post(server, "/v1/models/recommender:predict", {"instances": x.tolist()})
    assert response.status_code == 200, response.text
    np.testing.assert_allclose(response.json()["predictions"], expected_y(x), rtol=1e-6)


def test_rest_predict_by_signature_name_with_several_outputs(server: ServerProcess) -> None:
    features = np.array([[1.0, 2.0, 3.0], [0.0, -1.0, 4.0]], np.float32)
    rows = post(server, "/v1/models/recommender:predict",
                {"signature_name": "dense", "instances": features.tolist()}).json()["predictions"]
    # A [batch] output gives one bare number per row, a [batch, 2] one a list.
    assert rows == [{"scores": pytest.approx(list(r @ WEIGHTS)), "total": pytest.approx(float(r.sum()))}
                    for r in features]
    columns = post(server, "/v1/models/recommender:predict",
                   {"signature_name": "dense", "inputs": {"features": features.tolist()}}).json()["outputs"]
    np.testing.assert_allclose(columns["scores"], features @ WEIGHTS, rtol=1e-6)
    np.testing.assert_allclose(columns["total"], features.sum(axis=1), rtol=1e-6)


def test_rest_predict_several_inputs_as_objects_per_instance(server: ServerProcess) -> None:
    instances = [{"ids": [1, 2], "weight": 0.5}, {"ids": [3, 4], "weight": 2.0}]
    response = post(server, "/v1/models/recommender:predict", {"signature_name": "pair", "instances": instances})
    assert response.json() == {"predictions": [[0.5, 1.0], [6.0, 8.0]]}


def test_rest_predict_strings_and_b64(server: ServerProcess) -> None:
    raw = b"\xff\x00binary"
    body = {"signature_name": "strings", "instances": ["tf", {"b64": base64.b64encode(raw).decode()}]}
    rows = post(server, "/v1/models/recommender:predict", body).json()["predictions"]
    assert rows[0] == {"upper": "TF", "length": 2}
    assert rows[1]["length"] == len(raw)
    assert base64.b64decode(rows[1]["upper"]["b64"]) == raw.upper()  # not UTF-8: base64, as TF Serving writes it


def test_rest_predict_onnx_model(server: ServerProcess) -> None:
    a = np.arange(32, dtype=np.float32).reshape(2, 16)
    b = np.ones((2, 16), np.float32)
    response = post(server, "/v1/models/add_sub:predict", {"inputs": {"INPUT0": a.tolist(), "INPUT1": b.tolist()}})
    outputs = response.json()["outputs"]
    np.testing.assert_array_equal(outputs["OUTPUT0"], a + b)
    np.testing.assert_array_equal(outputs["OUTPUT1"], a - b)


def test_rest_predict_python_model_one_string_per_instance(server: ServerProcess) -> None:
    response = post(server, "/v1/models/py_strings:predict", {"instances": ["ab", "tf serving"]})
    assert response.json() == {"predictions": [{"length": 2, "shout": "AB!"}, {"length": 10, "shout": "TF SERVING!"}]}
    metadata = requests.get(f"{server.base}/v1/models/py_strings/metadata", timeout=10).json()
    text = metadata["metadata"]["signature_def"]["signature_def"]["serving_default"]["inputs"]["text"]
    assert (text["dtype"], text["tensor_shape"]["dim"]) == ("DT_STRING", [{"size": "-1", "name": ""}])


@pytest.mark.parametrize("body, message", [
    ({"signature_name": "nope", "instances": [1.0]}, 'Serving signature name: "nope" not found in signature def'),
    ({"instances": [1.0], "inputs": [1.0]}, "exactly one of 'instances'"),
    ({"instances": [[1.0, 2.0]]}, "instances[0]: input 'x' has shape [2], but the model expects []"),
    ({"instances": ["a"]}, "'x'"),
    ({"signature_name": "pair", "instances": [{"ids": [1, 2]}]}, "missing input(s) 'weight'"),
])
def test_rest_predict_bad_requests_are_400_naming_the_problem(server: ServerProcess, body: Any, message: str) -> None:
    assert message in error_of(post(server, "/v1/models/recommender:predict", body), 400)


def test_rest_predict_unknown_model_is_404(server: ServerProcess) -> None:
    assert "nope" in error_of(post(server, "/v1/models/nope:predict", {"instances": [1.0]}), 404)


# REST: classify and regress


def test_rest_classify_answers_label_score_pairs(server: ServerProcess) -> None:
    body = {"signature_name": "classify", "examples": [{"f": 0.0}, {"f": 2.0}]}
    results = post(server, "/v1/models/recommender:classify", body).json()["results"]
    for f, row in zip((0.0, 2.0), results):
        assert [label for label, _ in row] == ["neg", "pos"]
        assert [score for _, score in row] == pytest.approx(expected_scores(f), rel=1e-6)


def test_rest_regress_with_context_merges_its_features(server: ServerProcess) -> None:
    body = {"signature_name": "regress", "context": {"k": 10}, "examples": [{"f": 1.0}, {"f": 2.0, "k": 1}]}
    assert post(server, "/v1/models/recommender:regress", body).json() == {"results": [13.0, 7.0]}


def test_rest_classify_on_a_predict_signature_is_400(server: ServerProcess) -> None:
    message = error_of(post(server, "/v1/models/recommender:classify", {"examples": [{"f": 1.0}]}), 400)
    assert message.startswith("Expected classification signature method_name to be tensorflow/serving/classify. "
                              "Was: tensorflow/serving/predict")


def test_rest_classify_bad_examples_are_400(server: ServerProcess) -> None:
    assert "mixes" in error_of(post(server, "/v1/models/recommender:classify",
                                    {"signature_name": "classify", "examples": [{"f": [1.0, "a"]}]}), 400)
    assert "'examples'" in error_of(post(server, "/v1/models/recommender:classify", {"instances": []}), 400)


# gRPC: Predict


def test_grpc_predict_with_make_tensor_proto(stub: Any) -> None:
    x = np.linspace(-1, 1, 500, dtype=np.float32)
    request = predict_pb2.PredictRequest()
    request.model_spec.name = "recommender"
    request.inputs["x"].CopyFrom(tf.make_tensor_proto(x))  # tensor_content
    response = stub.Predict(request, timeout=30)
    assert response.model_spec.name == "recommender"
    assert response.model_spec.version.value == 1
    assert response.model_spec.signature_name == "serving_default"
    assert len(response.outputs["y"].float_val) == 500  # typed values, as TF Serving answers by default
    np.testing.assert_allclose(tf.make_ndarray(response.outputs["y"]), expected_y(x), rtol=1e-6)


def test_grpc_predict_typed_fields_signature_and_output_filter(stub: Any) -> None:
    request = predict_pb2.PredictRequest()
    request.model_spec.name = "recommender"
    request.model_spec.signature_name = "dense"
    request.model_spec.version.value = 1
    tensor = request.inputs["features"]
    tensor.dtype = types_pb2.DT_FLOAT
    tensor.tensor_shape.dim.extend([tensor_shape_pb2.TensorShapeProto.Dim(size=2),
                                    tensor_shape_pb2.TensorShapeProto.Dim(size=3)])
    tensor.float_val.extend([1, 2, 3, 4, 5, 6])
    request.output_filter.append("total")
    response = stub.Predict(request, timeout=30)
    assert list(response.outputs) == ["total"]
    assert list(response.outputs["total"].float_val) == [6.0, 15.0]
    assert response.model_spec.signature_name == "dense"


def test_grpc_predict_strings(stub: Any) -> None:
    request = predict_pb2.PredictRequest()
    request.model_spec.name = "recommender"
    request.model_spec.signature_name = "strings"
    request.inputs["s"].CopyFrom(tf.make_tensor_proto([b"ab", b"\xffc"]))
    response = stub.Predict(request, timeout=30)
    assert list(response.outputs["upper"].string_val) == [b"AB", b"\xffC"]
    assert list(response.outputs["length"].int_val) == [2, 2]


def test_grpc_predict_onnx_model(stub: Any) -> None:
    a = np.arange(48, dtype=np.float32).reshape(3, 16)
    request = predict_pb2.PredictRequest()
    request.model_spec.name = "add_sub"
    request.inputs["INPUT0"].CopyFrom(tf.make_tensor_proto(a))
    request.inputs["INPUT1"].CopyFrom(tf.make_tensor_proto(a))
    response = stub.Predict(request, timeout=30)
    np.testing.assert_array_equal(tf.make_ndarray(response.outputs["OUTPUT0"]), a * 2)
    np.testing.assert_array_equal(tf.make_ndarray(response.outputs["OUTPUT1"]), np.zeros_like(a))


def test_torchscript_model_over_rest_rows_and_grpc(stub: Any, server: ServerProcess, repository: Path) -> None:
    features = np.arange(12, dtype=np.float32).reshape(3, 4) / 10
    shift = np.ones((3, 2), np.float32)
    expected = torch_run(repository / "affine" / "1" / "model.pt", features, shift)
    rows = [{"features": f.tolist(), "shift": b.tolist()} for f, b in zip(features, shift)]
    predictions = post(server, "/v1/models/affine:predict", {"instances": rows}).json()["predictions"]
    np.testing.assert_allclose(predictions, expected, rtol=1e-6)
    request = predict_pb2.PredictRequest()
    request.model_spec.name = "affine"
    request.inputs["features"].CopyFrom(tf.make_tensor_proto(features))
    request.inputs["shift"].CopyFrom(tf.make_tensor_proto(shift))
    np.testing.assert_allclose(tf.make_ndarray(stub.Predict(request, timeout=30).outputs["scores"]), expected,
                               rtol=1e-6)


def test_grpc_predict_python_model(stub: Any) -> None:
    request = predict_pb2.PredictRequest()
    request.model_spec.name = "py_strings"
    request.inputs["text"].CopyFrom(tf.make_tensor_proto([b"x", b"\xffy"]))
    request.output_filter.append("shout")
    response = stub.Predict(request, timeout=30)
    assert list(response.outputs) == ["shout"] and list(response.outputs["shout"].string_val) == [b"X!", b"\xffY!"]
    assert [d.size for d in response.outputs["shout"].tensor_shape.dim] == [2]


def _predict(name: str = "recommender", signature: str = "", **inputs: tensor_pb2.TensorProto) -> Any:
    request = predict_pb2.PredictRequest()
    request.model_spec.name = name
    request.model_spec.signature_name = signature
    for key, tensor in inputs.items():
        request.inputs[key].CopyFrom(tensor)
    return request


def test_grpc_predict_errors_have_tf_servings_codes(stub: Any) -> None:
    x = tf.make_tensor_proto(np.ones(2, np.float32))
    assert rpc_error(lambda: stub.Predict(_predict(signature="nope", x=x)), grpc.StatusCode.FAILED_PRECONDITION) == (
        'Serving signature key "nope" not found.')
    assert "nope" in rpc_error(lambda: stub.Predict(_predict("nope", x=x)), grpc.StatusCode.NOT_FOUND)
    wrong_dtype = tf.make_tensor_proto(np.ones(2, np.int32))
    assert "inputs['x'] is DT_INT32, but the model's input 'x' is DT_FLOAT" in rpc_error(
        lambda: stub.Predict(_predict(x=wrong_dtype)), grpc.StatusCode.INVALID_ARGUMENT)
    wrong_shape = tf.make_tensor_proto(np.ones((2, 2), np.float32))
    assert "'x'" in rpc_error(lambda: stub.Predict(_predict(x=wrong_shape)), grpc.StatusCode.INVALID_ARGUMENT)
    assert "missing input(s) 'weight'" in rpc_error(
        lambda: stub.Predict(_predict(signature="pair", ids=tf.make_tensor_proto(np.ones((1, 2), np.int64)))),
        grpc.StatusCode.INVALID_ARGUMENT)
    lying = tf.make_tensor_proto(np.ones(4, np.float32))
    lying.tensor_shape.dim[0].size = 1000
    assert "inputs['x'] has 16 bytes of tensor_content, but shape [1000] of DT_FLOAT needs 4000" in rpc_error(
        lambda: stub.Predict(_predict(x=lying)), grpc.StatusCode.INVALID_ARGUMENT)
    bad_filter = _predict(x=x)
    bad_filter.output_filter.append("z")
    assert "output tensor alias not found in signature: z" in rpc_error(
        lambda: stub.Predict(bad_filter), grpc.StatusCode.INVALID_ARGUMENT)


# gRPC: Classify, Regress, MultiInference


def test_grpc_classify(stub: Any) -> None:
    request = classification_pb2.ClassificationRequest()
    request.model_spec.name = "recommender"
    request.model_spec.signature_name = "classify"
    request.input.example_list.examples.extend([example(f=-1.0), example(f=3.0)])
    response = stub.Classify(request, timeout=30)
    assert response.model_spec.version.value == 1 and response.model_spec.signature_name == "classify"
    for f, classifications in zip((-1.0, 3.0), response.result.classifications):
        assert [c.label for c in classifications.classes] == ["neg", "pos"]
        assert [c.score for c in classifications.classes] == pytest.approx(expected_scores(f), rel=1e-6)


def test_grpc_regress_with_context(stub: Any) -> None:
    request = regression_pb2.RegressionRequest()
    request.model_spec.name = "recommender"
    request.model_spec.signature_name = "regress"
    request.input.example_list_with_context.context.CopyFrom(example(k=5))
    request.input.example_list_with_context.examples.extend([example(f=1.0), example(f=0.5)])
    response = stub.Regress(request, timeout=30)
    assert [r.value for r in response.result.regressions] == [8.0, 6.5]


def test_grpc_multi_inference_runs_each_task_on_the_same_examples(stub: Any) -> None:
    request = inference_pb2.MultiInferenceRequest()
    for signature, method in (("classify", "tensorflow/serving/classify"), ("regress", "tensorflow/serving/regress")):
        task = request.tasks.add(method_name=method)
        task.model_spec.name = "recommender"
        task.model_spec.signature_name = signature
    request.input.example_list.examples.extend([example(f=1.0, k=2)])
    classified, regressed = stub.MultiInference(request, timeout=30).results
    assert classified.model_spec.signature_name == "classify"
    assert [c.label for c in classified.classification_result.classifications[0].classes] == ["neg", "pos"]
    assert [r.value for r in regressed.regression_result.regressions] == [5.0]


def test_grpc_classify_on_a_regress_signature_is_invalid_argument(stub: Any) -> None:
    request = classification_pb2.ClassificationRequest()
    request.model_spec.name = "recommender"
    request.model_spec.signature_name = "regress"
    request.input.example_list.examples.extend([example(f=1.0)])
    assert "Was: tensorflow/serving/regress" in rpc_error(lambda: stub.Classify(request),
                                                          grpc.StatusCode.INVALID_ARGUMENT)


# gRPC: metadata and status


def test_grpc_get_model_metadata_packs_the_signature_def_map(stub: Any) -> None:
    request = get_model_metadata_pb2.GetModelMetadataRequest(metadata_field=["signature_def"])
    request.model_spec.name = "recommender"
    response = stub.GetModelMetadata(request, timeout=30)
    assert response.model_spec.name == "recommender" and response.model_spec.version.value == 1
    signature_defs = get_model_metadata_pb2.SignatureDefMap()
    assert response.metadata["signature_def"].Unpack(signature_defs)  # TF Serving's type URL
    pair = signature_defs.signature_def["pair"]
    assert pair.method_name == "tensorflow/serving/predict"
    assert pair.inputs["ids"].dtype == types_pb2.DT_INT64
    assert [d.size for d in pair.inputs["ids"].tensor_shape.dim] == [-1, 2]
    request.metadata_field[:] = ["other"]
    assert rpc_error(lambda: stub.GetModelMetadata(request), grpc.StatusCode.INVALID_ARGUMENT) == (
        "Metadata field other is not supported")


def test_grpc_get_model_status(channel: grpc.Channel) -> None:
    models = model_service_pb2_grpc.ModelServiceStub(channel)
    request = get_model_status_pb2.GetModelStatusRequest()
    request.model_spec.name = "recommender"
    (status,) = models.GetModelStatus(request, timeout=30).model_version_status
    assert (status.version, status.state, status.status.error_code) == (
        1, get_model_status_pb2.ModelVersionStatus.AVAILABLE, 0)
    request.model_spec.name = "nope"
    assert rpc_error(lambda: models.GetModelStatus(request), grpc.StatusCode.NOT_FOUND) == (
        "Could not find any versions of model nope")



def test_sagemaker_endpoint_serves_a_tf_serving_layout_savedmodel_with_no_batch_cap(tmp_path: Path) -> None:
    # SageMaker's /opt/ml/model as the TF Serving container gets it: <version>/saved_model.pb, no config.
    save_recommender(tmp_path / "1")
    endpoint = ServerProcess(tmp_path).wait_ready(timeout=120)
    try:
        endpoint.wait_ready(path=endpoint.sagemaker + "/ping")
        x = np.linspace(0, 1, 500, dtype=np.float32)
        response = requests.post(endpoint.sagemaker + "/invocations", json={"instances": x.tolist()}, timeout=30)
        assert response.status_code == 200, response.text
        np.testing.assert_allclose(response.json()["predictions"], expected_y(x), rtol=1e-6)
    finally:
        endpoint.stop()
