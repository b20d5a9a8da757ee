"""A request body that must be a JSON object, read one way by every front-end."""

from __future__ import annotations

from typing import Any

import orjson

from modelhost.errors import invalid


def json_object(body: bytes | memoryview, holding: str = "") -> dict[str, Any]:
    """The body's JSON object; INVALID_INPUT naming the problem otherwise.

    Without `holding` an empty (or blank) body is an empty object, as Triton's repository routes take it;
    with it, the body must be an object holding that (e.g. "an 'inputs' list"), which the error says.
    """
    if not holding and not bytes(body).strip():
        return {}
    try:
        document = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise invalid(f"request body is not valid JSON: {exc}") from None
    if not isinstance(document, dict):
        raise invalid(f"request body must be a JSON object{' with ' + holding if holding else ''}")
    return document
