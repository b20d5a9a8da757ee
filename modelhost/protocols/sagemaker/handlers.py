"""The user's `code/inference.py` conventions (protocols §6.5): SageMaker TF Serving handlers and toolkit functions.

TF Serving container: `handler(data, context)`, or `input_handler(data, context)` -> TFS REST predict body and
`output_handler(response, context)`; each answers `(body, content_type)`. Inference toolkit: `model_fn`, `input_fn`,
`predict_fn`, `output_fn` (any subset; modelhost's defaults fill the rest) or `transform_fn`, each with an optional
trailing context argument. Contract: load_handler() imports the module once per model load; Handler.load_model()
runs model_fn once; Handler.invoke() serves one request and may run in several worker threads at once. Whatever
user code raises becomes HandlerError (the status and message the front-end answers); exceptions from the
injected Defaults (modelhost's own code, ModelhostError expected) pass through unchanged.
"""

from __future__ import annotations

import dataclasses
import http
import io
import json
import logging
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, NamedTuple, Protocol
from wsgiref.headers import Headers

from modelhost.client_log import client_log
from modelhost.errors import ModelhostError, unavailable
from modelhost.protocols.sagemaker import user_code

log = logging.getLogger("modelhost.sagemaker")

install_requirements = user_code.install_requirements  # public here: the front-end imports one module

DEFAULT_CONTENT_TYPE = "application/json"  # what the TFS container's Context says when a header is missing
_UTF8_TYPES = ("application/json", "text/csv")  # the toolkit hands these to input_fn as str (exact match)
_TFS_HOOKS = ("handler", "input_handler", "output_handler")
# Toolkit function -> its arguments before the optional context.
_TOOLKIT_HOOKS = {
    "pre_model_fn": ("model_dir",),
    "model_fn": ("model_dir",),
    "model_warmup_fn": ("model_dir", "model"),
    "input_fn": ("input_data", "content_type"),
    "predict_fn": ("data", "model"),
    "output_fn": ("prediction", "accept"),
    "transform_fn": ("model", "input_data", "content_type", "accept"),
}


