"""An ensemble end to end: Python preprocess -> ONNX -> Python postprocess, on a real server with tritonclient."""

from __future__ import annotations

import concurrent.futures
import threading
from pathlib import Path

import numpy as np
import pytest
import requests
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.onnx_models import scale_model, write_model

PREPROCESS = '''
import numpy as np


class Model:
    def execute(self, inputs):
        raw = inputs["RAW"]
        if (raw < 0).any():
            raise ValueError("negative input")
        return {"FEATURES": raw * 2}
'''
POSTPROCESS = '''
class Model:
    def execute(self, inputs):
        return {"SCORE": inputs["X"].sum(axis=1, keepdims=True)}
'''
PYTHON_CONFIG = """
backend: "python"
max_batch_size: 8
dynamic_batching {{ max_queue_delay_microseconds: 20000 }}
input [ {{ name: "{input}" data_type: TYPE_FP32 dims: [ 4 ] }} ]
output [ {{ name: "{output}" data_type: TYPE_FP32 dims: [ {dims} ] }} ]
"""
SCALE_CONFIG = """
platform: "onnxruntime_onnx"
max_batch_size: 8
dynamic_batching { max_queue_delay_microseconds: 20000 }
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] label_filename: "labels.txt" } ]
"""
ENSEMBLE_CONFIG = """
platform: "ensemble"
max_batch_size: 8
input [ { name: "RAW" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "SCORE" data_type: TYPE_FP32 dims: [ 1 ] } ]
ensemble_scheduling { step [
  { model_name: "preprocess" model_version: -1
    input_map { key: "RAW" value: "RAW" } output_map { key: "FEATURES" value: "features" } },
  { model_name: "scale" model_version: -1
    input_map { key: "INPUT0" value: "features" } output_map { key: "OUTPUT0" value: "scaled" } },
  { model_name: "postprocess" model_version: -1
    input_map { key: "X" value: "scaled" } output_map { key: "SCORE" value: "SCORE" } }
] }
"""
COMPOSING = ("preprocess", "scale", "postprocess")
# The same steps under an ensemble without a batch dim (max_batch_size 0): its [4] input reaches the batching steps as
# a batch of 1, and their [1, 1] answer leaves it as [1] (Triton's ensembles do so; its qa/L0_infer_zero's run so).
FLAT_CONFIG = ENSEMBLE_CONFIG.replace("max_batch_size: 8", "max_batch_size: 0")
# An ensemble output without a label_filename of its own: classified with the labels of the step output it is.
LABELLED_CONFIG = """
platform: "ensemble"
max_batch_size: 8
input [ { name: "RAW" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "SCALED" data_type: TYPE_FP32 dims: [ 4 ] } ]
ensemble_scheduling { step [
  { model_name: "scale" model_version: -1
    input_map { key: "INPUT0" value: "RAW" } output_map { key: "OUTPUT0" value: "SCALED" } }
] }
"""


def python_model(repo: Path, name: str, code: str, config: str) -> None:
    (repo / name / "1").mkdir(parents=True)
    (repo / name / "1" / "model.py").write_text(code)
    (repo / name / "config.pbtxt").write_text(config)


@pytest.fixture
def repository(tmp_path: Path) -> Path:
    repo = tmp_path / "repo"
    python_model(repo, "preprocess", PREPROCESS, PYTHON_CONFIG.format(input="RAW", output="FEATURES", dims=4))
    python_model(repo, "postprocess", POSTPROCESS, PYTHON_CONFIG.format(input="X", output="SCORE", dims=1))
    write_model(repo, "scale", scale_model(3.0), SCALE_CONFIG)
    (repo / "scale" / "labels.txt").write_text("cat\ndog\nemu\nyak\n")
    (repo / "labelled" / "1").mkdir(parents=True)
    (repo / "labelled" / "config.pbtxt").write_text(LABELLED_CONFIG)
    (repo / "pipeline" / "1").mkdir(parents=True)  # an ensemble's version directory is empty
    (repo / "pipeline" / "config.pbtxt").write_text(ENSEMBLE_CONFIG)
    (repo / "flat" / "1").mkdir(parents=True)
    (repo / "flat" / "config.pbtxt").write_text(FLAT_CONFIG)
    return repo


def expected(raw: np.ndarray) -> np.ndarray:
    return (raw * 2 * 3).sum(axis=1, keepdims=True)


def infer(client: httpclient.InferenceServerClient, raw: np.ndarray) -> np.ndarray:
    x = httpclient.InferInput("RAW", list(raw.shape), "FP32")
    x.set_data_from_numpy(raw)
    return client.infer("pipeline", [x]).as_numpy("SCORE")


