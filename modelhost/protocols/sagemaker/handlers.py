"""A user's `code/inference.py`, loaded as the handler of the convention it follows: the SageMaker TF Serving
container's (tfs_handler.py) or the inference toolkit's (toolkit_handler.py). load_handler() imports the module once
per model load; the contract every handler keeps is handler_api.py's.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

from modelhost.errors import ModelhostError, unavailable
from modelhost.protocols.sagemaker import user_code
from modelhost.protocols.sagemaker.handler_api import Handler, Hook
from modelhost.protocols.sagemaker.tfs_handler import TFS_HOOKS, TfsHandler
from modelhost.protocols.sagemaker.toolkit_handler import TOOLKIT_HOOKS, ToolkitHandler

install_requirements = user_code.install_requirements  # public here: the front-end imports one module


def load_handler(code_dir: Path | None, program: str = "inference.py", module_tag: str = "") -> Handler | None:
    """The handler for `code_dir/program`, or None when there is no such module; blocking (imports user code).

    `module_tag` (e.g. the model name) goes into the module's unique name. Raises ModelhostError (UNAVAILABLE)
    when the module fails to import or breaks a convention's rules.
    """
    if code_dir is None:
        return None
    path = user_code.find_program(code_dir, program)
    if path is None:
        return None
    module = user_code.import_module(path, module_tag)
    try:
        return _handler_for(module, path)
    except ModelhostError:
        user_code.forget_module(module)
        raise


def _handler_for(module: ModuleType, path: Path) -> Handler:
    functions = user_code.functions(module, path, (*TFS_HOOKS, *TOOLKIT_HOOKS))
    tfs = [name for name in TFS_HOOKS if name in functions]
    toolkit = [name for name in TOOLKIT_HOOKS if name in functions]
    if tfs and toolkit:
        raise unavailable(f"{path} defines both TF Serving handlers ({', '.join(tfs)}) and inference toolkit "
                          f"functions ({', '.join(toolkit)}); use one convention")
    if tfs:
        if "handler" not in functions and len(tfs) == 1:
            missing = "output_handler" if tfs == ["input_handler"] else "input_handler"
            raise unavailable(f"{path} defines {tfs[0]} without {missing}; define both, or handler(data, context)")
        names = ["handler"] if "handler" in functions else ["input_handler", "output_handler"]
        return TfsHandler(module, path, {name: _hook(path, name, functions[name]) for name in names})
    if toolkit:
        if "transform_fn" in functions and {"input_fn", "predict_fn", "output_fn"} & functions.keys():
            raise unavailable(f"{path}: transform_fn cannot be used together with input_fn, predict_fn or output_fn")
        hooks = {name: _hook(path, name, functions[name]) for name in toolkit}
        return ToolkitHandler(module, path, hooks)
    raise unavailable(f"{path} defines none of handler, input_handler/output_handler (TF Serving container) or "
                      f"{', '.join(TOOLKIT_HOOKS)} (SageMaker inference toolkit)")


def _hook(path: Path, name: str, function: Callable[..., Any]) -> Hook:
    if name in TOOLKIT_HOOKS:
        return Hook(name, function, user_code.takes_context(path, name, function, TOOLKIT_HOOKS[name], True))
    argument = "response" if name == "output_handler" else "data"
    return Hook(name, function, user_code.takes_context(path, name, function, (argument,), False))
