"""SageMaker's container contract over HTTP: `/ping`, `/invocations`, the multi-model management API
(`/models`...), and the Runtime API's `POST /endpoints/{name}/invocations` and `.../invocations-response-stream`
(protocols §6; response_stream.py); its asynchronous invocation answers a ValidationError saying it is not
supported. Custom attributes user code sets for a response go back in X-Amzn-SageMaker-Custom-Attributes.

Translation only: which model a call means comes from `Targets`; running it from `Invoker`.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Iterator, Mapping
from contextlib import AbstractAsyncContextManager, AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from typing import Any, Protocol
from urllib.parse import parse_qs

from modelhost.access import Api
from modelhost.digits import is_digits
from modelhost.errors import ModelhostError, invalid, not_found
from modelhost.protocols.http.app import (
    HttpRequest,
    HttpResponse,
    Route,
    RouteHandler,
    error_answer,
    error_response,
    json_response,
)
from modelhost.protocols.json_body import json_object
from modelhost.protocols.sagemaker.handler_api import Handler, HandlerError
from modelhost.protocols.sagemaker.invoke import Call, Invoker
from modelhost.protocols.sagemaker.payloads import MediaTypeError
from modelhost.protocols.sagemaker.response_stream import attributes_header, streamed
from modelhost.protocols.sagemaker.runtime_errors import OPERATIONS, endpoint_name_error, model_error, runtime_error
from modelhost.protocols.sagemaker.target_models import TargetModels

log = logging.getLogger("modelhost.sagemaker")

CUSTOM_ATTRIBUTES = b"x-amzn-sagemaker-custom-attributes"
TARGET_MODEL = b"x-amzn-sagemaker-target-model"
_ENDPOINT = r"/endpoints/(?P<endpoint>[^/]+)/invocations"
# Runtime API operations modelhost does not serve: the route, and what the answer says of it.
_UNSUPPORTED = {
    r"/endpoints/(?P<endpoint>[^/]+)/async-invocations":
        "InvokeEndpointAsync is not supported: this server has no asynchronous inference (no S3 input and "
        "output locations, no queue)",
}
_PAGE_LIMIT = 100


@dataclass(frozen=True, slots=True)
class Target:
    """The served model a call runs: the manager's name, a version ("" for the latest), its inference.py."""

    model: str
    version: str
    handler: Handler | None


class Targets(Protocol):
    def resolve(self, headers: dict[bytes, bytes]) -> AbstractAsyncContextManager[Target]: ...


def select_model(served: Mapping[str, str], attributes: str, default_name: str, handler: Handler | None) -> Target:
    """The model that `tfs-model-name=...,tfs-model-version=...` picks among `served` (archive name -> served)."""
    pairs = dict(part.strip().split("=", 1) for part in attributes.split(",") if "=" in part)
    name, version = pairs.get("tfs-model-name", ""), pairs.get("tfs-model-version", "")
    if version and not is_digits(version):
        raise invalid(f"custom attribute tfs-model-version '{version}' is not a version number")
    if not name:
        if len(served) == 1:
            name = next(iter(served))
        elif default_name in served:
            name = default_name
        else:
            raise invalid(f"several models are served ({', '.join(sorted(served))}): choose one with the "
                          f"X-Amzn-SageMaker-Custom-Attributes header 'tfs-model-name=<name>'")
    if name not in served:
        raise not_found(f"model '{name}' (tfs-model-name) is not served here; served: {', '.join(sorted(served))}")
    return Target(served[name], version, handler)


class SingleModelTargets:
    """The models of /opt/ml/model (or --model-repository), with the one inference.py they share. `models`: a live
    view of their names, looked up per request without a copy (an endpoint may serve hundreds)."""

    def __init__(self, models: Collection[str], default_name: str) -> None:
        self._served = _ServedAsNamed(models)
        self._default_name = default_name
        self.handler: Handler | None = None

    @asynccontextmanager
    async def resolve(self, headers: dict[bytes, bytes]) -> AsyncIterator[Target]:
        attributes = _header(headers, CUSTOM_ATTRIBUTES)
        yield select_model(self._served, attributes, self._default_name, self.handler)


