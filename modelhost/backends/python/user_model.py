"""A Python model's own code: import its model.py, make its `Model`, call its hooks, check what execute returns.

Shared by both modes of the Python backend: an in-process model calls it in the server, an isolated one in
its worker process (so this module imports nothing the worker does not need: no config, no protocols).
The interface model.py implements is documented in modelhost/backends/python/backend.py and docs/backends/python.md.
"""

from __future__ import annotations

import sys
import traceback
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

import numpy as np

from modelhost import user_code
from modelhost.backends.python import triton_utils
from modelhost.errors import ErrorKind, ModelhostError
from modelhost.types import DATATYPE_DTYPES, format_shape
from modelhost.user_code import NotAModuleError, import_user_module

if TYPE_CHECKING:
    from modelhost.backends.python.triton_model import TritonUserModel


@dataclass(frozen=True, slots=True)
class OutputRule:
    """An output as execute must return it: V2 datatype and full shape (batch dim first when batching)."""

    name: str
    datatype: str
    shape: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class UserCodeSpec:
    """Everything needed to load one instance's model.py, in this process or a worker (so it pickles)."""

    path: str  # model.py
    module_name: str  # unique per model, version, instance and load
    label: str  # "Python model 'm' version 1 instance 0", for messages
    args: dict[str, Any]  # initialize's argument
    outputs: tuple[OutputRule, ...]
    batching: bool  # max_batch_size > 0: the first dim of every input and output is the batch

    def environment(self) -> dict[str, str]:
        return {}

    def load(self) -> UserModel | TritonUserModel:
        return load_user_model(self)


