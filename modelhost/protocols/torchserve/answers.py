"""TorchServe's HTTP answers (tsfs §A1.4, §A1.5): its frontend's JSON (pretty-printed, two-space indent and a
newline, as Gson writes it), its error shape `{"code", "type", "message"}`, and the headers every answer carries."""

from __future__ import annotations

import json
from typing import Any

from modelhost.errors import ErrorKind, ModelhostError, public_message
from modelhost.protocols.http.app import STATUS, HttpResponse
from modelhost.protocols.torchserve.errors import TorchServeError

JSON = b"application/json"
# Every answer's headers besides its own (tsfs §A1.4); x-request-id is added per request.
NO_CACHE = [(b"pragma", b"no-cache"), (b"cache-control", b"no-cache; no-store, must-revalidate, private"),
            (b"expires", b"Thu, 01 Jan 1970 00:00:00 UTC")]
_TYPES = {400: "BadRequestException", 404: "ResourceNotFoundException", 405: "MethodNotAllowedException",
          413: "RequestEntityTooLargeException", 503: "ServiceUnavailableException"}
_MESSAGES = {404: "Requested resource is not found, please refer to API document.",
             405: "Requested method is not allowed, please refer to API document."}


def pretty_json(document: Any, status: int = 200, request_id: str = "") -> HttpResponse:
    body = (json.dumps(document, indent=2, ensure_ascii=False) + "\n").encode("utf-8")
    return HttpResponse(status, [body], [(b"content-type", JSON), *headers(request_id)])


def headers(request_id: str) -> list[tuple[bytes, bytes]]:
    return ([(b"x-request-id", request_id.encode("latin-1"))] if request_id else []) + NO_CACHE


def error(status: int, kind: str, message: str, request_id: str = "") -> HttpResponse:
    return pretty_json({"code": status, "type": kind, "message": public_message(message)}, status, request_id)


def app_error(status: int, message: str) -> HttpResponse:
    """The HTTP app's own answers (unknown path, wrong method, unreadable body) in TorchServe's shape."""
    return error(status, _TYPES.get(status, "InternalServerException" if status >= 500 else "BadRequestException"),
                 _MESSAGES.get(status, message))


def torchserve_error(exc: TorchServeError, request_id: str = "") -> HttpResponse:
    return error(exc.status, exc.kind, exc.message, request_id)


def core_error(exc: ModelhostError, request_id: str = "") -> HttpResponse:
    """A core error as TorchServe would answer its cause: a bad request 400, a full queue 503, a worker that did
    not answer in its responseTimeout 504, a crashed worker 500, no memory 507."""
    status = STATUS[exc.kind]
    if exc.kind in (ErrorKind.OVERLOADED, ErrorKind.UNAVAILABLE):
        kind = "ServiceUnavailableException"
    elif status < 500:
        kind = _TYPES.get(status, "BadRequestException")
    else:
        kind = "InternalServerException"
    return error(status, kind, exc.message, request_id)
