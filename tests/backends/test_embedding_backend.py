"""The `embedding` backend end to end: a real server over a repository whose models are embedding tables
(modelhost/embeddings), called with tritonclient as Triton's users call any model.

The server holds `items` (float32, ids -> [fields, dim]) and `pooled` (int8, multi-hot fields summed by lengths),
and `gathered` (an extracted ONNX Gather table: indices -N..N-1)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import requests
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from modelhost.embeddings.table_files import write_version
from tests.server import ServerProcess, wait_for

DIM, ROWS, FIELDS = 16, 5000, 39
ITEMS = f"""
backend: "embedding"
max_batch_size: 512
input [ {{ name: "feat_ids" data_type: TYPE_INT64 dims: [ {FIELDS} ] }} ]
output [ {{ name: "embeddings" data_type: TYPE_FP32 dims: [ {FIELDS}, {DIM} ] }} ]
"""
POOLED = f"""
backend: "embedding"
max_batch_size: 64
input [ {{ name: "ids" data_type: TYPE_INT64 dims: [ -1 ] }},
        {{ name: "lengths" data_type: TYPE_INT32 dims: [ 3 ] }} ]
output [ {{ name: "pooled" data_type: TYPE_FP32 dims: [ 3, {DIM} ] }} ]
parameters {{ key: "pooling" value: {{ string_value: "mean" }} }}
"""
GATHERED = f"""
backend: "embedding"
max_batch_size: 64
input [ {{ name: "index" data_type: TYPE_INT64 dims: [ 2 ] }} ]
output [ {{ name: "rows" data_type: TYPE_FP32 dims: [ 2, {DIM} ] }} ]
parameters {{ key: "index_mode" value: {{ string_value: "gather" }} }}
"""


@pytest.fixture(scope="module")
def tables(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServerProcess, dict[str, np.ndarray]]]:
    root = tmp_path_factory.mktemp("embedding_repository")
    rng = np.random.default_rng(0)
    ids = (rng.choice(1 << 40, ROWS, replace=False) * 7919).astype(np.int64)  # hashed-looking ids
    vectors = rng.standard_normal((ROWS, DIM)).astype(np.float32)
    for name, config, dtype, keys in (("items", ITEMS, "float32", ids), ("pooled", POOLED, "int8", ids),
                                      ("gathered", GATHERED, "float32", np.arange(ROWS))):
        (root / name / "1").mkdir(parents=True)
        (root / name / "config.pbtxt").write_text(config)
        write_version(root / name / "1" / "table", keys, vectors, dtype)
    server = ServerProcess(root, "--embedding-cache-bytes", "256KiB", "--embedding-updates")
    server.wait_ready()
    yield server, {"ids": ids, "vectors": vectors}
    server.stop()


def infer(server: ServerProcess, model: str, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    client = httpclient.InferenceServerClient(server.url)
    tensors = []
    for name, array in inputs.items():
        tensor = httpclient.InferInput(name, list(array.shape), "INT64" if array.dtype == np.int64 else "INT32")
        tensor.set_data_from_numpy(array, binary_data=True)
        tensors.append(tensor)
    result = client.infer(model, tensors)
    return {output["name"]: result.as_numpy(output["name"]) for output in result.get_response()["outputs"]}


def test_a_ranking_request_gets_each_ids_vector(tables: tuple[ServerProcess, dict[str, np.ndarray]]) -> None:
    server, data = tables
    by_id = dict(zip(data["ids"].tolist(), data["vectors"], strict=True))
    rng = np.random.default_rng(1)
    for _ in range(2):  # cold, then partly cached (the cache holds 4096 of the 5000 rows)
        asked = rng.choice(data["ids"], (500, FIELDS))  # 500 candidates
        asked[:, :13] = asked[0, :13]  # user and context fields: the same for every candidate
        asked[3, 20] = 12345  # not in the table: the default vector (zeros)
        got = infer(server, "items", {"feat_ids": asked})["embeddings"]
        want = np.stack([by_id.get(i, np.zeros(DIM, np.float32)) for i in asked.reshape(-1).tolist()])
        np.testing.assert_array_equal(got, want.reshape(500, FIELDS, DIM))


def test_multi_hot_fields_are_pooled_by_their_lengths(tables: tuple[ServerProcess, dict[str, np.ndarray]]) -> None:
    server, data = tables
    ids, vectors = data["ids"], data["vectors"]
    asked = np.stack([ids[[0, 1, 2, 3, 4, 0]], ids[[5, 6, 7, 7, 7, 7]]])
    lengths = np.array([[2, 3, 1], [1, 0, 2]], dtype=np.int32)  # the second row's last 3 ids are padding
    got = infer(server, "pooled", {"ids": asked, "lengths": lengths})["pooled"]
    want = np.stack([[vectors[[0, 1]].mean(0), vectors[[2, 3, 4]].mean(0), vectors[0]],
                     [vectors[5], np.zeros(DIM), vectors[[6, 7]].mean(0)]])
    np.testing.assert_allclose(got, want, atol=3 * np.abs(vectors).max() / 127)  # int8 rows


def test_gather_tables_take_onnx_indices(tables: tuple[ServerProcess, dict[str, np.ndarray]]) -> None:
    server, data = tables
    got = infer(server, "gathered", {"index": np.array([[0, -1], [ROWS - 1, 5]], dtype=np.int64)})["rows"]
    np.testing.assert_array_equal(got, data["vectors"][[[0, ROWS - 1], [ROWS - 1, 5]]])


@pytest.mark.parametrize("model, inputs, message", [
    ("gathered", {"index": np.array([[0, ROWS]], dtype=np.int64)}, "holds index 5000, outside [-5000, 4999]"),
    ("pooled", {"ids": np.zeros((1, 4), np.int64), "lengths": np.array([[1, -1, 0]], np.int32)}, "negative length"),
    ("pooled", {"ids": np.zeros((1, 4), np.int64), "lengths": np.array([[3, 1, 1]], np.int32)},
     "row 0 adds up to 5 ids, but 'ids' has 4 per row"),
    ("items", {"feat_ids": np.zeros((1, FIELDS), np.int32)}, "INT64"),
])
def test_bad_ids_get_a_clear_400_and_the_model_keeps_serving(
        tables: tuple[ServerProcess, dict[str, np.ndarray]], model: str, inputs: dict[str, np.ndarray],
        message: str) -> None:
    server, data = tables
    with pytest.raises(InferenceServerException) as caught:
        infer(server, model, inputs)
    assert message in str(caught.value) and caught.value.status() == "400"
    assert infer(server, "items", {"feat_ids": data["ids"][:FIELDS][None]})["embeddings"].shape == (1, FIELDS, DIM)


def update(server: ServerProcess, model: str, ids: np.ndarray, vectors: np.ndarray, binary: bool = True) -> Any:
    """An update as a V2 inference request body: binary (built by tritonclient) or JSON."""
    if not binary:
        body = {"inputs": [{"name": "ids", "datatype": "INT64", "shape": list(ids.shape), "data": ids.tolist()},
                           {"name": "vectors", "datatype": "FP32", "shape": list(vectors.shape),
                            "data": vectors.reshape(-1).tolist()}]}
        return requests.post(f"{server.base}/v2/models/{model}/embeddings/update", json=body, timeout=30)
    tensors = [httpclient.InferInput("ids", list(ids.shape), "INT64"),
               httpclient.InferInput("vectors", list(vectors.shape), "FP32")]
    tensors[0].set_data_from_numpy(ids, binary_data=True)
    tensors[1].set_data_from_numpy(vectors, binary_data=True)
    body, json_size = httpclient.InferenceServerClient.generate_request_body(tensors)
    headers = {"Inference-Header-Content-Length": str(json_size), "Content-Type": "application/octet-stream"}
    return requests.post(f"{server.base}/v2/models/{model}/embeddings/update", data=body, headers=headers,
                         timeout=30)


def test_rows_are_updated_while_serving_and_kept_across_a_restart(tmp_path: Path) -> None:
    (tmp_path / "items" / "1").mkdir(parents=True)
    (tmp_path / "items" / "config.pbtxt").write_text(ITEMS)
    ids = np.arange(1000, dtype=np.int64) * 31
    write_version(tmp_path / "items" / "1" / "table", ids, np.zeros((1000, DIM), np.float32), "float32")
    asked = np.stack([np.concatenate([ids[:FIELDS - 1], [77]])])  # 77: not in the table yet
    server = ServerProcess(tmp_path, "--embedding-poll-seconds", "0.2", "--embedding-updates")
    try:
        server.wait_ready()
        infer(server, "items", {"feat_ids": asked})  # cached now
        changed = np.full((2, DIM), 3.0, np.float32)
        answer = update(server, "items", np.array([ids[0], 77]), changed)
        assert answer.status_code == 200, answer.text
        assert answer.json() == {"model_name": "items", "model_version": "1", "rows": 2, "new_rows": 1}
        answer = update(server, "items", np.array([ids[1]]), np.full((1, DIM), 4.0, np.float32), binary=False)
        assert answer.status_code == 200, answer.text
        got = infer(server, "items", {"feat_ids": asked})["embeddings"][0]
        assert (got[0] == 3.0).all() and (got[1] == 4.0).all() and (got[-1] == 3.0).all() and (got[2] == 0).all()
        deltas = tmp_path / "items" / "1" / "table" / "deltas"
        deltas.mkdir()
        np.savez(deltas / "first.npz", ids=ids[2:3], vectors=np.full((1, DIM), 5.0, np.float32))
        wait_for(lambda: (infer(server, "items", {"feat_ids": asked})["embeddings"][0][2] == 5.0).all(), 30,
                 "the delta file applied")
        # The file goes once its rows are in the log, a moment after lookups see them.
        wait_for(lambda: not (deltas / "first.npz").exists(), 30, "the applied delta file removed")
    finally:
        server.stop()
    again = ServerProcess(tmp_path)
    try:
        again.wait_ready()
        got = infer(again, "items", {"feat_ids": asked})["embeddings"][0]
        assert (got[0] == 3.0).all() and (got[1] == 4.0).all() and (got[-1] == 3.0).all() and (got[2] == 5.0).all()
        # Started without --embedding-updates: clients cannot write rows (delta files still apply).
        refused = update(again, "items", np.array([ids[0]]), np.zeros((1, DIM), np.float32))
        assert refused.status_code == 501 and "--embedding-updates" in refused.json()["error"]
    finally:
        again.stop()


@pytest.mark.parametrize("model, ids, vectors, status, message", [
    ("items", np.array([1, 2]), np.zeros((3, DIM), np.float32), 400, "must be FP32 [2, 16] (one row per id)"),
    ("items", np.array([1]), np.full((1, DIM), np.nan, np.float32), 400, "NaN or infinite"),
    ("items", np.array([1]), np.zeros((1, DIM + 1), np.float32), 400, "FP32 [1, 16]"),
    ("gathered", np.array([1]), np.zeros((1, DIM), np.float32), 501, "has no table that takes row updates"),
    ("nope", np.array([1]), np.zeros((1, DIM), np.float32), 404, "nope"),
])
def test_bad_updates_get_a_clear_error(tables: tuple[ServerProcess, dict[str, np.ndarray]], model: str,
                                       ids: np.ndarray, vectors: np.ndarray, status: int, message: str) -> None:
    answer = update(tables[0], model, ids.astype(np.int64), vectors)
    assert answer.status_code == status and message in answer.json()["error"], answer.text


def test_each_table_has_its_metrics(tables: tuple[ServerProcess, dict[str, np.ndarray]]) -> None:
    server, data = tables
    asked = data["ids"][:FIELDS][None]
    infer(server, "items", {"feat_ids": asked})
    infer(server, "items", {"feat_ids": asked})  # all from the cache now
    text = requests.get(f"http://127.0.0.1:{server.metrics_port}/metrics", timeout=10).text
    values = {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
              if line.startswith("modelhost_embedding_") and 'table="items"' in line}
    assert values['modelhost_embedding_cache_hits_total{table="items"}'] >= FIELDS
    assert values['modelhost_embedding_disk_reads_total{table="items"}'] > 0
    assert values['modelhost_embedding_rows{table="items"}'] >= ROWS
    assert 0 < values['modelhost_embedding_cache_hit_ratio{table="items"}'] < 1
    assert 0 < values['modelhost_embedding_cached_bytes{table="items"}'] <= 256 * 1024
    assert values['modelhost_embedding_disk_read_seconds_count{table="items"}'] > 0


def test_rows_are_updated_over_grpc(tables: tuple[ServerProcess, dict[str, np.ndarray]]) -> None:
    import grpc

    from modelhost.protocols.kserve_v2 import grpc_service_pb2 as pb

    server, data = tables
    ids = np.array([999_999_937, 999_999_941], dtype=np.int64)  # new ids: the module's reference rows stay
    vectors = np.full((2, DIM), 9.0, np.float32)
    request = pb.ModelInferRequest(model_name="items", inputs=[
        pb.ModelInferRequest.InferInputTensor(name="ids", datatype="INT64", shape=[2]),
        pb.ModelInferRequest.InferInputTensor(name="vectors", datatype="FP32", shape=[2, DIM])],
        raw_input_contents=[ids.tobytes(), vectors.tobytes()])
    with grpc.insecure_channel(server.grpc_url) as channel:
        call = channel.unary_unary("/modelhost.EmbeddingService/Update",
                                   request_serializer=pb.ModelInferRequest.SerializeToString,
                                   response_deserializer=pb.EmbeddingUpdateResponse.FromString)
        answer = call(request, timeout=30)
        assert (answer.model_name, answer.model_version, answer.rows, answer.new_rows) == ("items", "1", 2, 2)
        request.inputs[1].shape[:] = [1, DIM * 2]
        with pytest.raises(grpc.RpcError) as caught:
            call(request, timeout=30)
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    asked = np.concatenate([ids, data["ids"][: FIELDS - 2]])[None]
    got = infer(server, "items", {"feat_ids": asked})["embeddings"][0]
    assert (got[:2] == 9.0).all()