class UserCodeError(Exception):
    """model.py cannot be used: it failed to import, lacks `Model.execute`, or its constructor or initialize
    raised. `message` is one line (for the load error); `details` the traceback (for the log)."""

    def __init__(self, message: str, details: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.details = details


class ExecuteError(ModelhostError):
    """execute raised: INTERNAL, naming the model and the exception; `details` is the traceback for the log."""

    def __init__(self, message: str, details: str) -> None:
        super().__init__(ErrorKind.INTERNAL, message)
        self.details = details


class UserModel:
    """One loaded instance of model.py's `Model`; not thread-safe (the scheduler calls one batch at a time)."""

    def __init__(self, spec: UserCodeSpec, instance: Any) -> None:
        self._spec = spec
        self._instance = instance
        self._rules = {rule.name: rule for rule in spec.outputs}

    def execute(self, inputs: dict[str, np.ndarray], outputs: list[str]) -> dict[str, np.ndarray]:
        """Run execute on one batch; return the requested outputs, checked against the config."""
        try:
            results = self._instance.execute(inputs)
        except ModelhostError:
            raise  # the model's own verdict, e.g. modelhost.errors.invalid(...) for a bad input value
        except (Exception, SystemExit) as exc:
            raise execute_error(self._spec, exc) from exc
        rows = next(iter(inputs.values())).shape[0] if self._spec.batching and inputs else None
        return check_outputs(self._spec.label, self._rules, results, outputs, rows)

    def finalize(self) -> None:
        """Call finalize if the model has one, then forget the module; raises UserCodeError if finalize raised."""
        try:
            finalize = getattr(self._instance, "finalize", None)
            if finalize is not None:
                finalize()
        except (Exception, SystemExit) as exc:
            raise UserCodeError(f"{self._spec.label}: finalize raised {_last_line(exc, self._spec.path)}",
                                _user_traceback(exc)) from exc
        finally:
            self._instance = None
            sys.modules.pop(self._spec.module_name, None)


def execute_error(spec: UserCodeSpec, exc: BaseException) -> ExecuteError:
    """The error of a request whose execute raised `exc`."""
    return ExecuteError(f"{spec.label}: execute raised {_last_line(exc, spec.path)}", _user_traceback(exc))


def load_user_model(spec: UserCodeSpec) -> UserModel | TritonUserModel:
    """Import model.py, construct its Model and run initialize(args); raises UserCodeError. A model.py written
    for Triton's Python backend (`class TritonPythonModel`, no `Model`) loads as a TritonUserModel."""
    module = import_model(spec)
    try:
        model_class = getattr(module, "Model", None)
        triton_class = getattr(module, "TritonPythonModel", None)
        if not isinstance(model_class, type) and isinstance(triton_class, type):
            from modelhost.backends.python.triton_model import load_triton_model

            return load_triton_model(spec, triton_class)
        if not isinstance(model_class, type):
            raise UserCodeError(f"{spec.path} defines no class Model (nor Triton's class TritonPythonModel)")
        if not callable(getattr(model_class, "execute", None)):
            raise UserCodeError(f"{spec.path}: class Model has no execute(self, inputs) method")
        instance = call_user(spec, "Model()", model_class)
        initialize = getattr(instance, "initialize", None)
        if initialize is not None:
            call_user(spec, "initialize", initialize, dict(spec.args))
    except BaseException:
        sys.modules.pop(spec.module_name, None)
        raise
    return UserModel(spec, instance)


def import_model(spec: UserCodeSpec) -> ModuleType:
    triton_utils.install()  # a Triton model.py imports triton_python_backend_utils at its top
    try:
        return import_user_module(Path(spec.path), spec.module_name)
    except NotAModuleError as exc:
        raise UserCodeError(str(exc)) from None
    except (Exception, SystemExit) as exc:
        raise UserCodeError(f"{spec.path} failed to import: {_last_line(exc, spec.path)}",
                            _user_traceback(exc)) from exc


def call_user(spec: UserCodeSpec, what: str, function: Any, *args: Any) -> Any:
    try:
        return function(*args)
    except (Exception, SystemExit) as exc:
        raise UserCodeError(f"{spec.path}: {what} raised {_last_line(exc, spec.path)}",
                            _user_traceback(exc)) from exc


def check_outputs(
    label: str, rules: dict[str, OutputRule], results: Any, outputs: list[str], rows: int | None,
    partial: bool = False, shapes: bool = True,
) -> dict[str, np.ndarray]:
    """The requested `outputs` of what execute returned, each checked for presence, dtype and (with `shapes`)
    shape.

    `rows` is the batch size when the model batches; `partial`: outputs execute left out are left out (a Triton
    model's response may hold some of them). Nothing is cast: a wrong dtype is the model's bug.
    """
    if not isinstance(results, dict):
        raise _bad_output(label, f"execute returned a {type(results).__name__}, not a dict of numpy arrays")
    checked = {}
    for name in outputs:
        if name not in results:
            if partial:
                continue
            returned = ", ".join(repr(str(n)) for n in results) or "none"
            raise _bad_output(label, f"execute returned no output '{name}' (it returned {returned})")
        array = results[name]
        if not isinstance(array, np.ndarray):
            raise _bad_output(label, f"output '{name}' is a {type(array).__name__}, not a numpy array")
        rule = rules[name]
        if rule.datatype == "BYTES":
            if array.dtype.kind not in "OSU":
                raise _bad_output(label, f"output '{name}' has dtype {array.dtype}, but config.pbtxt declares "
                                         "BYTES (TYPE_STRING): return an object array of bytes")
        elif array.dtype != DATATYPE_DTYPES[rule.datatype]:
            raise _bad_output(label, f"output '{name}' has dtype {array.dtype}, but config.pbtxt declares "
                                     f"{rule.datatype} ({DATATYPE_DTYPES[rule.datatype]}); modelhost does not cast")
        if shapes:
            _check_shape(label, rule, array.shape, rows)
        checked[name] = array
    return checked


def _check_shape(label: str, rule: OutputRule, shape: tuple[int, ...], rows: int | None) -> None:
    if rows is not None and (not shape or shape[0] != rows):
        first = shape[0] if shape else "no batch dimension"
        raise _bad_output(label, f"output '{rule.name}' has shape {format_shape(shape)}: batch size {first}, "
                                 f"but the batch has {rows} rows")
    if len(shape) != len(rule.shape) or any(d != -1 and d != s for d, s in zip(rule.shape, shape)):
        raise _bad_output(label, f"output '{rule.name}' has shape {format_shape(shape)}, but config.pbtxt "
                                 f"declares {format_shape(rule.shape)}")


def _bad_output(label: str, problem: str) -> ModelhostError:
    return ModelhostError(ErrorKind.INTERNAL, f"{label}: {problem}")


def _last_line(exc: BaseException, path: str) -> str:
    """The traceback's last line ("ValueError: ..."), with the line of model.py it came from when known."""
    line = traceback.format_exception_only(type(exc), exc)[-1].strip()
    lineno = exc.lineno if isinstance(exc, SyntaxError) and exc.filename == path else None
    for frame in traceback.extract_tb(exc.__traceback__):
        if frame.filename == path:
            lineno = frame.lineno
    return f"{line} ({Path(path).name} line {lineno})" if lineno else line


def _user_traceback(exc: BaseException) -> str:
    """The traceback from the first frame outside this module and the import machinery: the model's own."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None and (
        tb.tb_frame.f_code.co_filename in (__file__, user_code.__file__, "<frozen importlib._bootstrap>",
                                           "<frozen importlib._bootstrap_external>")
    ):
        tb = tb.tb_next
    return "".join(traceback.format_exception(type(exc), exc, tb))
