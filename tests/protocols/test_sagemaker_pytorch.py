"""SageMaker PyTorch model directories (tsfs §A8): weights a user's `model_fn` loads plus `code/inference.py`, served
as the SageMaker PyTorch inference toolkit serves them, called with boto3's invoke_endpoint and the SageMaker SDK's
Predictor. Two endpoints: a `.pth` state dict with the toolkit's default input, predict and output functions
(single model, batching by SAGEMAKER_TS_BATCH_SIZE), and a Hugging Face-style directory (config.json and
model.safetensors, written here) with all four functions, as a multi-model endpoint's model.tar.gz."""

from __future__ import annotations

import json
import tarfile
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
import requests

from tests.backends.torchserve_archives import MODULE_HANDLE, make_archive
from tests.protocols.test_sagemaker_server import runtime_client
from tests.server import ServerProcess

torch = pytest.importorskip("torch")
pytest.importorskip("ts")

STATE_DICT_CODE = '''
import os

import torch


class Scorer(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(4, 2)

    def forward(self, x):
        return self.linear(x)


def model_fn(model_dir):
    model = Scorer()
    model.load_state_dict(torch.load(os.path.join(model_dir, "model.pth")))
    return model.eval()
'''
# Every function, with the toolkit's optional context: output_fn reports how many requests its batch held.
HUGGING_FACE_CODE = '''
import json
import os

import torch
from safetensors.torch import load_file


def model_fn(model_dir, context):
    with open(os.path.join(model_dir, "config.json")) as file:
        config = json.load(file)
    model = torch.nn.Linear(config["hidden_size"], config["num_labels"])
    model.load_state_dict(load_file(os.path.join(model_dir, "model.safetensors")))
    return model.eval()


def input_fn(input_data, content_type):
    assert content_type == "application/json", content_type
    return torch.tensor(json.loads(input_data)["inputs"], dtype=torch.float32)


def predict_fn(data, model, context):
    with torch.no_grad():
        return model(data).argmax(dim=-1), len(context.request_ids)


def output_fn(prediction, accept):
    labels, batch = prediction
    return json.dumps({"labels": labels.tolist(), "batch": batch}), "application/vnd.labels+json"
'''


def scorer() -> Any:
    torch.manual_seed(3)
    return torch.nn.Sequential(torch.nn.Linear(4, 2)).eval()


