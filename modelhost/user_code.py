"""Importing user code: a Python model's `model.py` and a SageMaker model's `inference.py`, one way.

Each module is imported from its file under a name unique to the load, so two models' `model.py` never share
an entry in `sys.modules`, and it is registered there before it runs (dataclasses, pickle and typing look
their module up). The directories it searches (its own, and `code/lib/` for `inference.py`) go to the front of
`sys.path` and stay there, as Triton's Python backend and the SageMaker toolkit leave them, so imports made
later inside `execute` or a handler still find the model's own modules. Before a module runs, sibling modules
cached from other user code directories under the names this one provides are dropped from `sys.modules`, so
each model imports its own `helpers.py` (modules already imported keep their references).

Imports are serialized by one lock; they block, so callers run them off the event loop. Light on purpose:
the Python backend's worker processes import this module.
"""

from __future__ import annotations

import importlib
import importlib.util
import itertools
import re
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

_import_lock = threading.Lock()
_module_numbers = itertools.count(1)
_code_dirs: set[Path] = set()  # every directory user code was imported from (resolved)


class NotAModuleError(Exception):
    """The file cannot be imported as a Python module."""


def unique_module_name(tag: str, stem: str) -> str:
    tag, stem = re.sub(r"\W", "_", tag), re.sub(r"\W", "_", stem)
    return f"_modelhost_user_{tag}_{next(_module_numbers)}_{stem}"


def import_user_module(path: Path, name: str, search_dirs: Sequence[Path] = ()) -> ModuleType:
    """Import the file at `path` as module `name`, with its directory and `search_dirs` first on sys.path.

    Raises NotAModuleError, or whatever running the module raised (SystemExit included), after taking it out
    of sys.modules again.
    """
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise NotAModuleError(f"{path} cannot be imported as a Python module")
    module = importlib.util.module_from_spec(spec)
    directories = [path.parent, *search_dirs]
    with _import_lock:
        _put_first(directories)
        _drop_cached_siblings(directories)
        _code_dirs.update(directory.resolve() for directory in directories if directory.is_dir())
        importlib.invalidate_caches()  # the directories may have been written after the path finders cached them
        sys.modules[name] = module
        try:
            spec.loader.exec_module(module)
        except BaseException:
            sys.modules.pop(name, None)
            raise
    return module


def forget_module(module: ModuleType) -> None:
    """Drop a module import_user_module() made from sys.modules (its model is unloaded); its siblings stay cached."""
    with _import_lock:
        if sys.modules.get(module.__name__) is module:
            del sys.modules[module.__name__]


def put_first_on_path(directories: Sequence[Path]) -> None:
    """The directories that exist, first on sys.path in the given order (moved there if already on it)."""
    with _import_lock:
        _put_first(directories)


def _put_first(directories: Sequence[Path]) -> None:
    entries = [str(directory.resolve()) for directory in directories if directory.is_dir()]
    sys.path[:] = entries + [entry for entry in sys.path if entry not in entries]


def _drop_cached_siblings(directories: Sequence[Path]) -> None:
    names = set().union(*(_top_level_names(directory) for directory in directories))
    for cached_name, cached in list(sys.modules.items()):
        if cached_name.partition(".")[0] in names and _is_user_code(cached):
            del sys.modules[cached_name]


def _top_level_names(directory: Path) -> set[str]:
    if not directory.is_dir():
        return set()
    return {entry.stem if entry.suffix == ".py" else entry.name
            for entry in directory.iterdir() if entry.suffix == ".py" or entry.is_dir()}


def _is_user_code(module: ModuleType) -> bool:
    """Whether a cached module came from a user code directory (never a stdlib or installed module)."""
    locations = [getattr(module, "__file__", None), *list(getattr(module, "__path__", []) or [])]
    for location in locations:
        if location:
            resolved = Path(location).resolve()
            if any(resolved.is_relative_to(code_dir) for code_dir in _code_dirs):
                return True
    return False
