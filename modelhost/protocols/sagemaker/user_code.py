"""The user's code next to a model (`code/inference.py`, `code/lib/`, `code/requirements.txt`): install, import, read.

Each user module is imported under its own unique name, so two models' `inference.py` never share an entry in
`sys.modules`. `code/` and `code/lib/` go to the front of `sys.path` so sibling imports work; before a module is
imported, sibling modules cached from user code dirs under the names this code dir provides are dropped from
`sys.modules`, so each model imports its own `helpers.py` (modules already imported keep their references).
All functions here block (pip, imports); callers run them off the event loop. Imports are serialized by one lock.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import itertools
import re
import subprocess
import sys
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

from modelhost.errors import unavailable

REQUIREMENTS = "requirements.txt"
LIBRARY_DIR = "lib"
_PIP_TAIL_LINES = 8

_import_lock = threading.Lock()
_module_numbers = itertools.count(1)
_code_dirs: set[Path] = set()  # every code dir imported from so far (resolved): whose cached siblings may be dropped


def find_program(code_dir: Path, program: str) -> Path | None:
    """The user module `code_dir/program` (".py" added when missing), or None when there is no such file."""
    if Path(program).is_absolute() or ".." in Path(program).parts or not program.strip():
        raise unavailable(f"SAGEMAKER_PROGRAM must be a file name inside {code_dir}, got {program!r}")
    path = code_dir / (program if program.endswith(".py") else program + ".py")
    return path if path.is_file() else None


def install_requirements(code_dir: Path, target: Path, pip_args: Sequence[str] = ()) -> None:
    """pip-install `code_dir/requirements.txt` into `target` and put target, code/lib and code on sys.path.

    No requirements file: nothing happens. pip runs as `sys.executable -m pip` in `code_dir`, so relative paths in
    the file are relative to the code dir; `pip_args` are added to its command line (e.g. "--no-index").
    A failure raises ModelhostError (UNAVAILABLE) naming the file and quoting the end of pip's stderr.
    """
    requirements = code_dir / REQUIREMENTS
    if not requirements.is_file():
        return
    command = [
        sys.executable, "-m", "pip", "install", "--disable-pip-version-check", "--no-input",
        "--target", str(target.resolve()), "-r", str(requirements.resolve()), *pip_args,
    ]
    try:
        result = subprocess.run(command, cwd=code_dir, capture_output=True, text=True, check=False)
    except OSError as exc:
        raise unavailable(f"installing {requirements} failed: could not run pip: {exc}") from exc
    if result.returncode != 0:
        tail = "\n".join(line for line in result.stderr.splitlines() if line.strip())
        tail = "\n".join(tail.splitlines()[-_PIP_TAIL_LINES:]) or "(pip wrote nothing to stderr)"
        raise unavailable(f"installing {requirements} failed (pip exit status {result.returncode}):\n{tail}")
    with _import_lock:
        _to_front_of_path([code_dir, code_dir / LIBRARY_DIR, target])


def import_module(path: Path, module_tag: str = "") -> ModuleType:
    """Import the user module at `path` under a new unique name; ModelhostError (UNAVAILABLE) if it fails to import."""
    code_dir = path.parent
    name = _unique_name(module_tag, path.stem)
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise unavailable(f"cannot import {path}: not a Python source file")
    module = importlib.util.module_from_spec(spec)
    with _import_lock:
        _to_front_of_path([code_dir, code_dir / LIBRARY_DIR])
        _drop_cached_siblings(code_dir)
        _code_dirs.add(code_dir.resolve())
        importlib.invalidate_caches()  # code dirs may have been written after the path finders cached them
        # Registered before it runs: dataclasses, pickle and typing look their module up in sys.modules.
        sys.modules[name] = module
        try:
            spec.loader.exec_module(module)
        except (Exception, SystemExit) as exc:
            sys.modules.pop(name, None)
            raise unavailable(f"importing {path} failed: {type(exc).__name__}: {exc}") from exc
    return module


def forget_module(module: ModuleType) -> None:
    """Drop a module import_module() made from sys.modules (the model is unloaded); its sibling imports stay cached."""
    with _import_lock:
        if sys.modules.get(module.__name__) is module:
            del sys.modules[module.__name__]


def _unique_name(module_tag: str, stem: str) -> str:
    tag, stem = re.sub(r"\W", "_", module_tag), re.sub(r"\W", "_", stem)
    return f"_modelhost_user_{tag}_{next(_module_numbers)}_{stem}"


def _to_front_of_path(directories: list[Path]) -> None:
    entries = [str(directory.resolve()) for directory in directories if directory.is_dir()]
    sys.path[:] = entries + [entry for entry in sys.path if entry not in entries]


def _drop_cached_siblings(code_dir: Path) -> None:
    names = _top_level_names(code_dir) | _top_level_names(code_dir / LIBRARY_DIR)
    for cached_name, cached in list(sys.modules.items()):
        if cached_name.partition(".")[0] in names and _is_user_code(cached):
            del sys.modules[cached_name]


def _top_level_names(directory: Path) -> set[str]:
    if not directory.is_dir():
        return set()
    return {entry.stem if entry.suffix == ".py" else entry.name
            for entry in directory.iterdir() if entry.suffix == ".py" or entry.is_dir()}


def _is_user_code(module: ModuleType) -> bool:
    """Whether a cached module came from a code dir imported before (never a stdlib or installed module)."""
    locations = [getattr(module, "__file__", None), *list(getattr(module, "__path__", []) or [])]
    for location in locations:
        if location:
            resolved = Path(location).resolve()
            if any(resolved.is_relative_to(code_dir) for code_dir in _code_dirs):
                return True
    return False


def functions(module: ModuleType, path: Path, names: Sequence[str]) -> dict[str, Callable[..., Any]]:
    """The module's functions among `names`; ModelhostError (UNAVAILABLE) when one of them is not callable."""
    found = {}
    for name in names:
        value = getattr(module, name, None)
        if value is not None and not callable(value):
            raise unavailable(f"{path}: {name} must be a function, got {type(value).__name__}")
        if value is not None:
            found[name] = value
    return found


def takes_context(
    path: Path, name: str, function: Callable[..., Any], arguments: Sequence[str], optional: bool
) -> bool:
    """Whether `function` takes a trailing context after `arguments`, judged by what its signature binds.

    The toolkit counts parameters; binding also accepts defaults and *args. With `optional` False the context is
    required (TF Serving handlers). A signature that fits neither raises ModelhostError (UNAVAILABLE).
    """
    try:
        signature = inspect.signature(function)
    except (TypeError, ValueError):  # no signature to read (some builtins): call it the convention's usual way
        return not optional
    if _binds(signature, len(arguments) + 1):
        return True
    if optional and _binds(signature, len(arguments)):
        return False
    expected = ", ".join(arguments) + ("[, context]" if optional else ", context")
    raise unavailable(f"{path}: {name}{signature} cannot be called as {name}({expected})")


def _binds(signature: inspect.Signature, count: int) -> bool:
    try:
        signature.bind(*range(count))
    except TypeError:
        return False
    return True
