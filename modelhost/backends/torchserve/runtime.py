"""A TorchServe handler loaded and called as TorchServe's own Python worker does it (tsfs §A6), for one process
that serves one archive's model. It runs unmodified handler code: a module-level `handle(data, context)`, a
class with `initialize` and `handle`, a `BaseHandler` subclass, or a built-in handler by name.

Loading and `context` are TorchServe's own, from its Python package (the `torchserve` extra), pinned at 0.12.0:
`ts.model_loader.TsModelLoader` resolves the handler string, makes `ts.context.Context` and calls `initialize`,
and the handler's metrics go to a `ts` metrics cache (logged, as TorchServe's worker logs them). What modelhost
does itself is one batch's call: every request's `data` dict and headers in, and exactly one response per
request out, each encoded as TorchServe's worker encodes it (tsfs §A1.4), with the status, content type and
headers the handler set for it.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from modelhost.errors import ErrorKind, ModelhostError

TORCHSERVE_VERSION = "0.12.0"


@dataclass(frozen=True, slots=True)
class HandlerRequest:
    """One request of a batch: its parameters (`{"body": ...}` for a raw body, one key per form field), its
    headers (TorchServe's: the HTTP ones, and `{"content-type": ...}` per parameter) and its id."""

    data: dict[str, Any]
    headers: dict[str, Any] = field(default_factory=dict)
    request_id: str = ""


@dataclass(frozen=True, slots=True)
class HandlerResponse:
    body: bytes
    status: int = 200
    phrase: str = ""
    content_type: str | None = None  # None: the handler set none, and TorchServe then sends none
    headers: dict[str, str] = field(default_factory=dict)


class HandlerRuntime:
    """One loaded handler. `batch_size` is what `context.system_properties["batch_size"]` says (the most
    requests a batch holds). Blocking; not thread-safe (one batch at a time)."""

    def __init__(self, model_dir: Path, model_name: str, handler: str, batch_size: int) -> None:
        try:
            from ts.metrics.metric_cache_yaml_impl import MetricsCacheYamlImpl
            from ts.model_loader import TsModelLoader
        except ImportError as exc:
            raise ModelhostError(ErrorKind.UNSUPPORTED, f"TorchServe handlers need TorchServe's Python modules "
                                 f"({exc}): pip install 'modelhost[torchserve]'") from None
        import ts

        self.label = f"handler '{handler}' of model '{model_name}'"
        # TorchServe's worker puts the archive's directory on the module path: handlers import their own files.
        # First, and a module of the handler's name that another archive's runtime imported is forgotten: every
        # archive's handler may be called handler.py (one runtime per process is the rule; tests hold several).
        sys.path.insert(0, str(model_dir))
        module = Path(handler.split(":", 1)[0]).stem
        loaded = sys.modules.get(module)
        if loaded is not None and not str(getattr(loaded, "__file__", "") or "").startswith(str(model_dir)):
            del sys.modules[module]
        metrics = MetricsCacheYamlImpl(config_file_path=str(Path(ts.__file__).parent / "configs" / "metrics.yaml"))
        metrics.initialize_cache()
        self._service = TsModelLoader().load(model_name, str(model_dir), handler, None, batch_size,
                                             metrics_cache=metrics)

    @property
    def context(self) -> Any:
        """The handler's `ts.context.Context`."""
        return self._service.context

    def run(self, requests: list[HandlerRequest]) -> list[HandlerResponse]:
        """Call the handler once with the whole batch; raises ModelhostError (INTERNAL) naming the handler when it
        raises, or does not return one response per request."""
        from ts.context import RequestProcessor

        context = self._service.context
        context.request_ids = {index: request.request_id for index, request in enumerate(requests)}
        context.request_processor = [RequestProcessor(dict(request.headers)) for request in requests]
        context.metrics.request_ids = context.request_ids
        context.cl_socket = None
        try:
            results = self._service._entry_point([request.data for request in requests], context)
        except ModelhostError:
            raise
        except Exception as exc:
            raise ModelhostError(ErrorKind.INTERNAL, f"{self.label} failed: {type(exc).__name__}: {exc}") from exc
        if not isinstance(results, list) or len(results) != len(requests):
            count = len(results) if isinstance(results, list) else f"a {type(results).__name__}"
            raise ModelhostError(ErrorKind.INTERNAL, f"{self.label} returned {count} response(s) for a batch of "
                                 f"{len(requests)} request(s); a handler returns a list with one per request")
        return [self._response(index, result) for index, result in enumerate(results)]

    def _response(self, index: int, result: Any) -> HandlerResponse:
        context = self._service.context
        code, phrase = context.get_response_status(index)
        return HandlerResponse(_encode(result, self.label), code, phrase or "",
                               context.get_response_content_type(index),
                               dict(context.get_response_headers(index) or {}))


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
        raise ModelhostError(ErrorKind.UNAVAILABLE, f"{label}: Unsupported model output data type "
                             f"({type(result).__name__}).") from None