class _ServedAsNamed(Mapping[str, str]):
    """Each of `names` served under its own name."""

    def __init__(self, names: Collection[str]) -> None:
        self._names = names

    def __getitem__(self, name: str) -> str:
        if name not in self._names:
            raise KeyError(name)
        return name

    def __contains__(self, name: object) -> bool:
        return name in self._names

    def __iter__(self) -> Iterator[str]:
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)


class MultiModelTargets:
    """`X-Amzn-SageMaker-Target-Model` archives, loaded on first use and cached."""

    def __init__(self, models: TargetModels, default_name: str, handlers: Mapping[str, Handler]) -> None:
        self._models = models
        self._default_name = default_name
        self._handlers = handlers  # target model key -> the archive's inference.py

    @asynccontextmanager
    async def resolve(self, headers: dict[bytes, bytes]) -> AsyncIterator[Target]:
        target = _header(headers, TARGET_MODEL)
        if not target:
            raise invalid("a multi-model endpoint needs the X-Amzn-SageMaker-Target-Model header "
                          "(the archive to run, e.g. model-17.tar.gz)")
        async with self._models.use_target(target) as model:
            yield select_model(model.served, _header(headers, CUSTOM_ATTRIBUTES), self._default_name,
                               self._handlers.get(model.key))


def routes(invoker: Invoker, targets: Targets, ready: Callable[[], bool], models: TargetModels | None,
           handlers: Mapping[str, Handler] | None = None) -> list[Route]:
    async def run(target: Target, request: HttpRequest) -> HttpResponse:
        answer = await invoker.invoke(target.model, target.version, target.handler, _call_of(request))
        return HttpResponse(200, [answer.body], [(b"content-type", answer.content_type.encode()),
                                                 *attributes_header(answer)])

    async def invocations(request: HttpRequest) -> HttpResponse:
        try:
            async with targets.resolve(request.headers) as target:
                return await run(target, request)
        except (ModelhostError, MediaTypeError, HandlerError) as exc:
            return _error(exc)

    async def ping(request: HttpRequest) -> HttpResponse:
        return HttpResponse(200 if ready() else 503, (), [])

    async def endpoint_invocations(request: HttpRequest) -> HttpResponse:
        refused = endpoint_name_error(request.params["endpoint"])
        if refused is not None:
            return refused
        response = await invocations(request)
        if response.status >= 400:
            return model_error(response)
        response.headers += _invoked()
        return response

    async def response_stream(request: HttpRequest) -> HttpResponse:
        refused = endpoint_name_error(request.params["endpoint"])
        if refused is not None:
            return refused
        held = AsyncExitStack()  # the target stays in use (a multi-model archive cached) until the stream ends
        try:
            target = await held.enter_async_context(targets.resolve(request.headers))
            parts = invoker.parts(target.model, target.version, target.handler, _call_of(request))
            return await streamed(parts, held, invoker.timeout_seconds, _invoked())
        except (ModelhostError, MediaTypeError, HandlerError) as exc:
            await held.aclose()
            return model_error(_error(exc))
        except BaseException:
            await held.aclose()
            raise

    def unsupported(explanation: str) -> RouteHandler:
        async def answer(request: HttpRequest) -> HttpResponse:
            return runtime_error(400, "ValidationError", f"{explanation}; call {OPERATIONS}")
        return answer

    found = [
        Route("GET", "/ping", ping, Api.HEALTH),
        Route("POST", "/invocations", invocations, Api.INFERENCE),
        Route("POST", _ENDPOINT, endpoint_invocations, Api.INFERENCE),
        Route("POST", _ENDPOINT + "-response-stream", response_stream, Api.INFERENCE),
        *(Route("POST", pattern, unsupported(explanation), Api.INFERENCE)
          for pattern, explanation in _UNSUPPORTED.items()),
    ]
    return found + (management_routes(models, run, {} if handlers is None else handlers) if models is not None else [])


