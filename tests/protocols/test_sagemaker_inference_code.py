"""A model's code/inference.py through a real server: both conventions, errors, and inside an MME archive."""

from __future__ import annotations

import textwrap
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import orjson
import requests

from tests.archives import weighted_model, write_archive
from tests.onnx_models import scale_model
from tests.protocols.test_sagemaker_server import runtime_client
from tests.server import ServerProcess

TOOLKIT = '''
import json

import numpy as np


def input_fn(input_data, content_type, context):
    assert context.request_content_type == content_type
    return np.array(json.loads(input_data)["values"], dtype=np.float32)


def output_fn(prediction, accept, context):
    if context.custom_attributes:  # the response's CustomAttributes, as TorchServe's context sets headers
        context.set_response_header(0, "X-Amzn-SageMaker-Custom-Attributes", "echo:" + context.custom_attributes)
    return json.dumps({"scores": prediction.ravel().tolist()}), "application/vnd.scores+json"
'''

TFS_HANDLER = '''
import json

import requests


def handler(data, context):
    if context.request_content_type != "application/json":
        raise ValueError("only JSON, got " + context.request_content_type)
    rows = json.loads(data.read().decode())["rows"]
    answer = requests.post(context.rest_uri, data=json.dumps({"instances": rows}), timeout=10)
    predictions = answer.json()["predictions"]
    return json.dumps({"model": context.model_name, "sums": [sum(p) for p in predictions]}), "application/json"
'''

TFS_PAIR = '''
import json


def input_handler(data, context):
    return json.dumps({"instances": [[float(v) for v in data.read().decode().split()]]})


def output_handler(response, context):
    if response.status_code != 200:
        raise ValueError(response.content.decode())
    return " ".join(str(v) for v in response.json()["predictions"][0]), "text/plain"
'''


# The TF Serving container's gRPC fast path, as its published examples write it: a channel to context.grpc_port
# (or context.channel), a PredictRequest built with make_tensor_proto, the content type compared as sent.
TFS_GRPC = '''
import grpc
import numpy as np
import tensorflow as tf
from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc


def handler(data, context):
    if context.request_content_type != "application/X-npy-rows":
        raise ValueError("unexpected content type " + context.request_content_type)
    rows = np.frombuffer(data.read(), dtype=np.float32).reshape(-1, 4)
    request = predict_pb2.PredictRequest()
    request.model_spec.name = context.model_name
    request.model_spec.signature_name = "serving_default"
    request.inputs["INPUT0"].CopyFrom(tf.make_tensor_proto(rows))
    channel = grpc.insecure_channel(f"0.0.0.0:{context.grpc_port}")
    first = prediction_service_pb2_grpc.PredictionServiceStub(channel).Predict(request, 10.0)
    channel.close()
    again = prediction_service_pb2_grpc.PredictionServiceStub(context.channel).Predict(request, 10.0)
    assert first == again
    return tf.make_ndarray(first.outputs["OUTPUT0"]).astype(np.float32).tobytes(), "application/octet-stream"
'''


def opt_ml_model(root: Path, inference: str) -> Path:
    onnx.save_model(scale_model(2.0), str(root / "model.onnx"))
    (root / "code").mkdir()
    (root / "code" / "inference.py").write_text(textwrap.dedent(inference))
    return root


def start(start_server: Any, root: Path, *args: str) -> ServerProcess:
    server: ServerProcess = start_server(root, *args, ready_path="/v2/health/live")
    server.wait_ready(path=server.sagemaker + "/ping")
    return server


def post(server: ServerProcess, body: bytes, content_type: str = "application/json", **headers: str) -> Any:
    return requests.post(server.sagemaker + "/invocations", data=body,
                         headers={"Content-Type": content_type, **headers}, timeout=30)