@pytest.fixture(scope="module")
def single(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """/opt/ml/model: model.pth (a state dict) and code/inference.py with model_fn only."""
    root = tmp_path_factory.mktemp("opt_ml_model")
    torch.save({"linear." + k: v for k, v in scorer()[0].state_dict().items()}, root / "model.pth")
    (root / "code").mkdir()
    (root / "code" / "inference.py").write_text(STATE_DICT_CODE)
    server = ServerProcess(root, cache_dir=tmp_path_factory.mktemp("cache"),
                           env={"SAGEMAKER_TS_BATCH_SIZE": "4", "SAGEMAKER_TS_MAX_BATCH_DELAY": "50"})
    server.wait_ready(path=server.sagemaker + "/ping", timeout=120)
    yield server
    server.stop()


def test_a_state_dict_model_fn_directory_serves_through_the_toolkits_defaults(single: ServerProcess) -> None:
    rows = [[1.0, 2.0, 3.0, 4.0], [0.5, -1.0, 0.0, 2.0]]
    result = runtime_client(single).invoke_endpoint(EndpointName="pytorch", Body=json.dumps(rows).encode(),
                                                    ContentType="application/json", Accept="application/json")
    assert result["ContentType"] == "application/json"
    expected = scorer()(torch.tensor(rows)).tolist()
    answer = json.loads(result["Body"].read())
    assert [[round(v, 5) for v in row] for row in answer] == [[round(v, 5) for v in row] for row in expected]
    csv = requests.post(single.sagemaker + "/invocations", data=b"1,2,3,4\n",
                        headers={"Content-Type": "text/csv", "Accept": "text/csv"}, timeout=60)
    assert csv.status_code == 200 and csv.headers["content-type"] == "text/csv"
    assert [round(float(v), 5) for v in csv.text.strip().split(",")] == [round(v, 5) for v in expected[0]]


def test_the_sagemaker_sdks_predictor_with_json_serializers(single: ServerProcess) -> None:
    import boto3
    import sagemaker
    from sagemaker.deserializers import JSONDeserializer
    from sagemaker.predictor import Predictor
    from sagemaker.serializers import JSONSerializer

    boto_session = boto3.Session(aws_access_key_id="local", aws_secret_access_key="local", region_name="us-east-1")
    session = sagemaker.Session(boto_session=boto_session, sagemaker_runtime_client=runtime_client(single),
                                default_bucket="unused")
    predictor = Predictor("pytorch", sagemaker_session=session, serializer=JSONSerializer(),
                          deserializer=JSONDeserializer())
    answer = predictor.predict([[1.0, 2.0, 3.0, 4.0]])
    assert [round(v, 5) for v in answer[0]] == [round(v, 5) for v in scorer()(torch.tensor([[1.0, 2.0, 3.0, 4.0]]))
                                                 .tolist()[0]]


def test_a_bad_request_is_the_toolkits_error_and_the_endpoint_keeps_serving(single: ServerProcess) -> None:
    bad = requests.post(single.sagemaker + "/invocations", data=b"{not json",
                        headers={"Content-Type": "application/json"}, timeout=60)
    assert bad.status_code == 500 and "JSONDecodeError" in bad.text
    unsupported = requests.post(single.sagemaker + "/invocations", data=b"x",
                                headers={"Content-Type": "image/png"}, timeout=60)
    assert unsupported.status_code == 415 and "image/png is not supported" in unsupported.text
    ok = requests.post(single.sagemaker + "/invocations", data=b"[[1, 2, 3, 4]]",
                       headers={"Content-Type": "application/json"}, timeout=60)
    assert ok.status_code == 200


@pytest.fixture(scope="module")
def multi(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """A multi-model endpoint whose hf.tar.gz holds a Hugging Face-style directory and code/inference.py."""
    from safetensors.torch import save_file

    source = tmp_path_factory.mktemp("hf_source")
    torch.manual_seed(5)
    classifier = torch.nn.Linear(8, 3)
    save_file(classifier.state_dict(), str(source / "model.safetensors"))
    (source / "config.json").write_text(json.dumps({"hidden_size": 8, "num_labels": 3}))
    (source / "code").mkdir()
    (source / "code" / "inference.py").write_text(HUGGING_FACE_CODE)
    archives = tmp_path_factory.mktemp("archives")
    with tarfile.open(archives / "hf.tar.gz", "w:gz") as archive:
        for name in ("model.safetensors", "config.json", "code"):
            archive.add(source / name, arcname=name)
    made = tmp_path_factory.mktemp("mar")
    with tarfile.open(archives / "lengths.tar.gz", "w:gz") as archive:
        archive.add(make_archive(made, "lengths", MODULE_HANDLE), arcname="lengths.mar")
    server = ServerProcess(archives, "--multi-model", cache_dir=tmp_path_factory.mktemp("cache"),
                           env={"SAGEMAKER_TS_BATCH_SIZE": "8", "SAGEMAKER_TS_MAX_BATCH_DELAY": "100"})
    server.wait_ready(path=server.sagemaker + "/ping", timeout=120)
    server.classifier = classifier  # type: ignore[attr-defined]
    yield server
    server.stop()


def test_a_hugging_face_directory_in_a_multi_model_archive_batches_its_requests(multi: ServerProcess) -> None:
    client = runtime_client(multi)
    rows = [[float(i + j) / 10 for j in range(8)] for i in range(2)]

    def invoke(_: int) -> tuple[dict[str, Any], str]:
        result = client.invoke_endpoint(EndpointName="hf", TargetModel="hf.tar.gz", ContentType="application/json",
                                        Body=json.dumps({"inputs": rows}).encode())
        return json.loads(result["Body"].read()), result["ContentType"]

    answer, content_type = invoke(0)
    assert content_type == "application/vnd.labels+json"
    expected = multi.classifier(torch.tensor(rows)).argmax(dim=-1).tolist()  # type: ignore[attr-defined]
    assert answer["labels"] == expected
    with ThreadPoolExecutor(8) as pool:
        answers = [answer for answer, _ in pool.map(invoke, range(16))]
    assert all(answer["labels"] == expected for answer in answers)
    assert max(answer["batch"] for answer in answers) > 1  # the worker took several requests at once


def test_a_torchserve_archive_in_a_multi_model_archive_gets_the_request_as_sent(multi: ServerProcess) -> None:
    result = runtime_client(multi).invoke_endpoint(EndpointName="mme", TargetModel="lengths.tar.gz",
                                                   ContentType="application/octet-stream", Body=b"abcdef")
    assert json.loads(result["Body"].read()) == {"length": 6, "model": "lengths.tar.gz", "batch": 1}
