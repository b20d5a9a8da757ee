"""Triton's classification extension over HTTP and gRPC, spoken by tritonclient (`class_count`).

One server: `scores` batches (FP32 [batch, 5], labels in the model directory's labels.txt), `counts` does not
(INT32 [6], no label file), `broken` names a label file that is not there (its load fails), `ranked` is an
ensemble over `scores` with labels of its own.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
import requests
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from onnx import TensorProto
from tritonclient.utils import InferenceServerException

from modelhost.core.classification import check_classifiable, classify
from modelhost.errors import ModelhostError
from tests.helpers import assert_error
from tests.onnx_models import identity_model, write_model
from tests.server import ServerProcess

LABELS = ["ant", "bee", "cat", "", "eel"]  # index 3 has an empty line: no label
SCORES_CONFIG = """
platform: "onnxruntime_onnx"
max_batch_size: 4
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 5 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 5 ] label_filename: "labels.txt" } ]
"""
COUNTS_CONFIG = """
platform: "onnxruntime_onnx"
max_batch_size: 0
input [ { name: "INPUT0" data_type: TYPE_INT32 dims: [ 6 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 6 ] } ]
"""
RANKED_CONFIG = """
platform: "ensemble"
max_batch_size: 4
input [ { name: "IN" data_type: TYPE_FP32 dims: [ 5 ] } ]
output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 5 ] label_filename: "names.txt" } ]
ensemble_scheduling { step [
  { model_name: "scores" model_version: -1
    input_map { key: "INPUT0" value: "IN" } output_map { key: "OUTPUT0" value: "OUT" } }
] }
"""
ROWS = np.array([[0.1, 0.7, 0.2, 0.9, -1.0], [3.5, 0.0, 3.5, 1.25, 2.0]], dtype=np.float32)
COUNTS = np.array([4, 9, 4, -2, 100, 0], dtype=np.int32)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repo = tmp_path_factory.mktemp("classification")
    scores = write_model(repo, "scores", identity_model(TensorProto.FLOAT, dims=(5,)), SCORES_CONFIG)
    (scores / "labels.txt").write_text("\n".join(LABELS) + "\n")
    (repo / "ranked" / "1").mkdir(parents=True)  # an ensemble over `scores`, with labels of its own
    (repo / "ranked" / "config.pbtxt").write_text(RANKED_CONFIG)
    (repo / "ranked" / "names.txt").write_text("A\nB\nC\nD\nE\n")
    write_model(repo, "counts", identity_model(TensorProto.INT32, batch=False, dims=(6,)), COUNTS_CONFIG)
    write_model(repo, "broken", identity_model(TensorProto.INT32, batch=False, dims=(6,)),
                COUNTS_CONFIG.replace('"OUTPUT0" data_type: TYPE_INT32 dims: [ 6 ]',
                                      '"OUTPUT0" data_type: TYPE_INT32 dims: [ 6 ] label_filename: "gone.txt"'))
    process = ServerProcess(repo).wait_ready()
    yield process
    process.stop()


# Batch row 0: 0.9 (index 3, empty label), 0.7 (bee), 0.2 (cat); row 1: 3.5 twice (index order), then 2.0.
EXPECTED_SCORES = [[b"0.900000:3", b"0.700000:1:bee", b"0.200000:2:cat"],
                   [b"3.500000:0:ant", b"3.500000:2:cat", b"2.000000:4:eel"]]


@pytest.mark.parametrize("binary", [True, False])
def test_http_batched_with_labels(server: ServerProcess, binary: bool) -> None:
    client = httpclient.InferenceServerClient(server.url)
    entry = httpclient.InferInput("INPUT0", [2, 5], "FP32").set_data_from_numpy(ROWS)
    result = client.infer("scores", [entry], outputs=[
        httpclient.InferRequestedOutput("OUTPUT0", binary_data=binary, class_count=3)])
    output = result.get_output("OUTPUT0")
    assert (output["datatype"], output["shape"]) == ("BYTES", [2, 3])
    classes = result.as_numpy("OUTPUT0").tolist()  # JSON data comes back as str, binary as bytes
    assert [[c if binary else c.encode() for c in row] for row in classes] == EXPECTED_SCORES


def test_grpc_batched_with_labels(server: ServerProcess) -> None:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    entry = grpcclient.InferInput("INPUT0", [2, 5], "FP32")
    entry.set_data_from_numpy(ROWS)
    result = client.infer("scores", [entry], outputs=[grpcclient.InferRequestedOutput("OUTPUT0", class_count=3)])
    output = result.get_output("OUTPUT0")
    assert (output.datatype, list(output.shape)) == ("BYTES", [2, 3])
    assert result.as_numpy("OUTPUT0").tolist() == EXPECTED_SCORES


def test_ensemble_output_with_its_own_labels(server: ServerProcess) -> None:
    client = httpclient.InferenceServerClient(server.url)
    entry = httpclient.InferInput("IN", [2, 5], "FP32").set_data_from_numpy(ROWS)
    result = client.infer("ranked", [entry], outputs=[httpclient.InferRequestedOutput("OUT", class_count=1)])
    assert result.as_numpy("OUT").tolist() == [[b"0.900000:3:D"], [b"3.500000:0:A"]]


def test_unbatched_without_labels_and_more_classes_than_elements(server: ServerProcess) -> None:
    # Integers print as integers; a count past the output's 6 elements returns all 6, as Triton does.
    expected = [b"100:4", b"9:1", b"4:0", b"4:2", b"0:5", b"-2:3"]
    http = httpclient.InferenceServerClient(server.url)
    result = http.infer("counts", [httpclient.InferInput("INPUT0", [6], "INT32").set_data_from_numpy(COUNTS)],
                        outputs=[httpclient.InferRequestedOutput("OUTPUT0", class_count=50)])
    assert result.get_output("OUTPUT0")["shape"] == [6]
    assert result.as_numpy("OUTPUT0").tolist() == expected
    grpc = grpcclient.InferenceServerClient(server.grpc_url)
    entry = grpcclient.InferInput("INPUT0", [6], "INT32")
    entry.set_data_from_numpy(COUNTS)
    answer = grpc.infer("counts", [entry], outputs=[grpcclient.InferRequestedOutput("OUTPUT0", class_count=2)])
    assert answer.as_numpy("OUTPUT0").tolist() == expected[:2]


def test_count_zero_answers_the_tensor(server: ServerProcess) -> None:
    body = {"inputs": [{"name": "INPUT0", "datatype": "INT32", "shape": [6], "data": COUNTS.tolist()}],
            "outputs": [{"name": "OUTPUT0", "parameters": {"classification": 0}}]}
    answer = requests.post(f"{server.base}/v2/models/counts/infer", json=body, timeout=10).json()
    assert answer["outputs"][0]["data"] == COUNTS.tolist()


def test_bad_count_over_grpc(server: ServerProcess) -> None:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    entry = grpcclient.InferInput("INPUT0", [6], "INT32")
    entry.set_data_from_numpy(COUNTS)
    with pytest.raises(InferenceServerException, match="'OUTPUT0'.*'classification'.*non-negative") as info:
        client.infer("counts", [entry], outputs=[grpcclient.InferRequestedOutput("OUTPUT0", class_count=-1)])
    assert info.value.status() == "StatusCode.INVALID_ARGUMENT"


def test_missing_label_file_fails_the_load(server: ServerProcess) -> None:
    index = requests.post(f"{server.base}/v2/repository/index", timeout=10).json()
    broken = next(entry for entry in index if entry["name"] == "broken")
    assert broken["state"] == "UNAVAILABLE"
    assert "'OUTPUT0'" in broken["reason"] and "gone.txt" in broken["reason"]
    assert "/" not in broken["reason"]  # no server paths
    response = requests.post(f"{server.base}/v2/models/broken/infer", json={"inputs": []}, timeout=10)
    assert_error(response, 503, "broken", "gone.txt")


# --------------------------------------------------------------------------- the core's ranking, in process

def test_unsupported_datatypes_are_refused_before_running() -> None:
    for datatype in ("BOOL", "FP16", "BYTES"):
        with pytest.raises(ModelhostError, match=f"'y'.*{datatype}"):
            check_classifiable({"y": 2}, {"y": datatype})
    check_classifiable({"y": 2}, {"y": "UINT8"})


def test_nan_ranks_last_and_uint64_keeps_its_digits() -> None:
    scores = np.array([[np.nan, 1.0, -np.inf]], dtype=np.float64)
    assert classify("y", scores, 3, (), batched=True).tolist() == [[b"1.000000:1", b"-inf:2", b"nan:0"]]
    big = np.array([2**64 - 1, 1], dtype=np.uint64)
    assert classify("y", big, 1, (b"max",), batched=False).tolist() == [b"18446744073709551615:0:max"]


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int8, np.uint8, np.int64, np.uint64])
def test_ranking_matches_a_plain_sort(dtype: type) -> None:
    # Highest first, equal values in index order, NaN last; the extremes of integer types included.
    rng = np.random.default_rng(7)
    for _ in range(60):
        rows, width = int(rng.integers(1, 4)), int(rng.integers(1, 12))
        if np.dtype(dtype).kind == "f":
            data = rng.integers(-3, 3, (rows, width)).astype(dtype)
            data[rng.random((rows, width)) < 0.2] = np.nan
        else:
            info = np.iinfo(dtype)
            data = rng.choice(np.array([info.min, info.max, 0, 1, 2], dtype=dtype), (rows, width))
        count = int(rng.integers(1, width + 2))
        for row, classes in zip(data, classify("y", data, count, (), batched=True).tolist()):
            def rank(i: int, row: np.ndarray = row) -> tuple[bool, float | int, int]:
                if row.dtype.kind != "f":
                    return False, -int(row[i]), i
                return bool(np.isnan(row[i])), 0.0 if np.isnan(row[i]) else -float(row[i]), i

            order = sorted(range(width), key=rank)
            assert [int(c.split(b":")[1]) for c in classes] == order[:count]
