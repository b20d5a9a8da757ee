"""Error answers in the SageMaker Runtime API's shape, for what boto3's `sagemaker-runtime` client calls.

botocore's rest-json parser takes an error's code from the `x-amzn-ErrorType` header (else the body's
`code`, else the HTTP status) and its message from the body's `message` (or `Message`): an answer
without them is a ClientError with an empty message. The codes are the Runtime API's own
(ValidationError 400, ModelError 424, ModelNotReadyException 429, InternalFailure 500,
ServiceUnavailable 503), plus UnknownOperationException for a path or method no operation has.

The container contract's routes (/ping, /invocations, /models..., TF Serving predict) keep their
`{"error": ...}` answers: SageMaker's front-end reads those itself. `RuntimeErrors` gives every other
error answer of the port (the /endpoints/ paths, an unknown path or method) the Runtime API's shape.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Sequence
from http import HTTPStatus
from typing import Any

import orjson

from modelhost.protocols.http.app import HttpResponse, Route, json_response
from modelhost.protocols.http.exchange import ASGIApp

RUNTIME_PREFIX = "/endpoints/"
UNKNOWN_OPERATION = "UnknownOperationException"
OPERATIONS = ("InvokeEndpoint (POST /endpoints/{EndpointName}/invocations) and InvokeEndpointWithResponseStream "
              "(POST /endpoints/{EndpointName}/invocations-response-stream)")
_CODES = {
    400: "ValidationError",
    404: UNKNOWN_OPERATION,
    405: UNKNOWN_OPERATION,
    413: "ValidationError",
    424: "ModelError",
    429: "ModelNotReadyException",
    500: "InternalFailure",
    503: "ServiceUnavailable",
}
_ERROR_TYPE = b"x-amzn-errortype"
_ENDPOINT_NAME_CHARS = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-")


def runtime_error(status: int, code: str, message: str, **extra: Any) -> HttpResponse:
    """An error as the Runtime API answers it: the code in x-amzn-ErrorType, a JSON body with `message`."""
    response = json_response({"message": message, **extra}, status)
    response.headers += [(_ERROR_TYPE, code.encode()), (b"x-amzn-requestid", str(uuid.uuid4()).encode())]
    return response


def runtime_error_for(status: int, message: str) -> HttpResponse:
    """An error answer of `status` in the Runtime API's shape, with the code the Runtime API gives that status."""
    code = _CODES.get(status) or ("ValidationError" if status < 500 else "InternalFailure")
    return runtime_error(status, code, message)


def endpoint_name_error(name: str) -> HttpResponse | None:
    """The ValidationError for an endpoint name the Runtime API would refuse; None for a valid one."""
    if 0 < len(name) <= 63 and set(name) <= _ENDPOINT_NAME_CHARS and name[0] != "-" and name[-1] != "-":
        return None
    return runtime_error(400, "ValidationError", f"endpoint name '{name}' must be 1-63 letters, digits "
                         "and hyphens, starting and ending with a letter or digit")


def model_error(response: HttpResponse) -> HttpResponse:
    """A container answer's error as the Runtime API relays it: ModelError (424) with the original status."""
    message = orjson.loads(b"".join(response.body)).get("error", "")
    return runtime_error(424, "ModelError", f"Received client error ({response.status}) from primary "
                         f"with message \"{message}\"", OriginalStatusCode=response.status, OriginalMessage=message)


class RuntimeErrors:
    """ASGI wrapper: looks at an answer only when its status is an error (the success path pays one call)."""

    def __init__(self, app: ASGIApp, routes: Sequence[Route]) -> None:
        self._app = app
        self.routes = tuple(routes)  # what the wrapped app serves (the OpenAPI documents are checked against it)
        self._container = [re.compile(r.pattern) for r in routes if not r.pattern.startswith(RUNTIME_PREFIX)]

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self._app(scope, receive, send)
            return
        held: dict[str, Any] | None = None
        body: list[bytes] = []

        async def shaped(message: dict[str, Any]) -> None:
            nonlocal held
            if message["type"] == "http.response.start":
                if message["status"] >= 400 and self._reshapes(scope["path"], message["headers"]):
                    held = message
                    return
            elif held is not None and message["type"] == "http.response.body":
                body.append(message.get("body", b""))
                if message.get("more_body", False):
                    return
                response = _reshaped(scope, held["status"], b"".join(body))
                await _send(send, response)
                return
            await send(message)

        await self._app(scope, receive, shaped)

    def refusal(self, status: int, message: str) -> tuple[list[tuple[bytes, bytes]], bytes]:
        """Headers and body for the HTTP transport's own refusals on this port (a malformed, oversized or slow
        request, answered before any route): the Runtime API's code, and the message under both APIs' keys,
        as the request may have been meant for either."""
        code = _CODES.get(status, UNKNOWN_OPERATION)
        if code == UNKNOWN_OPERATION:  # the transport never answers 404/405: a request it refuses was malformed
            code = "ValidationError" if status < 500 else "InternalFailure"
        response = runtime_error(status, code, message, error=message)
        return response.headers, b"".join(response.body)

    def _reshapes(self, path: str, headers: list[tuple[bytes, bytes]]) -> bool:
        if any(name.lower() == _ERROR_TYPE for name, _ in headers):
            return False  # already in the Runtime API's shape
        return path.startswith(RUNTIME_PREFIX) or not any(p.fullmatch(path) for p in self._container)


def _reshaped(scope: dict[str, Any], status: int, body: bytes) -> HttpResponse:
    if _CODES.get(status) == UNKNOWN_OPERATION:
        path = scope["path"] if len(scope["path"]) <= 200 else scope["path"][:200] + "..."
        message = (f"{scope['method']} {path} is not a SageMaker Runtime operation this server answers; "
                   f"it answers {OPERATIONS}")
    else:
        message = _message(body) or _phrase(status)
    return runtime_error_for(status, message)


def _phrase(status: int) -> str:
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return f"HTTP {status}"


def _message(body: bytes) -> str:
    try:
        document = orjson.loads(body)
    except orjson.JSONDecodeError:
        return body.decode("utf-8", errors="replace")
    if isinstance(document, dict):
        return str(document.get("error") or document.get("message") or "")
    return ""


async def _send(send: Any, response: HttpResponse) -> None:
    body = b"".join(response.body)
    headers = [*response.headers, (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": response.status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
