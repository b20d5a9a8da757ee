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
