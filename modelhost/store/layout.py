"""Find the model(s) in a directory a user gave us (SageMaker's /opt/ml/model, an unpacked model.tar.gz).

The rules, applied to a directory D, starting at the root. Names starting with "." are ignored
everywhere, and `code/` (inference.py, requirements.txt, lib/) is never a model.

1. D has numeric version directories (`1/`, `2/`; Triton's rule: no leading "0") at the top:
   D is one model directory.
2. D has a model file at the top (one whose name a backend recognizes, e.g. `model.onnx`; a file or
   a directory so named): one model whose version 1 is that file; everything else at the top except
   config.pbtxt and code/ (external weights, vocabularies) is placed beside it, config.pbtxt above it.
   A config.pbtxt with neither version directories nor a model file is an error. Several TorchServe archives
   (`*.mar`, a TorchServe model store) are one model each, named after its file (`resnet.mar`: `resnet`).
3. D has subdirectories that are models (holding config.pbtxt or version directories): D is a
   Triton-layout repository, and each such subdirectory is a model named after it.
4. Otherwise, when D has exactly one subdirectory other than code/ (a tar that wraps everything in
   `model/`, say), the rules are applied again inside it, up to MAX_WRAPPING levels deep.
5. When no rule found a model, and a directory on the way has a code/ that holds the handler program
   (`inference.py`, or SAGEMAKER_PROGRAM), the outermost such D is one model in SageMaker PyTorch's form:
   weights its `model_fn` loads (a state dict, a Hugging Face directory, anything), served as the SageMaker
   PyTorch inference toolkit serves them, by the torchserve backend in worker processes
   (backends/torchserve/sagemaker_toolkit.py). Its version 1 holds D's entries, code/ included; its config.pbtxt
   is written here; its layout has no code_dir (the model runs its code itself).

A model found by rule 1 or 2 is served as `single_model_name`, unless its config.pbtxt gives a
name (Triton requires the two to match, and the user wrote the config). `code_dir` is the code/
nearest to the models: beside them, else in the closest enclosing directory.

The result is always a Triton-layout repository. Where D itself is not exactly one (rules 1 and 2,
or a repository with code/ or other directories in it) one is built in `work_dir` from symlinks to
the user's files; nothing is copied. find_layout owns `work_dir`: it empties it first, removing only
what it could have made (symlinks, directories of symlinks, and the config.pbtxt files it writes for rule 5),
and refuses anything else. Keep `work_dir` outside the root, or give it a hidden name.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from modelhost.backends import backend_for_filename
from modelhost.config.mar_manifest import MAR_SUFFIX
from modelhost.config.pbtxt import CONFIG_FILENAME, ConfigError, read_config
from modelhost.digits import is_digits
from modelhost.errors import invalid
from modelhost.store.paths import check_model_name

CODE_DIR = "code"
MAX_WRAPPING = 3
TOOLKIT_PROGRAM = "inference.py"
TOOLKIT_HANDLER = "modelhost.backends.torchserve.sagemaker_toolkit"
_WRITTEN = "# written by modelhost (store/layout.py)"
_TOOLKIT_CONFIG = f"""{_WRITTEN}: a SageMaker PyTorch model directory, served as its inference toolkit serves it
backend: "torchserve"
parameters {{ key: "handler" value: {{ string_value: "{TOOLKIT_HANDLER}" }} }}
parameters {{ key: "decode_input_request" value: {{ string_value: "false" }} }}
"""
_EXPECTED = (
    "expected one of: a Triton model repository (<model>/config.pbtxt and/or <model>/<version>/), "
    "a model directory (config.pbtxt and/or <version>/ at the top), or a single model file such as "
    "model.onnx at the top; each optionally with code/ beside it"
)


@dataclass(frozen=True, slots=True)
class ModelLayout:
    """The models found in a user's directory, as a Triton-layout repository."""

    repository: Path  # a Triton-layout repository root serving these models (may be a generated dir of symlinks)
    models: tuple[str, ...]  # model names in it
    code_dir: Path | None  # the code/ directory when present
    # Rule 2 read in place (find_layout's `in_place`): the directory that is its one model's directory and version 1
    # at once; `repository` is then that directory, not a repository.
    in_place: Path | None = None


