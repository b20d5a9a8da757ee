"""The name and path rules of store/paths.py."""

from __future__ import annotations

from pathlib import Path, PurePosixPath

import pytest

from modelhost.errors import ErrorKind, ModelhostError
from modelhost.store.paths import check_model_name, check_relative, inside, within


@pytest.mark.parametrize("name", ["a", "resnet-50_v2.onnx", "名前", "a b", "...", ".hidden", "x" * 255, "..my_model",
                                  "model..1", "model.version1"])
def test_names(name: str) -> None:
    assert check_model_name(name) == name


@pytest.mark.parametrize(("name", "problem"), [
    ("", "empty"), (".", "not a name"), ("..", "not a name"), ("a/b", "separator"), ("/abs", "separator"),
    ("a\\b", "separator"), ("a\x00", "control"), ("\x7f", "control"), ("a\nb", "control"), ("x" * 256, "255 bytes"),
    ("é" * 128, "255 bytes"), (" ", "blank"), ("\t \n", "blank"), (" ..", "not a name"), (".. ", "not a name"),
])
def test_not_names(name: str, problem: str) -> None:
    with pytest.raises(ModelhostError) as refused:
        check_model_name(name, "model_name")
    assert refused.value.kind is ErrorKind.INVALID_INPUT
    assert problem in refused.value.message and "model_name" in refused.value.message


@pytest.mark.parametrize(("name", "words"), [
    ("", "Model name cannot be empty. Please enter a valid name to deploy."), (" \t", "Model name cannot be empty."),
    ("..", "model name must not contain path traversal characters"),
    (" ..", "model name must not contain path traversal characters"),
    ("../etc", "model name must not contain path traversal characters"),
    ("model/", "model name must not contain path traversal characters"),
])
def test_refusals_carry_tritons_words(name: str, words: str) -> None:
    """As Triton's qa/L0_input_validation ModelNameValidationTest matches them on load."""
    with pytest.raises(ModelhostError) as refused:
        check_model_name(name)
    assert words in refused.value.message


@pytest.mark.parametrize(("text", "path"), [("model.onnx", "model.onnx"), ("./a/./b.pt", "a/b.pt"), ("...", "...")])
def test_relative_paths(text: str, path: str) -> None:
    assert check_relative(text, "f") == PurePosixPath(path)
    assert inside(Path("/root"), text, "f") == Path("/root") / path


@pytest.mark.parametrize("text", ["", "/etc/passwd", "../x", "a/../../x", "a/..", "a\\..\\x", "a//b", "a/", ".",
                                  "a\x00b", "\x1b[31m"])
def test_escaping_paths(text: str) -> None:
    with pytest.raises(ModelhostError) as refused:
        check_relative(text, "default_model_filename")
    assert refused.value.kind is ErrorKind.INVALID_INPUT and "default_model_filename" in refused.value.message


def test_within_resolves_symlinks_and_dot_dots(tmp_path: Path) -> None:
    root, outside = tmp_path / "root", tmp_path / "rootless"  # a shared prefix is not containment
    (root / "m").mkdir(parents=True)
    outside.mkdir()
    (root / "out").symlink_to(outside, target_is_directory=True)
    (tmp_path / "alias").symlink_to(root, target_is_directory=True)
    assert within(root / "m", [root]) and within(root, [root]) and within(tmp_path / "alias" / "m", [root])
    assert within(root / "m", [tmp_path / "alias"])
    assert not within(outside, [root]) and not within(root / "out", [root])
    assert not within(root / ".." / "rootless", [root]) and not within("/", [root]) and not within(root / "m", [])
