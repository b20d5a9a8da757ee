"""The SageMaker inference toolkit's `inference.py` convention: `model_fn`, `input_fn`, `predict_fn`, `output_fn`
(any subset; modelhost's defaults fill the rest) or `transform_fn`, each with an optional trailing context
argument.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from modelhost.errors import unavailable
from modelhost.protocols.sagemaker.handler_api import (
    Defaults,
    Handler,
    HandlerError,
    Hook,
    RequestInfo,
    as_bytes,
    describe,
    pair,
)

_UTF8_TYPES = ("application/json", "text/csv")  # the toolkit hands these to input_fn as str (exact match)
TOOLKIT_HOOKS = {
    "pre_model_fn": ("model_dir",),
    "model_fn": ("model_dir",),
    "model_warmup_fn": ("model_dir", "model"),
    "input_fn": ("input_data", "content_type"),
    "predict_fn": ("data", "model"),
    "output_fn": ("prediction", "accept"),
    "transform_fn": ("model", "input_data", "content_type", "accept"),
}


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


class ToolkitHandler(Handler):
    """model_fn / input_fn / predict_fn / output_fn (any subset, defaults for the rest) or transform_fn."""

    convention = "toolkit"

    def __init__(self, module: ModuleType, source: Path, hooks: dict[str, Hook]) -> None:
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


def _input_data(request: RequestInfo) -> str | bytes:
    if request.content_type not in _UTF8_TYPES:
        return request.body
    try:
        return request.body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise HandlerError(400, f"request body is not UTF-8 text as {request.content_type} requires: {exc}") from exc


def _toolkit_response(result: Any, name: str, accept: str) -> tuple[bytes, str]:
    if isinstance(result, (bytes, bytearray, memoryview, str)):
        return as_bytes(result), accept.split(",")[0].strip()
    if isinstance(result, tuple):
        return pair(result, name)
    raise HandlerError(500, f"{name} returned {describe(result)}; expected bytes, str or a (body, content_type) pair")