def test_ensemble_runs_each_step_batched(start_server, repository: Path) -> None:  # type: ignore[no-untyped-def]
    server = start_server(repository)
    client = httpclient.InferenceServerClient(server.url)
    try:
        raw = np.random.default_rng(0).random((3, 4), dtype=np.float32)
        np.testing.assert_allclose(infer(client, raw), expected(raw), rtol=1e-6)

        rows = [np.full((1, 4), i, np.float32) for i in range(16)]
        barrier = threading.Barrier(len(rows))

        def call(row: np.ndarray) -> np.ndarray:
            # tritonclient.http clients are gevent-based: one per thread.
            own = httpclient.InferenceServerClient(server.url)
            try:
                barrier.wait()
                return infer(own, row)
            finally:
                own.close()

        with concurrent.futures.ThreadPoolExecutor(len(rows)) as pool:
            results = list(pool.map(call, rows))
        for row, result in zip(rows, results):
            np.testing.assert_allclose(result, expected(row))
        # Every step went through its model's scheduler, and concurrent ensemble requests batched there.
        for name in COMPOSING:
            stats = client.get_inference_statistics(name)["model_stats"][0]
            assert stats["inference_count"] == 3 + 16
            assert stats["execution_count"] < 1 + 16, (name, stats)
        # The ensemble's own: each request one execution of its rows, as Triton counts them (its qa/L0_optional_input)
        ensemble = client.get_inference_statistics("pipeline")["model_stats"][0]
        assert (ensemble["inference_count"], ensemble["execution_count"]) == (3 + 16, 1 + 16)
        assert {b["batch_size"]: b["compute_infer"]["count"] for b in ensemble["batch_stats"]} == {3: 1, 1: 16}
        assert ensemble["inference_stats"]["success"]["count"] == 17
        metadata = client.get_model_metadata("pipeline")
        assert metadata["platform"] == "ensemble"
        assert [i["name"] for i in metadata["inputs"]] == ["RAW"]
    finally:
        client.close()


def test_an_ensemble_without_a_batch_dim_over_batching_steps(start_server, repository: Path) -> None:  # type: ignore[no-untyped-def]
    server = start_server(repository)
    client = httpclient.InferenceServerClient(server.url)
    try:
        raw = np.arange(4, dtype=np.float32)
        x = httpclient.InferInput("RAW", [4], "FP32")
        x.set_data_from_numpy(raw)
        score = client.infer("flat", [x]).as_numpy("SCORE")
        assert score.shape == (1,)
        np.testing.assert_allclose(score, expected(raw[np.newaxis])[0])
    finally:
        client.close()


def test_an_ensemble_output_takes_its_steps_labels(start_server, repository: Path) -> None:  # type: ignore[no-untyped-def]
    server = start_server(repository)
    client = httpclient.InferenceServerClient(server.url)
    try:
        x = httpclient.InferInput("RAW", [1, 4], "FP32")
        x.set_data_from_numpy(np.array([[1, 4, 2, 3]], np.float32))
        result = client.infer("labelled", [x], outputs=[httpclient.InferRequestedOutput("SCALED", class_count=2)])
        assert result.as_numpy("SCALED").tolist() == [[b"12.000000:1:dog", b"9.000000:3:yak"]]
    finally:
        client.close()


def test_failed_step_is_named(start_server, repository: Path) -> None:  # type: ignore[no-untyped-def]
    server = start_server(repository)
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        x = grpcclient.InferInput("RAW", [1, 4], "FP32")
        x.set_data_from_numpy(-np.ones((1, 4), np.float32))
        with pytest.raises(InferenceServerException) as error:
            client.infer("pipeline", [x])
        message = error.value.message()
        assert "ensemble 'pipeline' step 1 (model 'preprocess')" in message and "negative input" in message
        x.set_data_from_numpy(np.ones((1, 4), np.float32))
        assert client.infer("pipeline", [x]).as_numpy("SCORE")[0, 0] == 24.0
    finally:
        client.close()


def test_explicit_load_brings_composing_models_and_unload_takes_them(start_server, repository: Path) -> None:  # type: ignore[no-untyped-def]
    server = start_server(repository, "--model-control-mode", "explicit", "--load-model", "pipeline")
    client = httpclient.InferenceServerClient(server.url)
    try:
        assert all(client.is_model_ready(name) for name in (*COMPOSING, "pipeline"))
        raw = np.ones((2, 4), np.float32)
        np.testing.assert_allclose(infer(client, raw), expected(raw))

        client.unload_model("pipeline")  # the composing models stay
        assert not client.is_model_ready("pipeline") and client.is_model_ready("scale")
        client.load_model("pipeline")
        client.unload_model("pipeline", unload_dependents=True)
        assert not any(client.is_model_ready(name) for name in (*COMPOSING, "pipeline"))
    finally:
        client.close()


def test_ensemble_with_a_missing_composing_model_fails_alone(start_server, repository: Path) -> None:  # type: ignore[no-untyped-def]
    config = ENSEMBLE_CONFIG.replace('model_name: "scale"', 'model_name: "absent"')
    (repository / "pipeline" / "config.pbtxt").write_text(config)
    server = start_server(repository)
    entries = {e["name"]: e for e in requests.post(server.base + "/v2/repository/index", timeout=10).json()}
    assert entries["pipeline"]["state"] == "UNAVAILABLE"
    assert "absent" in entries["pipeline"]["reason"]
    assert entries["scale"]["state"] == "READY"
