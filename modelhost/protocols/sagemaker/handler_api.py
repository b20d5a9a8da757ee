"""The contract between the SageMaker front-end and a user's `code/inference.py` (protocols §6.5), whichever
convention it follows: the request as parsed (`RequestInfo`), modelhost's defaults for what the module leaves
out (`Defaults`), a loaded module (`Handler`), and what user code's failures become (`HandlerError`).

Contract: Handler.load_model() runs model_fn once; Handler.invoke() serves one request and may run in several
worker threads at once. Whatever user code raises becomes HandlerError (the status and message the front-end
answers); exceptions from the injected Defaults (modelhost's own code, ModelhostError expected) pass through
unchanged.
"""

from __future__ import annotations

import dataclasses
import http
import json
import logging
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, Protocol
from wsgiref.headers import Headers

from modelhost.client_log import client_log
from modelhost.protocols.sagemaker import user_code

log = logging.getLogger("modelhost.sagemaker")


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


@dataclass(frozen=True)
class Hook:
    """One user function, called with or without the trailing context; what it raises becomes HandlerError."""

    name: str
    function: Callable[..., Any]
    takes_context: bool

    def __call__(self, context: Any, *args: Any) -> Any:
        try:
            return self.function(*args, context) if self.takes_context else self.function(*args)
        except (Exception, SystemExit) as exc:
            raise handler_error(self.name, exc) from exc


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


def pair(result: Any, name: str) -> tuple[bytes, str]:
    if isinstance(result, (tuple, list)) and len(result) == 2:
        body, content_type = result
        if isinstance(body, (bytes, bytearray, memoryview, str)) and isinstance(content_type, str):
            return as_bytes(body), content_type
    raise HandlerError(500, f"{name} returned {describe(result)}; expected a (body, content_type) pair "
                            "with a bytes or str body and a str content type")


def as_bytes(body: bytes | bytearray | memoryview | str) -> bytes:
    return body.encode("utf-8") if isinstance(body, str) else bytes(body)


def describe(value: Any) -> str:
    if isinstance(value, (tuple, list)):
        return f"a {type(value).__name__} of ({', '.join(type(item).__name__ for item in value)})"
    return "None" if value is None else f"a {type(value).__name__}"


def handler_error(name: str, exc: BaseException) -> HandlerError:
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