def find_layout(root: Path, single_model_name: str, work_dir: Path, allow_empty: bool = False,
                program: str = TOOLKIT_PROGRAM, in_place: bool = False) -> ModelLayout:
    """Find the models under `root` by the rules above; raises INVALID_INPUT when there are none.

    With `allow_empty`, a root holding nothing (hidden entries and code/ aside) is an empty repository
    (models will be added to it later) rather than an error. Blocking (directory scans, config
    reads); call it off the event loop. `in_place`: a directory holding one model file and nothing else but its
    config.pbtxt is not linked into `work_dir` but given as `ModelLayout.in_place` (the links' three directories
    and a link cost a multi-model endpoint's first load about 1 ms of CPU on a slow disk).
    """
    _check_model_name(single_model_name)
    if not root.is_dir():
        raise invalid(f"model directory {root} does not exist or is not a directory")
    if allow_empty and not _entries(root):
        return ModelLayout(root, (), _code_dir(root))
    directory, code_dir, toolkit_dir = root, None, None
    for _ in range(MAX_WRAPPING + 1):
        code_dir = _code_dir(directory) or code_dir
        layout = _layout_of(directory, single_model_name, work_dir, code_dir, in_place)
        if layout is not None:
            return layout
        if toolkit_dir is None and (directory / CODE_DIR / program).is_file():
            toolkit_dir = directory
        inner = [entry for entry in _entries(directory) if entry.is_dir()]
        if len(inner) != 1:
            break
        directory = inner[0]
    if toolkit_dir is not None:
        return _toolkit_model(toolkit_dir, single_model_name, work_dir)
    found = ", ".join(sorted(entry.name for entry in _entries(directory, with_code=True))[:20]) or "nothing"
    raise invalid(f"no model found in {directory}: {_EXPECTED}; found: {found}")


def _layout_of(directory: Path, name: str, work_dir: Path, code_dir: Path | None,
               in_place: bool = False) -> ModelLayout | None:
    """Rules 1-3 for one directory; None when none applies."""
    if _versions(directory):
        name = _configured_name(directory) or name
        _reset_work_dir(work_dir)
        (work_dir / name).symlink_to(directory.absolute(), target_is_directory=True)
        return ModelLayout(work_dir, (name,), code_dir)
    model_files = [entry for entry in _entries(directory) if backend_for_filename(entry.name)]
    if len(model_files) > 1 and all(entry.name.endswith(MAR_SUFFIX) for entry in model_files):
        return _archive_store(model_files, work_dir, code_dir)
    if len(model_files) > 1:
        names = ", ".join(sorted(entry.name for entry in model_files))
        raise invalid(f"{directory} holds several model files ({names}); put each model in its own directory")
    if model_files:
        name = _configured_name(directory) or name
        if in_place and code_dir is None and {e.name for e in _entries(directory, with_code=True)} <= {
                model_files[0].name, CONFIG_FILENAME}:
            return ModelLayout(directory, (name,), None, in_place=directory)
        _link_single_file_model(directory, name, work_dir)
        return ModelLayout(work_dir, (name,), code_dir)
    if (directory / CONFIG_FILENAME).is_file():
        raise invalid(f"{directory} has a {CONFIG_FILENAME} but no version directory (e.g. 1/) or model file")
    subdirs = [entry for entry in _entries(directory) if entry.is_dir()]
    models = sorted(entry.name for entry in subdirs if _is_model_dir(entry))
    if not models:
        return None
    if len(models) == len(_entries(directory, with_code=True, dirs_only=True)):
        return ModelLayout(directory, tuple(models), code_dir)
    _reset_work_dir(work_dir)
    for model in models:
        (work_dir / model).symlink_to((directory / model).absolute(), target_is_directory=True)
    return ModelLayout(work_dir, tuple(models), code_dir)


def _link_single_file_model(directory: Path, name: str, work_dir: Path) -> None:
    """work_dir/<name>/1/<entry> -> each entry of `directory`; work_dir/<name>/config.pbtxt -> its config."""
    _reset_work_dir(work_dir)
    version_dir = work_dir / name / "1"
    version_dir.mkdir(parents=True)
    for entry in _entries(directory):
        if entry.name == CONFIG_FILENAME:
            (work_dir / name / CONFIG_FILENAME).symlink_to(entry.absolute())
        else:
            (version_dir / entry.name).symlink_to(entry.absolute(), target_is_directory=entry.is_dir())