def management_routes(models: TargetModels, run: Callable[[Target, HttpRequest], Awaitable[HttpResponse]],
                      handlers: Mapping[str, Handler]) -> list[Route]:
    """The multi-model container API SageMaker itself calls (protocols §6.3)."""

    async def load(request: HttpRequest) -> HttpResponse:
        document = json_object(request.body)
        name, url = document.get("model_name"), document.get("url")
        for field, value in (("model_name", name), ("url", url)):
            if not isinstance(value, str) or not value:
                raise invalid(f"'{field}' must be a non-empty string")
        assert isinstance(name, str) and isinstance(url, str)
        await models.load(name, url)
        return json_response({"status": f"Model {name} loaded"})

    async def list_models(request: HttpRequest) -> HttpResponse:
        query = parse_qs(request.query.decode("latin-1"))
        start = _natural(query.get("next_page_token", ["0"])[0], "next_page_token")
        limit = _natural(query.get("limit", [str(_PAGE_LIMIT)])[0], "limit") or _PAGE_LIMIT
        loaded = models.models()
        page: dict[str, Any] = {"models": [_model_json(m.key, m.url) for m in loaded[start:start + limit]]}
        if start + limit < len(loaded):
            page["nextPageToken"] = str(start + limit)
        return json_response(page)

    async def describe(request: HttpRequest) -> HttpResponse:
        model = models.get(request.params["name"])
        return json_response(_model_json(model.key, model.url))

    async def unload(request: HttpRequest) -> HttpResponse:
        name = request.params["name"]
        await models.unload(name)
        return json_response({"success": f"Successfully unloaded model {name}."})

    async def invoke(request: HttpRequest) -> HttpResponse:
        try:
            async with models.use(request.params["name"]) as cached:
                target = select_model(cached.served, _header(request.headers, CUSTOM_ATTRIBUTES), "",
                                      handlers.get(cached.key))
                return await run(target, request)
        except (ModelhostError, MediaTypeError, HandlerError) as exc:
            return _error(exc)

    return [
        Route("POST", "/models", load, Api.MODEL_REPOSITORY),
        Route("GET", "/models", list_models, Api.MODEL_REPOSITORY),
        Route("GET", r"/models/(?P<name>[^/]+)", describe, Api.MODEL_REPOSITORY),
        Route("DELETE", r"/models/(?P<name>[^/]+)", unload, Api.MODEL_REPOSITORY),
        Route("POST", r"/models/(?P<name>[^/]+)/invoke", invoke, Api.INFERENCE),
    ]


def _call_of(request: HttpRequest) -> Call:
    return Call(request.body, _header(request.headers, b"content-type") or None,
                _header(request.headers, b"accept") or None, _header(request.headers, CUSTOM_ATTRIBUTES))


def _invoked() -> list[tuple[bytes, bytes]]:
    return [(b"x-amzn-invoked-production-variant", b"AllTraffic"), (b"x-amzn-requestid", str(uuid.uuid4()).encode())]


def _error(exc: ModelhostError | MediaTypeError | HandlerError) -> HttpResponse:
    if isinstance(exc, ModelhostError):
        return error_answer(exc)
    return error_response(exc.status, exc.message)


def _model_json(name: str, url: str) -> dict[str, str]:
    return {"modelName": name, "modelUrl": url}


def _header(headers: dict[bytes, bytes], name: bytes) -> str:
    return headers.get(name, b"").decode("latin-1").strip()


def _natural(text: str, name: str) -> int:
    if not is_digits(text):
        raise invalid(f"query parameter '{name}' must be a non-negative integer, got '{text}'")
    return int(text)
