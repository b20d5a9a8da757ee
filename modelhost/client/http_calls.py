"""The V2 HTTP API as requests to send and answers to read, with no I/O: what the blocking and the asyncio
HTTP transports share. Paths are KServe V2's and Triton's extensions'."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import quote

import numpy as np
import orjson

from modelhost.client.errors import ClientError, http_error, retry_after_seconds
from modelhost.client.http_answer import HttpAnswer, request_head
from modelhost.client.http_body import Parts, decode_response, encode_request, error_message


def model_path(model: str, version: str = "") -> str:
    path = f"/v2/models/{quote(model, safe='')}"
    return f"{path}/versions/{quote(version, safe='')}" if version else path


def repository_path(model: str, action: str) -> str:
    return f"/v2/repository/models/{quote(model, safe='')}/{action}"


def ready_path(model: str, version: str) -> str:
    return model_path(model, version) + "/ready" if model else "/v2/health/ready"


def infer_parts(
    authority: str, model: str, version: str, inputs: Mapping[str, np.ndarray], outputs: Sequence[str] | None,
    parameters: Mapping[str, Any], request_id: str, binary: bool, expect_bytes: int = 0,
) -> tuple[Parts, bool]:
    """The infer request as the parts to write (the head, the JSON header, each binary tensor), and whether its
    head asks `Expect: 100-continue` (a body of `expect_bytes` or more; 0: never)."""
    body, header_length = encode_request(inputs, outputs, parameters, request_id, binary)
    length = sum(memoryview(part).nbytes for part in body)
    content_type = "application/octet-stream" if header_length is not None else "application/json"
    expect = 0 < expect_bytes <= length
    head = request_head("POST", model_path(model, version) + "/infer", authority, content_type, length,
                        header_length, _EXPECT if expect else b"")
    return [head, *body], expect


_EXPECT = b"Expect: 100-continue\r\n"


def infer_answer(answer: HttpAnswer) -> dict[str, np.ndarray]:
    check(answer)
    length = answer.headers.get(b"inference-header-content-length")
    try:
        header_length = None if length is None else int(length)
    except ValueError:
        raise ClientError(0, f"the server sent Inference-Header-Content-Length {length!r}") from None
    return decode_response(answer.body, header_length)[0]


def json_parts(authority: str, method: str, path: str, document: Any = None) -> Parts:
    body = b"" if document is None else orjson.dumps(document)
    return [request_head(method, path, authority, "application/json", len(body), None), body]


def json_answer(answer: HttpAnswer) -> Any:
    check(answer)
    if not answer.body:
        return None
    try:
        return orjson.loads(answer.body)
    except orjson.JSONDecodeError as exc:
        raise ClientError(answer.status, f"the server's answer is not valid JSON: {exc}") from None


def check(answer: HttpAnswer) -> None:
    if answer.status >= 400:
        raise http_error(answer.status, error_message(answer.body),
                         retry_after_seconds(answer.headers.get(b"retry-after")))


def load_document(config: Mapping[str, Any] | str | None, files: Mapping[str, bytes] | None) -> dict[str, Any]:
    """The repository extension's load body: a config override (JSON) and files (base64), as Triton takes them."""
    import base64

    parameters: dict[str, Any] = {}
    if config is not None:
        parameters["config"] = config if isinstance(config, str) else orjson.dumps(config).decode()
    for path, content in (files or {}).items():
        parameters[path] = base64.b64encode(content).decode()
    return {"parameters": parameters} if parameters else {}
