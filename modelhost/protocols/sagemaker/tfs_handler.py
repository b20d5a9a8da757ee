"""The SageMaker TF Serving container's `inference.py` convention: `handler(data, context)`, or
`input_handler(data, context)` -> a TF Serving REST predict body, and `output_handler(response, context)`; each
answers `(body, content_type)`.
"""

from __future__ import annotations

import io
from pathlib import Path
from types import ModuleType
from typing import Any, NamedTuple

from modelhost.protocols.sagemaker.handler_api import (
    Defaults,
    Handler,
    HandlerError,
    Hook,
    RequestInfo,
    TfsResponse,
    describe,
    pair,
)

DEFAULT_CONTENT_TYPE = "application/json"  # what the TFS container's Context says when a header is missing
TFS_HOOKS = ("handler", "input_handler", "output_handler")


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


class TfsHandler(Handler):
    """`handler(data, context)`, or `input_handler` -> TF Serving REST predict -> `output_handler`."""

    convention = "tfs"

    def __init__(self, module: ModuleType, source: Path, hooks: dict[str, Hook]) -> None:
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
            return pair(self._handler(context, data), "handler")
        assert self._input_handler is not None and self._output_handler is not None
        body = self._input_handler(context, data)
        if isinstance(body, str):
            body = body.encode("utf-8")
        elif not isinstance(body, (bytes, bytearray, memoryview)):
            raise HandlerError(500, f"input_handler returned {describe(body)}; expected a str or bytes request body")
        # As in the TFS container, output_handler sees every answer, errors included, and decides.
        answer = defaults.tfs_predict(bytes(body))
        response = TfsResponse(answer.status_code, answer.content, answer.content_type, request.rest_uri)
        return pair(self._output_handler(context, response), "output_handler")


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