class HandlerError(Exception):
    """User code failed or answered something unusable: the front-end answers `status` with `message`."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass(frozen=True)
class RequestInfo:
    """One invocation as the front-end parsed it; `accept` is already resolved (missing or */* -> the default)."""

    body: bytes
    content_type: str
    accept: str
    custom_attributes: str = ""
    model_name: str = ""
    model_version: str = ""
    rest_uri: str = ""  # where modelhost serves this model's TF Serving REST :predict
    grpc_port: int | None = None  # where it serves TF Serving's gRPC API (None: gRPC is off)
    channel: Any = None  # a grpc.Channel to that port
    # What user code sets for the response (ToolkitContext.set_response_header): X-Amzn-SageMaker-Custom-Attributes.
    response_headers: dict[str, str] = dataclasses.field(default_factory=dict)


class TfsResponse:
    """What TF Serving REST answered, shaped like the `requests.Response` the TFS container gives output_handler."""

    def __init__(self, status_code: int, content: bytes, content_type: str = "application/json", url: str = "") -> None:
        self.status_code = status_code
        self.content = bytes(content)
        self.url = url
        self.content_type = content_type
        self.encoding = "utf-8"
        self.headers = Headers([("Content-Type", content_type), ("Content-Length", str(len(self.content)))])

    @property
    def ok(self) -> bool:
        return self.status_code < 400

    @property
    def reason(self) -> str:
        try:
            return http.HTTPStatus(self.status_code).phrase
        except ValueError:
            return ""

    @property
    def text(self) -> str:
        return self.content.decode("utf-8", errors="replace")

    def json(self, **kwargs: Any) -> Any:
        return json.loads(self.content, **kwargs)

    def raise_for_status(self) -> None:
        """Raise TfsHTTPError for a 4xx/5xx answer, as requests does; its status_code becomes the client's status."""
        if not self.ok:
            raise TfsHTTPError(self)


class TfsHTTPError(Exception):
    """TfsResponse.raise_for_status() on an error answer (requests.HTTPError's role)."""

    def __init__(self, response: TfsResponse) -> None:
        side = "Client" if response.status_code < 500 else "Server"
        super().__init__(f"{response.status_code} {side} Error: {response.reason} for url: {response.url}: "
                         f"{response.text[:500]}")
        self.response = response
        self.status_code = response.status_code


class Defaults(Protocol):
    """modelhost's own behaviour for whatever the user module leaves out; all blocking."""

    def decode(self, body: bytes, content_type: str) -> Any: ...  # default input_fn
    def predict(self, data: Any, model: Any) -> Any: ...  # default predict_fn: runs the served model
    def encode(self, prediction: Any, accept: str) -> tuple[bytes, str]: ...  # default output_fn
    def tfs_predict(self, body: bytes) -> TfsResponse: ...  # what TFS REST :predict answers this body


class Context(NamedTuple):
    """The TF Serving container's context argument, field for field: `grpc_port` and `channel` reach this server's
    own TF Serving gRPC API (PredictionService), None where gRPC is off."""

    model_name: str
    model_version: str | None
    method: str
    rest_uri: str
    grpc_port: int | None
    channel: Any
    custom_attributes: str | None
    request_content_type: str
    accept_header: str
    content_length: int


@dataclass(frozen=True)
class ToolkitContext:
    """The inference toolkit's context argument: the model, and the request being served (None at load time)."""

    model_name: str
    model_version: str
    model_dir: str
    system_properties: dict[str, Any]
    request_content_type: str | None = None
    accept_header: str | None = None
    custom_attributes: str | None = None
    response_headers: dict[str, str] = dataclasses.field(default_factory=dict)

    def set_response_header(self, idx: int, key: str, value: str) -> None:
        """As TorchServe's context (which the toolkit hands its functions): the header goes with the response;
        X-Amzn-SageMaker-Custom-Attributes becomes the caller's response CustomAttributes. `idx`: the request's
        index in the batch (always 0 here)."""
        self.response_headers[str(key)] = str(value)


@dataclass(frozen=True)
class _Hook:
    """One user function, called with or without the trailing context; what it raises becomes HandlerError."""

    name: str
    function: Callable[..., Any]
    takes_context: bool

    def __call__(self, context: Any, *args: Any) -> Any:
        try:
            return self.function(*args, context) if self.takes_context else self.function(*args)
        except (Exception, SystemExit) as exc:
            raise _handler_error(self.name, exc) from exc


class Handler(ABC):
    """A loaded user module following one convention ("tfs" or "toolkit")."""

    convention: str

    def __init__(self, module: ModuleType, source: Path) -> None:
        self.module = module
        self.source = source

    @abstractmethod
    def load_model(self, model_dir: Path, served_model: Any, model_name: str = "", model_version: str = "") -> None:
        """Prepare for requests once per model load (model_fn and its hooks); blocking.

        A failure raises ModelhostError (UNAVAILABLE); the module stays imported until close().
        """

    @abstractmethod
    def invoke(self, request: RequestInfo, defaults: Defaults) -> tuple[bytes, str]:
        """The response body and content type for one request; blocking; raises HandlerError."""

    def close(self) -> None:
        """Forget the user module (the model is unloaded); the handler is not used again."""
        user_code.forget_module(self.module)


class TfsHandler(Handler):
    """`handler(data, context)`, or `input_handler` -> TF Serving REST predict -> `output_handler`."""

    convention = "tfs"

    def __init__(self, module: ModuleType, source: Path, hooks: dict[str, _Hook]) -> None:
        super().__init__(module, source)
        self._handler = hooks.get("handler")
        self._input_handler = hooks.get("input_handler")
        self._output_handler = hooks.get("output_handler")

    def load_model(self, model_dir: Path, served_model: Any, model_name: str = "", model_version: str = "") -> None:
        """Nothing to prepare: TF Serving handlers reach the model through its REST predict."""

    def invoke(self, request: RequestInfo, defaults: Defaults) -> tuple[bytes, str]:
        context = _tfs_context(request)
        data = io.BytesIO(request.body)
        if self._handler is not None:
            return _pair(self._handler(context, data), "handler")
        assert self._input_handler is not None and self._output_handler is not None
        body = self._input_handler(context, data)
        if isinstance(body, str):
            body = body.encode("utf-8")
        elif not isinstance(body, (bytes, bytearray, memoryview)):
            raise HandlerError(500, f"input_handler returned {_describe(body)}; expected a str or bytes request body")
        # As in the TFS container, output_handler sees every answer, errors included, and decides.
        answer = defaults.tfs_predict(bytes(body))
        response = TfsResponse(answer.status_code, answer.content, answer.content_type, request.rest_uri)
        return _pair(self._output_handler(context, response), "output_handler")


class ToolkitHandler(Handler):
    """model_fn / input_fn / predict_fn / output_fn (any subset, defaults for the rest) or transform_fn."""

    convention = "toolkit"

    def __init__(self, module: ModuleType, source: Path, hooks: dict[str, _Hook]) -> None:
        super().__init__(module, source)
        self._hooks = hooks
        self._context: ToolkitContext | None = None
        self._model: Any = None

    def load_model(self, model_dir: Path, served_model: Any, model_name: str = "", model_version: str = "") -> None:
        directory = str(model_dir)
        context = ToolkitContext(model_name, model_version, directory, {"model_dir": directory, "gpu_id": None})
        hooks = self._hooks
        try:
            if "pre_model_fn" in hooks:
                hooks["pre_model_fn"](context, directory)
            model = hooks["model_fn"](context, directory) if "model_fn" in hooks else served_model
            if "model_warmup_fn" in hooks:
                hooks["model_warmup_fn"](context, directory, model)
        except HandlerError as error:
            raise unavailable(f"{self.source}: {error.message}") from error
        self._context, self._model = context, model

    def invoke(self, request: RequestInfo, defaults: Defaults) -> tuple[bytes, str]:
        if self._context is None:
            raise unavailable(f"{self.source}: the model is not loaded (load_model was not called)")
        context = dataclasses.replace(
            self._context, request_content_type=request.content_type, accept_header=request.accept,
            custom_attributes=request.custom_attributes or None, response_headers=request.response_headers,
        )
        hooks, model, content_type, accept = self._hooks, self._model, request.content_type, request.accept
        if "transform_fn" in hooks:
            result = hooks["transform_fn"](context, model, _input_data(request), content_type, accept)
            return _toolkit_response(result, "transform_fn", accept)
        if "input_fn" in hooks:
            data = hooks["input_fn"](context, _input_data(request), content_type)
        else:
            data = defaults.decode(request.body, content_type)
        if "predict_fn" in hooks:
            prediction = hooks["predict_fn"](context, data, model)
        else:
            prediction = defaults.predict(data, model)
        if "output_fn" not in hooks:
            return defaults.encode(prediction, accept)
        return _toolkit_response(hooks["output_fn"](context, prediction, accept), "output_fn", accept)


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
    functions = user_code.functions(module, path, (*_TFS_HOOKS, *_TOOLKIT_HOOKS))
    tfs = [name for name in _TFS_HOOKS if name in functions]
    toolkit = [name for name in _TOOLKIT_HOOKS if name in functions]
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
                      f"{', '.join(_TOOLKIT_HOOKS)} (SageMaker inference toolkit)")


def _hook(path: Path, name: str, function: Callable[..., Any]) -> _Hook:
    if name in _TOOLKIT_HOOKS:
        return _Hook(name, function, user_code.takes_context(path, name, function, _TOOLKIT_HOOKS[name], True))
    argument = "response" if name == "output_handler" else "data"
    return _Hook(name, function, user_code.takes_context(path, name, function, (argument,), False))


def _tfs_context(request: RequestInfo) -> Context:
    return Context(
        model_name=request.model_name,
        model_version=request.model_version or None,
        method=_tfs_attribute(request.custom_attributes, "tfs-method") or "predict",
        rest_uri=request.rest_uri,
        grpc_port=request.grpc_port,
        channel=request.channel,
        custom_attributes=request.custom_attributes or None,
        request_content_type=request.content_type or DEFAULT_CONTENT_TYPE,
        accept_header=request.accept or DEFAULT_CONTENT_TYPE,
        content_length=len(request.body),
    )


def _tfs_attribute(custom_attributes: str, key: str) -> str | None:
    """A `key=value` entry of X-Amzn-SageMaker-Custom-Attributes (comma-separated), as the TFS container reads it."""
    for entry in custom_attributes.split(","):
        name, _, value = entry.strip().partition("=")
        if name == key and value:
            return value
    return None


def _input_data(request: RequestInfo) -> str | bytes:
    if request.content_type not in _UTF8_TYPES:
        return request.body
    try:
        return request.body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise HandlerError(400, f"request body is not UTF-8 text as {request.content_type} requires: {exc}") from exc


def _pair(result: Any, name: str) -> tuple[bytes, str]:
    if isinstance(result, (tuple, list)) and len(result) == 2:
        body, content_type = result
        if isinstance(body, (bytes, bytearray, memoryview, str)) and isinstance(content_type, str):
            return _as_bytes(body), content_type
    raise HandlerError(500, f"{name} returned {_describe(result)}; expected a (body, content_type) pair "
                            "with a bytes or str body and a str content type")


def _toolkit_response(result: Any, name: str, accept: str) -> tuple[bytes, str]:
    if isinstance(result, (bytes, bytearray, memoryview, str)):
        return _as_bytes(result), accept.split(",")[0].strip()
    if isinstance(result, tuple):
        return _pair(result, name)
    raise HandlerError(500, f"{name} returned {_describe(result)}; expected bytes, str or a (body, content_type) pair")


def _as_bytes(body: bytes | bytearray | memoryview | str) -> bytes:
    return body.encode("utf-8") if isinstance(body, str) else bytes(body)


def _describe(value: Any) -> str:
    if isinstance(value, (tuple, list)):
        return f"a {type(value).__name__} of ({', '.join(type(item).__name__ for item in value)})"
    return "None" if value is None else f"a {type(value).__name__}"


def _handler_error(name: str, exc: BaseException) -> HandlerError:
    """Toolkit errors carry their HTTP status (status_code or status, 400-599); UnsupportedFormatError is 415."""
    status = 500
    for attribute in ("status_code", "status"):
        value = getattr(exc, attribute, None)
        if isinstance(value, int) and not isinstance(value, bool) and 400 <= value <= 599:
            status = value
            break
    else:
        if any(cls.__name__ == "UnsupportedFormatError" for cls in type(exc).__mro__):
            status = 415
    text = getattr(exc, "message", None)
    if not isinstance(text, str) or not text:
        text = str(exc) or type(exc).__name__
    if status >= 500:
        client_log(log, logging.WARNING, "sagemaker-handler-failed", "%s failed", name, exc_info=exc)
    return HandlerError(status, f"{name} failed: {text}")
