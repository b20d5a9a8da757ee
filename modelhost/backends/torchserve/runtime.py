"""A TorchServe handler loaded and called as TorchServe's own Python worker does it (tsfs §A6), for one process
that serves one archive's model. It runs unmodified handler code: a module-level `handle(data, context)`, a
class with `initialize` and `handle`, a `BaseHandler` subclass, or a built-in handler by name.

Loading and `context` are TorchServe's own, from its Python package (the `torchserve` extra), pinned at 0.12.0:
`ts.model_loader.TsModelLoader` resolves the handler string, makes `ts.context.Context` and calls `initialize`,
and the handler's metrics go to a `ts` metrics cache (logged, as TorchServe's worker logs them). What modelhost
does itself is one batch's call: every request's `data` dict (its parameters decoded as TorchServe's worker
decodes them, tsfs §A1.3) and headers in, and exactly one response per request out, each encoded as TorchServe's
worker encodes it (tsfs §A1.4), with the status, content type and headers the handler set for it. A handler that
fails answers every request of the batch with TorchServe's status and message for it (tsfs §A1.5).

A handler that streams (tsfs §A1.6) calls `send_intermediate_predict_response`, which writes TorchServe's predict
response frame to `context.cl_socket`: here that is an object that reads the frame back into one HandlerResponse
per request it names and hands each to the batch's `partial` callback, as it is sent.
"""

from __future__ import annotations

import json
import logging
import struct
import sys
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from modelhost.backends.torchserve.lazy_torch import defer_torch_import
from modelhost.errors import ErrorKind, ModelhostError
from modelhost.handler_messages import STREAM_NEXT_HEADER, HandlerRequest, HandlerResponse

log = logging.getLogger("modelhost.backends.torchserve")

TORCHSERVE_VERSION = "0.12.0"


class HandlerRuntime:
    """One loaded handler. `batch_size` is what `context.system_properties["batch_size"]` says (the most
    requests a batch holds); `envelope` TorchServe's `service_envelope` (json, body, kserve, kservev2), which wraps
    the handler. Blocking; not thread-safe (one batch at a time)."""

    def __init__(self, model_dir: Path, model_name: str, handler: str, batch_size: int,
                 decode_input: bool = True, envelope: str | None = None) -> None:
        defer_torch_import()
        try:
            from ts.metrics.metric_cache_yaml_impl import MetricsCacheYamlImpl
            from ts.model_loader import TsModelLoader
        except ImportError as exc:
            raise ModelhostError(ErrorKind.UNSUPPORTED, f"TorchServe handlers need TorchServe's Python modules "
                                 f"({exc}): pip install 'modelhost[torchserve]'") from None
        import ts

        self.label = f"handler '{handler}' of model '{model_name}'"
        self._decode_input = decode_input
        # TorchServe's worker puts the archive's directory on the module path: handlers import their own files.
        # First, and a module of the handler's name that another archive's runtime imported is forgotten: every
        # archive's handler may be called handler.py (one runtime per process is the rule; tests hold several).
        sys.path.insert(0, str(model_dir))
        module = handler.split(":", 1)[0].removesuffix(".py").split("/")[-1]  # as TorchServe names it
        loaded = sys.modules.get(module) if "." not in module else None  # a dotted name is an installed module's
        if loaded is not None and not str(getattr(loaded, "__file__", "") or "").startswith(str(model_dir)):
            del sys.modules[module]
        metrics = MetricsCacheYamlImpl(config_file_path=str(Path(ts.__file__).parent / "configs" / "metrics.yaml"))
        metrics.initialize_cache()
        self._service = TsModelLoader().load(model_name, str(model_dir), handler, None, batch_size, envelope,
                                             metrics_cache=metrics)

    @property
    def context(self) -> Any:
        """The handler's `ts.context.Context`."""
        return self._service.context

    def run(self, requests: list[HandlerRequest],
            partial: Callable[[int, HandlerResponse], None] | None = None) -> list[HandlerResponse]:
        """Call the handler once with the whole batch: one response per request, in order. `partial(index,
        response)` gets each intermediate response the handler sends to request `index` (dropped when None)."""
        from ts.context import RequestProcessor
        from ts.utils.util import PredictionException

        context = self._service.context
        data, headers = zip(*(self._handler_input(request) for request in requests))
        ids = _unique_ids([request.request_id for request in requests])
        context.request_ids = dict(enumerate(ids))
        context.request_processor = [RequestProcessor(request_headers) for request_headers in headers]
        context.metrics.request_ids = context.request_ids
        context.cl_socket = _IntermediateResponses(ids, partial)
        try:
            results = self._service._entry_point(list(data), context)
        except MemoryError:
            log.error("%s ran out of memory", self.label, exc_info=True)
            return _failed(len(requests), 507, "Out of resources")
        except PredictionException as exc:
            log.error("%s raised PredictionException", self.label, exc_info=True)
            return _failed(len(requests), exc.error_code, exc.message)
        except Exception as exc:
            log.warning("%s failed", self.label, exc_info=True)
            status = 507 if "CUDA" in str(exc) else 503
            message = "Out of resources" if status == 507 else (
                f"Prediction failed: {self.label} raised {type(exc).__name__}: {exc}")
            return _failed(len(requests), status, message)
        if not isinstance(results, list) or len(results) != len(requests):
            count = len(results) if isinstance(results, list) else f"a {type(results).__name__}"
            log.error("%s returned %s for a batch of %d", self.label, count, len(requests))
            return _failed(len(requests), 500, f"{self.label} returned {count} response(s) for a batch of "
                           f"{len(requests)} request(s); a handler returns a list with one response per request")
        answers = []
        for index, result in enumerate(results):
            try:
                answers.append(self._response(index, result))
            except ModelhostError as exc:
                answers.append(HandlerResponse(exc.message.encode(), 503, error=True))
        return answers

    def _handler_input(self, request: HandlerRequest) -> tuple[dict[str, Any], dict[str, Any]]:
        """The request's `data` dict and its headers as the handler's context gives them (tsfs §A1.3)."""
        data: dict[str, Any] = {}
        headers: dict[str, Any] = _Headers()
        for name, (content_type, value) in request.parameters.items():
            data[name] = _decode(content_type, value) if self._decode_input else bytearray(value)
            headers[name] = {"content-type": content_type}
        headers.update(request.headers)
        return data, headers

    def _response(self, index: int, result: Any) -> HandlerResponse:
        context = self._service.context
        code, phrase = context.get_response_status(index)
        headers = {str(k): str(v) for k, v in (context.get_response_headers(index) or {}).items()}
        if headers.get(STREAM_NEXT_HEADER) == "true":  # the last of a streamed answer, as TorchServe's worker marks it
            headers[STREAM_NEXT_HEADER] = "false"
        return HandlerResponse(_encode(result, self.label), code or 200, phrase or "",
                               context.get_response_content_type(index) or None, headers)


