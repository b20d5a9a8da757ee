"""find_layout on real directories with real ONNX models: every layout ends in a repository the loader serves."""

from __future__ import annotations

import os
import tarfile
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto

from modelhost.backends.base import InstanceSettings
from modelhost.core.model_loading import plan_model
from modelhost.errors import ErrorKind, ModelhostError
from modelhost.store.layout import ModelLayout, find_layout
from modelhost.store.local import LocalStore, ModelSource
from modelhost.store.unpack import unpack_archive
from tests.onnx_models import ADD_SUB_CONFIG, add_sub_model, identity_model, slow_loop_model, write_model

NAME = "served"


def run(layout: ModelLayout, name: str, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Fetch `name` from the layout's repository, plan it, load its latest version and run it once."""
    source = LocalStore(layout.repository).fetch(name)
    plan = plan_model(source)
    path = source.path / str(plan.versions[-1]) / plan.backend.default_filename
    model = plan.backend.load(path, plan.config, InstanceSettings(0, 1))
    try:
        return model.infer(inputs, [spec.name for spec in plan.backend.describe(path).outputs])
    finally:
        model.unload()


def serves_add_sub(layout: ModelLayout, name: str) -> bool:
    ones = np.ones((1, 16), np.float32)
    result = run(layout, name, {"INPUT0": ones, "INPUT1": ones})
    return bool(np.all(result["OUTPUT0"] == 2.0) and np.all(result["OUTPUT1"] == 0.0))


def code(directory: Path, program: bool = True) -> Path:
    (directory / "code/lib").mkdir(parents=True)
    if program:
        (directory / "code/inference.py").write_text("def model_fn(model_dir):\n    return None\n")
    (directory / "code/requirements.txt").write_text("")
    return directory / "code"


def test_repository(tmp_path: Path) -> None:
    root = tmp_path / "model"
    write_model(root, "simple", add_sub_model(), ADD_SUB_CONFIG)
    write_model(root, "echo", identity_model(TensorProto.FLOAT), None, version=3)
    layout = find_layout(root, NAME, tmp_path / "work")
    assert layout == ModelLayout(root, ("echo", "simple"), None)
    assert serves_add_sub(layout, "simple")
    echo = np.arange(3, dtype=np.float32).reshape(1, 3)
    assert np.array_equal(run(layout, "echo", {"INPUT0": echo})["OUTPUT0"], echo)
    assert not (tmp_path / "work").exists()  # nothing generated when the root is a clean repository


def test_repository_with_code_and_other_directories(tmp_path: Path) -> None:
    root = tmp_path / "model"
    write_model(root, "simple", add_sub_model(), ADD_SUB_CONFIG)
    code_dir = code(root)
    (root / "docs").mkdir()
    layout = find_layout(root, NAME, tmp_path / "work")
    assert layout == ModelLayout(tmp_path / "work", ("simple",), code_dir)
    assert LocalStore(layout.repository).list() == ["simple"]  # neither code/ nor docs/ is a model
    assert serves_add_sub(layout, "simple")


def test_single_model_directory(tmp_path: Path) -> None:
    root = tmp_path / "model"
    write_model(tmp_path, "model", add_sub_model(), ADD_SUB_CONFIG, version=1)
    write_model(tmp_path, "model", add_sub_model(), None, version=2)
    code_dir = code(root)
    layout = find_layout(root, NAME, tmp_path / "work")
    assert layout == ModelLayout(tmp_path / "work", (NAME,), code_dir)
    source = LocalStore(layout.repository).fetch(NAME)
    assert source.versions == (1, 2)
    assert plan_model(source).versions == (2,)
    assert serves_add_sub(layout, NAME)


def test_single_model_directory_named_by_its_config(tmp_path: Path) -> None:
    root = tmp_path / "model"
    write_model(tmp_path, "model", add_sub_model(), 'name: "simple"\n' + ADD_SUB_CONFIG)
    layout = find_layout(root, NAME, tmp_path / "work")
    assert layout.models == ("simple",)
    assert serves_add_sub(layout, "simple")


def test_ensemble_style_model_directory_with_an_empty_version(tmp_path: Path) -> None:
    root = tmp_path / "model"
    (root / "1").mkdir(parents=True)
    (root / "config.pbtxt").write_text('platform: "ensemble"\n')
    layout = find_layout(root, NAME, tmp_path / "work")
    assert LocalStore(layout.repository).fetch(NAME).versions == (1,)


def test_single_model_file(tmp_path: Path) -> None:
    root = tmp_path / "model"
    root.mkdir()
    onnx.save_model(add_sub_model(), str(root / "model.onnx"))
    code_dir = code(root)
    (root / ".DS_Store").write_bytes(b"junk")
    layout = find_layout(root, NAME, tmp_path / "work")
    assert layout == ModelLayout(tmp_path / "work", (NAME,), code_dir)
    assert sorted(os.listdir(tmp_path / "work" / NAME / "1")) == ["model.onnx"]
    source = LocalStore(layout.repository).fetch(NAME)
    assert source.versions == (1,)
    assert plan_model(source).config.platform == "onnxruntime_onnx"
    assert serves_add_sub(layout, NAME)


def test_a_lone_model_file_is_read_in_place_when_asked_and_nothing_else_is(tmp_path: Path) -> None:
    """find_layout(in_place=True), as a multi-model endpoint's archives are read: a directory of one model file
    (and its config) is that model's version 1 as it is, with no links made; anything beside it keeps the links."""
    root = tmp_path / "model"
    root.mkdir()
    onnx.save_model(add_sub_model(), str(root / "model.onnx"))
    (root / "config.pbtxt").write_text('platform: "onnxruntime_onnx"\n')
    layout = find_layout(root, NAME, tmp_path / "work", in_place=True)
    assert layout == ModelLayout(root, (NAME,), None, in_place=root)
    assert not (tmp_path / "work").exists()
    source = ModelSource(NAME, root, (1,), root)
    plan = plan_model(source)
    assert plan.config.platform == "onnxruntime_onnx" and plan.versions == (1,)
    path = source.version_path(1) / plan.backend.default_filename
    assert path == root / "model.onnx"
    model = plan.backend.load(path, plan.config, InstanceSettings(0, 1))
    try:
        ones = np.ones((1, 16), np.float32)
        assert np.all(model.infer({"INPUT0": ones, "INPUT1": ones}, ["OUTPUT0"])["OUTPUT0"] == 2.0)
    finally:
        model.unload()
    (root / "vocabulary.txt").write_text("a\n")  # a file beside it: linked, as without in_place
    layout = find_layout(root, NAME, tmp_path / "work", in_place=True)
    assert layout.in_place is None and serves_add_sub(layout, NAME)


def test_single_model_file_with_config_and_external_weights(tmp_path: Path) -> None:
    root = tmp_path / "model"
    root.mkdir()
    onnx.save_model(slow_loop_model(4, batched=False), str(root / "model.onnx"), save_as_external_data=True,
                    location="weights.bin", size_threshold=0)
    (root / "config.pbtxt").write_text('platform: "onnxruntime_onnx"\nmax_batch_size: 0\n'
                                       'parameters { key: "intra_op_thread_count" value { string_value: "1" } }\n')
    layout = find_layout(root, NAME, tmp_path / "work")
    model_dir = tmp_path / "work" / NAME
    assert sorted(os.listdir(model_dir)) == ["1", "config.pbtxt"]
    assert sorted(os.listdir(model_dir / "1")) == ["model.onnx", "weights.bin"]
    source = LocalStore(layout.repository).fetch(NAME)
    plan = plan_model(source)
    assert "intra_op_thread_count" in plan.config.parameters
    model = plan.backend.load(source.path / "1/model.onnx", plan.config, InstanceSettings(0, 1))
    result = model.infer({"X": np.full((4, 4), 2.0, np.float32), "ITERATIONS": np.array([3], np.int64)}, ["Y"])
    assert np.array_equal(result["Y"], np.full((4, 4), 3.0, np.float32))


def unpacked(tmp_path: Path, files: dict[str, Path]) -> Path:
    """Pack `files` (archive name -> file on disk) into a real model.tar.gz and unpack it as SageMaker would."""
    archive = tmp_path / "model.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        for name, path in files.items():
            tar.add(path, arcname=name)
    destination = tmp_path / "opt_ml_model"
    unpack_archive(archive, destination, 1 << 30)
    return destination


@pytest.fixture
def sources(tmp_path: Path) -> dict[str, Path]:
    """On-disk files to pack: a model file, a Triton model directory, an inference.py."""
    src = tmp_path / "src"
    write_model(src, "simple", add_sub_model(), ADD_SUB_CONFIG)
    (src / "inference.py").write_text("def model_fn(model_dir):\n    return None\n")
    return {"onnx": src / "simple/1/model.onnx", "config": src / "simple/config.pbtxt", "code": src / "inference.py"}


def test_tar_wrapping_a_single_file_model_in_a_directory(tmp_path: Path, sources: dict[str, Path]) -> None:
    root = unpacked(tmp_path, {"model/model.onnx": sources["onnx"], "model/code/inference.py": sources["code"]})
    layout = find_layout(root, NAME, tmp_path / "work")
    assert layout == ModelLayout(tmp_path / "work", (NAME,), root / "model/code")
    assert serves_add_sub(layout, NAME)


def test_tar_with_a_model_directory_and_code_beside_it(tmp_path: Path, sources: dict[str, Path]) -> None:
    root = unpacked(tmp_path, {"half_plus_three/1/model.onnx": sources["onnx"],
                               "half_plus_three/config.pbtxt": sources["config"],
                               "code/inference.py": sources["code"]})
    layout = find_layout(root, NAME, tmp_path / "work")
    assert layout == ModelLayout(tmp_path / "work", ("half_plus_three",), root / "code")
    assert serves_add_sub(layout, "half_plus_three")


def test_tar_wrapping_a_repository_twice(tmp_path: Path, sources: dict[str, Path]) -> None:
    root = unpacked(tmp_path, {"export/model/a/1/model.onnx": sources["onnx"],
                               "export/model/b/2/model.onnx": sources["onnx"],
                               "code/inference.py": sources["code"],
                               "README.txt": sources["code"]})
    layout = find_layout(root, NAME, tmp_path / "work")
    assert layout == ModelLayout(root / "export/model", ("a", "b"), root / "code")
    assert serves_add_sub(layout, "a") and serves_add_sub(layout, "b")


def test_work_dir_is_reused(tmp_path: Path) -> None:
    first, second = tmp_path / "first", tmp_path / "second"
    write_model(first, "a", add_sub_model(), None)
    code(first)
    second.mkdir()
    onnx.save_model(add_sub_model(), str(second / "model.onnx"))
    work = tmp_path / "work"
    assert find_layout(first, NAME, work).models == ("a",)
    assert find_layout(second, NAME, work).models == (NAME,)
    assert os.listdir(work) == [NAME]  # the first call's links are gone
    assert (first / "a/1/model.onnx").is_file()  # and removing them removed no model file


def test_work_dir_with_foreign_files_is_refused(tmp_path: Path) -> None:
    root = tmp_path / "model"
    root.mkdir()
    onnx.save_model(add_sub_model(), str(root / "model.onnx"))
    (tmp_path / "work").mkdir()
    (tmp_path / "work/precious.txt").write_text("keep me")
    with pytest.raises(ModelhostError, match="precious.txt, which find_layout did not make"):
        find_layout(root, NAME, tmp_path / "work")
    assert (tmp_path / "work/precious.txt").read_text() == "keep me"


def invalid_message(root: Path, work: Path, name: str = NAME, allow_empty: bool = False) -> str:
    with pytest.raises(ModelhostError) as caught:
        find_layout(root, name, work, allow_empty)
    assert caught.value.kind is ErrorKind.INVALID_INPUT
    return caught.value.message


def test_empty_directory(tmp_path: Path) -> None:
    (tmp_path / "model").mkdir()
    message = invalid_message(tmp_path / "model", tmp_path / "work")
    assert message.startswith(f"no model found in {tmp_path / 'model'}: expected one of: a Triton model repository")
    assert "single model file such as model.onnx" in message and message.endswith("found: nothing")


def test_empty_directory_as_an_empty_repository(tmp_path: Path) -> None:
    root = tmp_path / "model"
    code_dir = code(root, program=False)
    (root / ".hidden").mkdir()
    assert find_layout(root, NAME, tmp_path / "work", allow_empty=True) == ModelLayout(root, (), code_dir)
    (root / "notes.txt").write_text("not a model")
    assert "found: code, notes.txt" in invalid_message(root, tmp_path / "work", allow_empty=True)


def test_unrecognizable_directory_lists_what_it_found(tmp_path: Path) -> None:
    root = tmp_path / "model"
    (root / "weights").mkdir(parents=True)
    (root / "other").mkdir()
    (root / "model.pkl").write_bytes(b"pickle")
    code(root, program=False)
    assert invalid_message(root, tmp_path / "work").endswith("found: code, model.pkl, other, weights")


def test_weights_with_an_inference_program_are_one_sagemaker_pytorch_model(tmp_path: Path) -> None:
    root = tmp_path / "opt_ml_model"
    (root / "hf/tokenizer").mkdir(parents=True)
    (root / "hf/model.safetensors").write_bytes(b"weights")
    code(root)
    work = tmp_path / "work"
    layout = find_layout(root, NAME, work)
    assert layout == ModelLayout(work, (NAME,), None)  # its code runs in the model, not in the front-end
    assert sorted(os.listdir(work / NAME / "1")) == ["code", "hf"]
    assert (work / NAME / "1" / "hf").resolve() == root / "hf"
    plan = plan_model(LocalStore(work).fetch(NAME))
    assert plan.backend is not None and plan.backend.name == "torchserve"
    assert plan.config.parameters["handler"].string_value == "modelhost.backends.torchserve.sagemaker_toolkit"
    assert find_layout(root, NAME, work).models == (NAME,)  # its written config.pbtxt is find_layout's to remove
    (root / "code/inference.py").rename(root / "code/serve.py")
    assert find_layout(root, NAME, work, program="serve.py").models == (NAME,)  # SAGEMAKER_PROGRAM


def test_several_torchserve_archives_are_a_model_store(tmp_path: Path) -> None:
    root = tmp_path / "store"
    root.mkdir()
    for name in ("resnet", "bert"):
        (root / f"{name}.mar").write_bytes(b"PK")
    layout = find_layout(root, NAME, tmp_path / "work")
    assert layout.models == ("bert", "resnet")
    assert (layout.repository / "resnet/1/resnet.mar").resolve() == root / "resnet.mar"


def test_config_without_versions_or_model_file(tmp_path: Path) -> None:
    root = tmp_path / "model"
    root.mkdir()
    (root / "config.pbtxt").write_text('platform: "onnxruntime_onnx"\n')
    assert "has a config.pbtxt but no version directory" in invalid_message(root, tmp_path / "work")


def test_unparsable_config_names_the_file(tmp_path: Path) -> None:
    root = tmp_path / "model"
    (root / "1").mkdir(parents=True)
    (root / "config.pbtxt").write_text("platform: {{{\n")
    assert "config.pbtxt" in invalid_message(root, tmp_path / "work")


def test_missing_root(tmp_path: Path) -> None:
    assert "does not exist" in invalid_message(tmp_path / "nope", tmp_path / "work")


@pytest.mark.parametrize("name", ["", ".", "..", "a/b", ".hidden", "a\\b", "a\x00b", "a\nb"])
def test_invalid_single_model_name(tmp_path: Path, name: str) -> None:
    write_model(tmp_path, "model", add_sub_model(), None)
    assert "directory name" in invalid_message(tmp_path / "model", tmp_path / "work", name)