def test_toolkit_input_and_output_fn_around_the_served_model(tmp_path: Path, start_server: Any) -> None:
    server = start(start_server, opt_ml_model(tmp_path, TOOLKIT))
    response = post(server, orjson.dumps({"values": [[1, 2, 3, 4]]}))
    assert response.status_code == 200, response.text
    assert response.headers["Content-Type"] == "application/vnd.scores+json"
    assert response.json() == {"scores": [2.0, 4.0, 6.0, 8.0]}
    broken = post(server, b"{}")
    assert broken.status_code == 500 and "input_fn" in broken.json()["error"] and "values" in broken.json()["error"]
    assert post(server, orjson.dumps({"values": [[0, 0, 0, 1]]})).json() == {"scores": [0.0, 0.0, 0.0, 2.0]}
    assert "X-Amzn-SageMaker-Custom-Attributes" not in response.headers

    # CustomAttributes both ways: the request's reach the handler's context, what it sets comes back, on
    # InvokeEndpoint and InvokeEndpointWithResponseStream (one part: inference.py answers once).
    client = runtime_client(server)
    body = orjson.dumps({"values": [[1, 2, 3, 4]]})
    answer = client.invoke_endpoint(EndpointName="local", Body=body, ContentType="application/json",
                                    CustomAttributes="trace=7")
    assert answer["CustomAttributes"] == "echo:trace=7" and answer["ContentType"] == "application/vnd.scores+json"
    streamed = client.invoke_endpoint_with_response_stream(EndpointName="local", Body=body,
                                                           ContentType="application/json", CustomAttributes="id=8")
    assert streamed["CustomAttributes"] == "echo:id=8"
    assert [orjson.loads(part["PayloadPart"]["Bytes"]) for part in streamed["Body"]] == [{"scores": [2, 4, 6, 8]}]


def test_tfs_handler_posts_to_the_rest_uri(tmp_path: Path, start_server: Any) -> None:
    server = start(start_server, opt_ml_model(tmp_path, TFS_HANDLER))
    response = post(server, orjson.dumps({"rows": [[1, 1, 1, 1], [1, 2, 3, 4]]}))
    assert response.status_code == 200, response.text
    assert response.json() == {"model": "model", "sums": [8.0, 20.0]}
    refused = post(server, b"1,2,3,4", "text/csv")
    assert refused.status_code == 500 and "only JSON, got text/csv" in refused.json()["error"]


def test_tfs_handler_calls_tf_servings_grpc_api_on_context_grpc_port(tmp_path: Path, start_server: Any) -> None:
    server = start(start_server, opt_ml_model(tmp_path, TFS_GRPC))
    rows = np.arange(12, dtype=np.float32).reshape(3, 4)
    response = post(server, rows.tobytes(), "application/X-npy-rows")
    assert response.status_code == 200, response.text
    np.testing.assert_array_equal(np.frombuffer(response.content, np.float32).reshape(3, 4), rows * 2)
    refused = post(server, rows.tobytes(), "application/x-npy-rows")  # as sent, not lower-cased
    assert refused.status_code == 500 and "unexpected content type application/x-npy-rows" in refused.json()["error"]


def test_tfs_input_and_output_handler_pair(tmp_path: Path, start_server: Any) -> None:
    server = start(start_server, opt_ml_model(tmp_path, TFS_PAIR))
    response = post(server, b"1 2 3 4", "text/plain")
    assert response.status_code == 200 and response.text == "2.0 4.0 6.0 8.0"
    assert response.headers["Content-Type"] == "text/plain"
    wrong_width = post(server, b"1 2 3", "text/plain")
    assert wrong_width.status_code == 500 and "output_handler" in wrong_width.json()["error"]


def test_broken_inference_py_keeps_ping_unready_and_says_why(tmp_path: Path) -> None:
    root = opt_ml_model(tmp_path, "def model_fn(model_dir):\n    raise RuntimeError('weights missing')\n")
    server = ServerProcess(root)
    try:
        server.wait_ready()  # the V2 endpoint turns ready once inference.py was tried
        assert requests.get(server.sagemaker + "/ping", timeout=5).status_code == 503
    finally:
        output = server.stop()
    assert "weights missing" in output


def test_inference_py_inside_a_multi_model_archive(tmp_path: Path, start_server: Any) -> None:
    model_path = tmp_path / "weighted.onnx"
    onnx.save_model(weighted_model(10.0, 4), str(model_path))
    members = {"model.onnx": model_path.read_bytes(), "code/inference.py": TOOLKIT.encode()}
    write_archive(tmp_path / "with-code.tar.gz", members)
    server = start(start_server, tmp_path, "--multi-model")
    response = post(server, orjson.dumps({"values": [[1, 2, 3, 4]]}),
                    **{"X-Amzn-SageMaker-Target-Model": "with-code.tar.gz"})
    assert response.status_code == 200, response.text
    assert response.json() == {"scores": [11.0, 12.0, 13.0, 14.0]}


MARKING = "open({marker!r}, 'w').write('ran')\n\ndef model_warmup_fn(model_dir, model):\n    pass\n"


