"""`modelhost tune` against a real server in explicit mode: within a short time limit it returns a config the
server loads, leaves it loaded, and reports a p99 within the budget it was given."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from modelhost.cli import main
from modelhost.client import Client
from modelhost.config.pbtxt import parse_config
from tests.onnx_models import scale_model, write_model
from tests.server import ServerProcess

CONFIG = """
platform: "onnxruntime_onnx"
max_batch_size: 64
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
instance_group [ { count: 1 kind: KIND_CPU } ]
"""


def test_tune_returns_a_config_the_server_loads_within_the_budget(tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    write_model(tmp_path / "repo", "scale", scale_model(2.0), CONFIG)
    server = ServerProcess(tmp_path / "repo", "--model-control-mode", "explicit", "--load-model", "scale").wait_ready()
    try:
        code = main(["tune", "scale", "--p99-ms", "50", "-u", server.url, "-b", "16", "--time-limit", "1.5",
                     "--measurement-interval", "150", "--warmup", "0.05", "--processes", "1", "--max-concurrency", "4",
                     "-o", str(tmp_path / "tuned")])  # the CLI's entry, in this process
        out = capsys.readouterr()
        assert code == 0, out.err[-3000:]
        assert "tuned:" in out.out and "config:" in out.out
        report = json.loads((tmp_path / "tuned" / "trials.json").read_text())
        final = report["final"]
        assert 0 < final["p99_ms"] <= 50 and final["throughput"] > 0
        assert report["trials"][0]["dimension"] == "baseline" and len(report["trials"]) >= 2
        written = parse_config((tmp_path / "tuned" / "config.pbtxt").read_text())
        with Client(server.url) as client:
            live = client.model_config("scale")  # the winner stays loaded
            assert live["max_batch_size"] == written.max_batch_size == final["max_batch_size"]
            assert sum(g["count"] for g in live["instance_group"]) == final["instances"]
            x = np.ones((16, 4), np.float32)
            np.testing.assert_array_equal(client.infer("scale", {"INPUT0": x})["OUTPUT0"], x * 2)
        page = (tmp_path / "tuned" / "report.html").read_text()
        assert "data:image/png;base64," in page and "config.pbtxt" in page
    finally:
        server.stop()