def _archive_store(archives: list[Path], work_dir: Path, code_dir: Path | None) -> ModelLayout:
    """Rule 2's TorchServe model store: work_dir/<stem>/1/<archive> for each `<stem>.mar`."""
    _reset_work_dir(work_dir)
    names = []
    for archive in sorted(archives):
        name = archive.name[: -len(MAR_SUFFIX)]
        _check_model_name(name)
        (work_dir / name / "1").mkdir(parents=True)
        (work_dir / name / "1" / archive.name).symlink_to(archive.absolute(), target_is_directory=archive.is_dir())
        names.append(name)
    return ModelLayout(work_dir, tuple(names), code_dir)


def _toolkit_model(directory: Path, name: str, work_dir: Path) -> ModelLayout:
    """Rule 5: work_dir/<name>/1/<entry> -> each entry of `directory`, code/ included, and a config.pbtxt."""
    _reset_work_dir(work_dir)
    version_dir = work_dir / name / "1"
    version_dir.mkdir(parents=True)
    for entry in _entries(directory, with_code=True):
        (version_dir / entry.name).symlink_to(entry.absolute(), target_is_directory=entry.is_dir())
    (work_dir / name / CONFIG_FILENAME).write_text(_TOOLKIT_CONFIG)
    return ModelLayout(work_dir, (name,), None)


def _entries(directory: Path, with_code: bool = False, dirs_only: bool = False) -> list[Path]:
    """Visible entries of `directory` (code/ left out unless asked for)."""
    entries = []
    for entry in directory.iterdir():
        if entry.name.startswith(".") or (not with_code and entry.name == CODE_DIR and entry.is_dir()):
            continue
        if not dirs_only or entry.is_dir():
            entries.append(entry)
    return entries


def _versions(directory: Path) -> list[Path]:
    # Triton ignores version directories that are not numbers or that start with "0".
    return [
        entry for entry in _entries(directory)
        if entry.is_dir() and is_digits(entry.name) and not entry.name.startswith("0")
    ]


def _is_model_dir(directory: Path) -> bool:
    return (directory / CONFIG_FILENAME).is_file() or bool(_versions(directory))


def _code_dir(directory: Path) -> Path | None:
    code = directory / CODE_DIR
    return code if code.is_dir() else None


def _configured_name(directory: Path) -> str | None:
    try:
        config = read_config(directory)
    except ConfigError as exc:
        raise invalid(str(exc)) from None
    if config is None or not config.name:
        return None
    _check_model_name(config.name)
    return config.name


def _check_model_name(name: str) -> None:
    check_model_name(name)
    if name.startswith("."):  # hidden entries are never models here
        raise invalid(f"model name '{name}' cannot be a directory name here: hidden entries ('.' first) "
                      "are never models")


def _reset_work_dir(work_dir: Path) -> None:
    """Empty `work_dir` (creating it), removing only symlinks and directories that hold nothing else."""
    work_dir.mkdir(parents=True, exist_ok=True)
    for entry in work_dir.iterdir():
        if not _only_links(entry):
            raise invalid(f"work directory {work_dir} holds {entry}, which find_layout did not make; use another")
    for entry in work_dir.iterdir():
        if entry.is_symlink():
            entry.unlink()
        else:
            shutil.rmtree(entry)


def _only_links(path: Path) -> bool:
    """A symlink, or a directory tree whose files are all symlinks or config files find_layout wrote (os.walk
    does not follow links)."""
    if path.is_symlink():
        return True
    if not path.is_dir():
        return False
    return all(os.path.islink(os.path.join(parent, name)) or _written(os.path.join(parent, name))
               for parent, _, files in os.walk(path) for name in files)


def _written(path: str) -> bool:
    if os.path.basename(path) != CONFIG_FILENAME:
        return False
    with open(path, encoding="utf-8", errors="replace") as file:
        return file.readline().startswith(_WRITTEN)