class _IntermediateResponses:
    """What a handler's `context.cl_socket` is during a batch: `send_intermediate_predict_response` writes one
    predict response frame to it (TorchServe's worker protocol: status, message, then per request its id, content
    type, status, phrase, headers and body, ending with -1), read back here into one HandlerResponse per request."""

    def __init__(self, ids: list[str], partial: Callable[[int, HandlerResponse], None] | None) -> None:
        self._index = {request_id: index for index, request_id in enumerate(ids)}
        self._partial = partial

    def sendall(self, frame: bytes | bytearray) -> None:
        if self._partial is None:
            return
        for request_id, response in _read_frame(memoryview(frame)):
            index = self._index.get(request_id)
            if index is None:
                log.warning("an intermediate response names request %r, which is not in its batch: dropped",
                            request_id)
                continue
            self._partial(index, response)


def _read_frame(frame: memoryview) -> list[tuple[str, HandlerResponse]]:
    """The (request id, response) pairs of a predict response frame."""
    position = 0

    def integer() -> int:
        nonlocal position
        (value,) = struct.unpack_from("!i", frame, position)
        position += 4
        return int(value)

    def data() -> bytes:
        nonlocal position
        length = integer()
        value = bytes(frame[position:position + length])
        position += length
        return value

    integer()  # the batch's status: each response carries its own
    data()  # the batch's message
    responses = []
    while struct.unpack_from("!i", frame, position)[0] != -1:
        request_id = data().decode("utf-8")
        content_type = data().decode("utf-8")
        status = integer()
        phrase = data().decode("utf-8")
        headers = {}
        for _ in range(integer()):
            name = data().decode("utf-8")
            headers[name] = data().decode("utf-8")
        responses.append((request_id, HandlerResponse(data(), status, phrase, content_type or None, headers)))
    return responses


def _unique_ids(ids: list[str]) -> list[str]:
    """The requests' ids for `context.request_ids`, where an intermediate response finds its request by id: each as
    sent, or a new one where it is missing or repeats another (requests from tensor APIs have none)."""
    if len(set(ids)) == len(ids) and all(ids):
        return ids
    seen: set[str] = set()
    unique = []
    for request_id in ids:
        if not request_id or request_id in seen:
            request_id = str(uuid.uuid4())
        seen.add(request_id)
        unique.append(request_id)
    return unique


class _Headers(dict):  # type: ignore[type-arg]
    """A request's headers for `context.get_request_header`: a name as sent, else in any case (HTTP header names
    are case-insensitive; modelhost's transport hands them over in lower case)."""

    def get(self, key: Any, default: Any = None) -> Any:
        if key in self:
            return self[key]
        return super().get(key.lower(), default) if isinstance(key, str) else default

    def __missing__(self, key: Any) -> Any:
        if isinstance(key, str) and key.lower() != key and dict.__contains__(self, key.lower()):
            return dict.__getitem__(self, key.lower())
        raise KeyError(key)


def _failed(count: int, status: int, message: str) -> list[HandlerResponse]:
    """The answers to a batch the handler failed: each request gets the same status and message."""
    return [HandlerResponse(message.encode(), status, error=True) for _ in range(count)]


def _decode(content_type: str, value: bytes) -> Any:
    """A parameter's value as TorchServe's worker hands it to the handler: JSON parsed (raw bytes when it does not
    parse), text as str, anything else as a bytearray."""
    if content_type == "application/json":
        try:
            return json.loads(value.decode("utf-8"))
        except ValueError:
            return bytearray(value)
    if content_type.startswith("text"):
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError:
            return bytearray(value)
    return bytearray(value)


def _encode(result: Any, label: str) -> bytes:
    """As TorchServe's worker writes a response: bytes as they are, str as UTF-8, a tensor as torch.save writes
    it, anything else as JSON with an indent of 2."""
    if isinstance(result, (bytes, bytearray)):
        return bytes(result)
    if isinstance(result, str):
        return result.encode("utf-8")
    if type(result).__module__ == "torch" and type(result).__name__ == "Tensor":
        import io

        import torch

        buffer = io.BytesIO()
        torch.save(result, buffer)
        return buffer.getvalue()
    try:
        return json.dumps(result, indent=2).encode("utf-8")
    except (TypeError, ValueError):
        raise ModelhostError(ErrorKind.UNAVAILABLE, f"Unsupported model output data type ({label} returned a "
                             f"{type(result).__name__}).") from None
