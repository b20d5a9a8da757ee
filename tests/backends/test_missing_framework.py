"""A model whose framework is not installed fails alone, with the extra to install named in the index."""

from __future__ import annotations

import os
from pathlib import Path

import requests

from tests.onnx_models import scale_model, write_model

TORCH_CONFIG = """
platform: "pytorch_libtorch"
max_batch_size: 4
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
"""


def test_missing_framework_fails_the_model_alone(start_server, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    # A `torch` package that cannot be imported, first on the server's path: as if torch were not installed.
    shadow = tmp_path / "shadow" / "torch"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ImportError('No module named torch (shadowed by the test)')\n")
    repo = tmp_path / "repo"
    write_model(repo, "onnx_model", scale_model(2.0), None)
    (repo / "torch_model" / "1").mkdir(parents=True)
    (repo / "torch_model" / "1" / "model.pt").write_bytes(b"never read")
    (repo / "torch_model" / "config.pbtxt").write_text(TORCH_CONFIG)
    path = os.pathsep.join([str(shadow.parent), os.environ.get("PYTHONPATH", "")])
    server = start_server(repo, env={"PYTHONPATH": path})

    entries = {e["name"]: e for e in requests.post(server.base + "/v2/repository/index", timeout=10).json()}
    assert entries["onnx_model"]["state"] == "READY"
    assert entries["torch_model"]["state"] == "UNAVAILABLE"
    assert "backend 'pytorch' cannot be used" in entries["torch_model"]["reason"]
    assert "pip install 'modelhost[torch]'" in entries["torch_model"]["reason"]
    response = requests.post(f"{server.base}/v2/models/torch_model/infer", json={"inputs": []}, timeout=10)
    assert response.status_code == 503 and "modelhost[torch]" in response.json()["error"]
