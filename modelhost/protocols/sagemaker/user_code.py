"""A SageMaker model's code (`code/inference.py`, `code/lib/`, `code/requirements.txt`): install, import, read.

`inference.py` is imported as all user code is (modelhost.user_code), with `code/` and `code/lib/` searched.
All functions here block (pip, imports); callers run them off the event loop.
"""

from __future__ import annotations

import inspect
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

from modelhost import user_code as shared
from modelhost.errors import unavailable

REQUIREMENTS = "requirements.txt"
LIBRARY_DIR = "lib"
_PIP_TAIL_LINES = 8


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
    shared.put_first_on_path([code_dir, code_dir / LIBRARY_DIR, target])


def import_module(path: Path, module_tag: str = "") -> ModuleType:
    """Import the user module at `path` under a new unique name, with code/lib searched too (modelhost.user_code);
    ModelhostError (UNAVAILABLE) if it fails to import."""
    name = shared.unique_module_name(module_tag, path.stem)
    try:
        return shared.import_user_module(path, name, [path.parent / LIBRARY_DIR])
    except shared.NotAModuleError as exc:
        raise unavailable(f"cannot import {path}: not a Python source file") from exc
    except (Exception, SystemExit) as exc:
        raise unavailable(f"importing {path} failed: {type(exc).__name__}: {exc}") from exc


forget_module = shared.forget_module


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
