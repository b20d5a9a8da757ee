"""A backend from another distribution, registered under the `modelhost.backends` entry point, on a live server."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import requests
import tritonclient.http as httpclient

from modelhost import plugin

PLUGIN = '''
from modelhost.plugin import Backend, ConfigError, Model, config_signature


class ReverseModel(Model):
    def __init__(self, config, threads):
        self._signature = config_signature(config, "reverse model")
        self.threads = threads

    def infer(self, inputs, outputs):
        return {"y": inputs["x"][:, ::-1].copy()}

    def signature(self):
        return self._signature


class ReverseBackend(Backend):
    name = "reverse"
    platform = "reverse"
    default_filename = "model.reverse"

    def describe(self, path):
        raise ConfigError("the reverse backend reads its tensors from config.pbtxt")

    def load(self, path, config, instance):
        if path.read_text() != "reverse":
            raise ConfigError(f"{path.name} is not a reverse model")
        return ReverseModel(config, instance.threads)
'''

CONFIG = """
backend: "reverse"
max_batch_size: 8
input [ { name: "x" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "y" data_type: TYPE_FP32 dims: [ 4 ] } ]
"""


def install_plugin(site: Path, entry: str = "reverse = modelhost_reverse:ReverseBackend") -> None:
    """A distribution as pip leaves it in site-packages: the module and its dist-info with entry_points.txt."""
    site.mkdir(parents=True)
    (site / "modelhost_reverse.py").write_text(PLUGIN)
    dist = site / "modelhost_reverse-1.0.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: modelhost-reverse\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text(f"[modelhost.backends]\n{entry}\n")


def write_repository(root: Path, backend: str = "reverse") -> Path:
    model = root / "repo" / "flip"
    (model / "1").mkdir(parents=True)
    (model / "config.pbtxt").write_text(CONFIG.replace('"reverse"', f'"{backend}"'))
    (model / "1" / "model.reverse").write_text("reverse")
    return root / "repo"


def with_site(site: Path) -> dict[str, str]:
    return {"PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")])}


def test_an_installed_plugin_backend_serves_its_models(tmp_path: Path, start_server: Any) -> None:
    install_plugin(tmp_path / "site")
    server = start_server(write_repository(tmp_path), env=with_site(tmp_path / "site"))
    client = httpclient.InferenceServerClient(server.url)
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    given = httpclient.InferInput("x", [2, 4], "FP32")
    given.set_data_from_numpy(x)
    result = client.infer("flip", [given])
    np.testing.assert_array_equal(result.as_numpy("y"), x[:, ::-1])
    assert client.get_model_config("flip")["backend"] == "reverse"


def test_a_plugin_cannot_take_a_builtin_backends_name(tmp_path: Path, start_server: Any) -> None:
    install_plugin(tmp_path / "site", entry="onnxruntime = modelhost_reverse:ReverseBackend")
    server = start_server(write_repository(tmp_path, backend="onnxruntime"), "--model-control-mode", "explicit",
                          env=with_site(tmp_path / "site"), ready_path="/v2/health/live")
    answer = requests.post(f"{server.base}/v2/repository/models/flip/load", timeout=30)
    assert answer.status_code == 503, answer.text  # loaded by the built-in ONNX backend, which finds no model.onnx
    assert "model.onnx" in answer.json()["error"]
    assert "backend plug-in 'onnxruntime' (modelhost_reverse:ReverseBackend) ignored" in server.printed


def test_the_public_api_names_what_it_exports() -> None:
    for name in plugin.__all__:
        assert getattr(plugin, name) is not None
    assert issubclass(plugin.ModelhostError, Exception)
