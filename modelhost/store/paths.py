"""Text from a client (or a model's config) that becomes a file system path: checked here, in one place.

Three rules, each raising INVALID_INPUT with a message that names the field, the value and the rule:

- `check_model_name`: a model name is one directory entry's name (Triton's rule): not empty or blank, not "."
  or ".." (spaces around them included, as Triton), no "/" or "\\", no NUL or other control character, at most
  MAX_NAME_BYTES bytes in UTF-8. The messages carry Triton's words, which its QA and clients match.
- `check_relative`: a relative path below some directory (a file of a load request, a config's
  default_model_filename, a SageMaker TargetModel): not absolute, no ".." component, no empty
  component, no backslash, no control character.
- `inside` / `within`: a path joined from a checked relative part stays below its root; `within`
  resolves both (symlinks followed) for locations a client names whole, such as SageMaker's /models url.

Symlinks already in a model repository are the operator's and are followed: the client can only choose
among the entries the repository holds, never add a ".." or an absolute path (see docs/model_management.md,
"Names and paths"). An archive's symlinks are checked when it is unpacked (store/unpack.py).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path, PurePosixPath

from modelhost.errors import invalid

MAX_NAME_BYTES = 255  # a file name's limit on Linux file systems; a longer name cannot name a directory
NAME_RULE = ("a model name is one directory name: not empty or blank, not '.' or '..', and without '/', '\\', "
             "NUL or other control characters")
_EMPTY = "Model name cannot be empty. Please enter a valid name to deploy."  # Triton's words
_TRAVERSAL = "model name must not contain path traversal characters"  # Triton's words


def _control(text: str) -> bool:
    return any(ord(char) < 32 or ord(char) == 127 for char in text)


def name_problem(name: str) -> str | None:
    """What breaks the model name rule in `name`, or None when it is a valid name."""
    if not name.strip():
        return f"is empty or blank ({_EMPTY})"
    if name.strip() in (".", ".."):
        return f"is a link to a directory, not a name ({_TRAVERSAL})"
    if "/" in name or "\\" in name:
        return f"contains a path separator ('/' or '\\') ({_TRAVERSAL})"
    if _control(name):
        return "contains a NUL or other control character"
    if len(name.encode("utf-8", "surrogatepass")) > MAX_NAME_BYTES:
        return f"is longer than {MAX_NAME_BYTES} bytes"
    return None


def check_model_name(name: str, what: str = "model name") -> str:
    """`name` when it is a model name by the rule above; raises INVALID_INPUT naming it and the rule."""
    problem = name_problem(name)
    if problem is not None:
        raise invalid(f"{what} {name!r} {problem}: {NAME_RULE}")
    return name


def check_relative(text: str, what: str) -> PurePosixPath:
    """`text` as a relative path that cannot leave its directory ("./a/b" -> "a/b"); raises INVALID_INPUT
    naming `what` (e.g. "target model") and the problem."""
    if not text:
        raise invalid(f"{what} is empty: it must name a file by a relative path")
    if _control(text):
        raise invalid(f"{what} {text!r} contains control characters")
    if "\\" in text:
        raise invalid(f"{what} '{text}' contains a backslash; use '/' between path components")
    if text.startswith("/"):
        raise invalid(f"{what} '{text}' must be a relative path (no leading '/')")
    parts = text.split("/")
    if ".." in parts:
        raise invalid(f"{what} '{text}' must not contain '..' components")
    if "" in parts:
        raise invalid(f"{what} '{text}' has an empty path component")
    kept = [part for part in parts if part != "."]
    if not kept:
        raise invalid(f"{what} '{text}' names no file")
    return PurePosixPath(*kept)


def inside(root: Path, relative: str, what: str) -> Path:
    """`root / relative` for a `relative` that passes check_relative (so it cannot climb out of `root`)."""
    return root.joinpath(*check_relative(relative, what).parts)


def within(path: Path | str, roots: Iterable[Path | str]) -> bool:
    """Whether `path`, resolved (symlinks followed, a relative path from the working directory), lies in
    one of `roots`, each resolved the same way. Blocking (reads links)."""
    real = os.path.realpath(path)
    for root in roots:
        real_root = os.path.realpath(root)
        if real == real_root or real.startswith(real_root.rstrip(os.sep) + os.sep):
            return True
    return False