def test_user_code_none_refuses_inference_py_and_keeps_ping_unready(tmp_path: Path) -> None:
    marker = tmp_path / "marker"
    (tmp_path / "model").mkdir()
    root = opt_ml_model(tmp_path / "model", MARKING.format(marker=str(marker)))
    server = ServerProcess(root, "--user-code", "none")
    try:
        server.wait_ready()
        assert requests.get(server.sagemaker + "/ping", timeout=5).status_code == 503
    finally:
        output = server.stop()
    assert "code/inference.py" in output and "--user-code none" in output
    assert not marker.exists()


def test_user_code_none_refuses_an_archive_with_code(tmp_path: Path, start_server: Any) -> None:
    marker = tmp_path / "marker"
    model_path = tmp_path / "weighted.onnx"
    onnx.save_model(weighted_model(10.0, 4), str(model_path))
    code = MARKING.format(marker=str(marker)).encode()
    write_archive(tmp_path / "with-code.tar.gz", {"model.onnx": model_path.read_bytes(), "code/inference.py": code,
                                                  "code/requirements.txt": b"nothing-to-install\n"})
    write_archive(tmp_path / "plain.tar.gz", {"model.onnx": model_path.read_bytes()})
    server = start(start_server, tmp_path, "--multi-model", "--user-code", "none")
    refused = post(server, b"1,2,3,4", "text/csv", **{"X-Amzn-SageMaker-Target-Model": "with-code.tar.gz"})
    assert refused.status_code == 400, refused.text
    message = refused.json()["error"]
    assert "--user-code none" in message and "code/inference.py" in message and "code/requirements.txt" in message
    assert not marker.exists()
    served = post(server, b"1,2,3,4", "text/csv", **{"X-Amzn-SageMaker-Target-Model": "plain.tar.gz"})
    assert served.status_code == 200, served.text


SLEEPY = '''
import threading
import time


def handler(data, context):
    time.sleep(float(data.read().decode()))
    return threading.current_thread().name, "text/plain"
'''


def test_slow_handlers_do_not_hold_up_loading_another_model(tmp_path: Path, start_server: Any) -> None:
    """Handlers run in a pool of their own: forty sleeping in one archive's inference.py (more than the loop's default
    executor has threads) while another archive downloads, unpacks and loads on first use."""
    model_path = tmp_path / "weighted.onnx"
    onnx.save_model(weighted_model(10.0, 4), str(model_path))
    write_archive(tmp_path / "sleepy.tar.gz",
                  {"model.onnx": model_path.read_bytes(), "code/inference.py": SLEEPY.encode()})
    write_archive(tmp_path / "plain.tar.gz", {"model.onnx": model_path.read_bytes()})
    server = start(start_server, tmp_path, "--multi-model", "--handler-threads", "40")
    sleepy = {"X-Amzn-SageMaker-Target-Model": "sleepy.tar.gz"}
    first = post(server, b"0", "text/plain", **sleepy)
    assert first.status_code == 200, first.text
    assert first.text.startswith("sagemaker-handler")
    with ThreadPoolExecutor(40) as pool:
        sleeping = [pool.submit(post, server, b"4", "text/plain", **sleepy) for _ in range(40)]
        time.sleep(1.0)
        started = time.monotonic()
        plain = post(server, orjson.dumps({"instances": [[1, 2, 3, 4]]}),
                     **{"X-Amzn-SageMaker-Target-Model": "plain.tar.gz"})
        took = time.monotonic() - started
        assert plain.status_code == 200, plain.text
        assert not any(future.done() for future in sleeping)  # the handlers were all still sleeping
        assert took < 2.5
        assert all(future.result().status_code == 200 for future in sleeping)


def test_a_handler_past_the_invocation_timeout_is_answered_504_and_the_endpoint_keeps_serving(
        tmp_path: Path, start_server: Any) -> None:
    server = start(start_server, opt_ml_model(tmp_path, SLEEPY), "--invocation-timeout-seconds", "0.5")
    started = time.monotonic()
    late = post(server, b"3", "text/plain")
    assert late.status_code == 504, late.text
    assert "0.5 s" in late.json()["error"] and time.monotonic() - started < 2.5
    quick = post(server, b"0", "text/plain")  # while the late handler still sleeps in its thread
    assert quick.status_code == 200 and quick.text.startswith("sagemaker-handler")
