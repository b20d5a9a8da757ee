"""--user-code through a real ModelManager: which models may run the code they bring."""

from __future__ import annotations

import asyncio
from pathlib import Path, PurePosixPath

import pytest

from modelhost.config.pbtxt import read_config
from modelhost.core.code_policy import CodePolicy
from modelhost.core.load_request import LoadOverride
from modelhost.core.manager import ModelManager
from modelhost.errors import ErrorKind, ModelhostError
from modelhost.store.local import LocalStore

PYTHON_CONFIG = """
backend: "python"
max_batch_size: 0
input [ { name: "x" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "y" data_type: TYPE_FP32 dims: [ 1 ] } ]
"""
MODEL_PY = "class Model:\n    def execute(self, inputs):\n        return {'y': inputs['x']}\n"
EXPORT_CONFIG = """
platform: "pytorch_libtorch"
default_model_filename: "model.pt2"
max_batch_size: 0
input [ { name: "x" data_type: TYPE_FP32 dims: [ 2 ] } ]
output [ { name: "OUTPUT__0" data_type: TYPE_FP32 dims: [ 2 ] } ]
"""


def python_repository(root: Path) -> Path:
    (root / "py" / "1").mkdir(parents=True)
    (root / "py" / "config.pbtxt").write_text(PYTHON_CONFIG)
    (root / "py" / "1" / "model.py").write_text(MODEL_PY)
    return root


def load(root: Path, mode: str, name: str, override: LoadOverride | None = None) -> ModelhostError | None:
    async def scenario() -> ModelhostError | None:
        manager = ModelManager(LocalStore(root), 1, 4, work_dir=root.parent / "work", code_policy=CodePolicy(mode))
        try:
            await manager.load(name, override)
        except ModelhostError as exc:
            return exc
        finally:
            await manager.stop()
        return None

    return asyncio.run(scenario())


@pytest.mark.parametrize(("mode", "refused"), [("all", False), ("repository", False), ("none", True)])
def test_repository_python_model(tmp_path: Path, mode: str, refused: bool) -> None:
    error = load(python_repository(tmp_path / "repo"), mode, "py")
    assert (error is not None) == refused
    if error is not None:
        assert error.kind is ErrorKind.INVALID_INPUT and "--user-code none" in error.message
        assert "model.py" in error.message


@pytest.mark.parametrize(("mode", "refused"), [("all", False), ("repository", True), ("none", True)])
def test_uploaded_python_model(tmp_path: Path, mode: str, refused: bool) -> None:
    config = read_config(python_repository(tmp_path / "repo") / "py")
    override = LoadOverride(config, {PurePosixPath("1/model.py"): MODEL_PY.encode()})
    error = load(tmp_path / "repo", mode, "up", override)
    assert (error is not None) == refused
    if error is not None:
        assert error.kind is ErrorKind.INVALID_INPUT and f"--user-code {mode}" in error.message


def test_a_torch_export_program_is_code(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    (tmp_path / "repo" / "exported" / "1").mkdir(parents=True)
    (tmp_path / "repo" / "exported" / "config.pbtxt").write_text(EXPORT_CONFIG)
    program = torch.export.export(torch.nn.Identity(), (torch.zeros(2),))
    torch.export.save(program, str(tmp_path / "repo" / "exported" / "1" / "model.pt2"))
    assert load(tmp_path / "repo", "repository", "exported") is None
    error = load(tmp_path / "repo", "none", "exported")
    assert error is not None and "model.pt2" in error.message and "pickle" in error.message


TRITON_AUTO_COMPLETE = """
from pathlib import Path
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    @staticmethod
    def auto_complete_config(config):
        Path(__file__).parent.parent.joinpath("auto_complete_ran").write_text("")
        config.add_input({"name": "x", "data_type": "TYPE_FP32", "dims": [1]})
        config.add_output({"name": "y", "data_type": "TYPE_FP32", "dims": [1]})
        return config

    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("y", pb_utils.get_input_tensor_by_name(r, "x")
                                                            .as_numpy())]) for r in requests]
"""


@pytest.mark.parametrize(("mode", "uploaded", "refused"),
                         [("all", True, False), ("repository", False, False), ("repository", True, True),
                          ("none", False, True)])
def test_auto_complete_config_runs_only_where_code_may(tmp_path: Path, mode: str, uploaded: bool,
                                                       refused: bool) -> None:
    # Triton's auto_complete_config is the model's code: the policy refuses the model before it runs (the hook
    # leaves a file where it runs), and where the policy allows it, it completes the config the model loads with.
    root = tmp_path / "repo"
    (root / "auto" / "1").mkdir(parents=True)
    (root / "auto" / "config.pbtxt").write_text('backend: "python"\n')
    (root / "auto" / "1" / "model.py").write_text(TRITON_AUTO_COMPLETE)
    override = None
    if uploaded:
        files = {PurePosixPath("1/model.py"): TRITON_AUTO_COMPLETE.encode()}
        override = LoadOverride(read_config(root / "auto"), files)
    error = load(root, mode, "up" if uploaded else "auto", override)
    ran = list(tmp_path.rglob("auto_complete_ran"))
    assert (error is not None) == refused, error
    assert bool(ran) != refused
    if error is not None:
        assert error.kind is ErrorKind.INVALID_INPUT and f"--user-code {mode}" in error.message
