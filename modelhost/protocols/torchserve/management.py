"""TorchServe's management API (tsfs §A2), default port 8081: register, scale workers, describe, list, unregister,
set-default. Register and unregister answer only with `enable_model_api` (405 otherwise, as TorchServe since
0.11); the rest always. Parameters come from the query string, or for register from a JSON body too.

A registration's `url` is an archive of the model store (its name, or its path there, optionally `file://`), or an
http(s) URL that `allowed_urls` matches, downloaded into the model store first (download.py)."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
from collections.abc import Awaitable, Callable
from datetime import datetime, timezone
from typing import Any
from urllib.parse import parse_qsl

import orjson

from modelhost.access import Api
from modelhost.errors import ModelhostError
from modelhost.handler_messages import HandlerRequest
from modelhost.protocols.http.app import HttpRequest, HttpResponse, Route, RouteHandler
from modelhost.protocols.torchserve.answers import pretty_json, torchserve_error
from modelhost.protocols.torchserve.download import check_allowed, download_archive
from modelhost.protocols.torchserve.errors import TorchServeError
from modelhost.protocols.torchserve.model_store import archive_in_store
from modelhost.protocols.torchserve.registrations import RegisteredVersion, Registration
from modelhost.protocols.torchserve.serving import TorchServing, new_request_id

log = logging.getLogger("modelhost.torchserve")

_MODEL = r"(?P<model>[^/]+)"
MAX_LIST_LIMIT = 100
PROCESSING = "Processing worker updates..."


Answer = tuple[int, Any]  # HTTP status and the JSON document, which the gRPC API sends as text


class ManagementApi:
    """The management operations over TorchServing, for the REST routes and the gRPC service alike: each takes the
    request's parameters by their REST names and returns the status and document TorchServe answers with, or
    raises TorchServeError."""

    def __init__(self, serving: TorchServing) -> None:
        self.serving = serving

    async def register(self, params: dict[str, str]) -> Answer:
        serving = self.serving
        if not serving.config.enable_model_api:
            raise _not_allowed()
        url = params.get("url")
        if not url:
            raise TorchServeError(400, "BadRequestException", "Parameter url is required.")
        archive = (await download_archive(url, serving.config) if re.match(r"https?://", url)
                   else archive_in_store(serving.config.model_store, _allowed(url, serving)))
        workers = _integer(params, "initial_workers")
        if workers is None:
            workers = serving.config.default_workers_per_model
        registration = Registration(
            name=params.get("model_name") or None, handler=params.get("handler") or None,
            batch_size=_integer(params, "batch_size", 1), max_batch_delay_ms=_integer(params, "max_batch_delay"),
            initial_workers=workers, response_timeout_s=_integer(params, "response_timeout", 1),
            startup_timeout_s=_integer(params, "startup_timeout", 1),
        )
        synchronous = _boolean(params, "synchronous", True)
        registered, starting = await serving.register(archive, url, registration, wait=synchronous)
        name = registration.name or registered.manifest.model_name
        version, count = registered.version, registered.settings.min_workers
        if count == 0:
            return _status(f'Model "{name}" Version: {version} registered with 0 initial workers. Use scale '
                           "workers API to add workers for the model.")
        if starting is not None:
            _log_failure(starting)
            return _status(PROCESSING, 202)
        return _status(f'Model "{name}" Version: {version} registered with {count} initial workers')

    async def list_models(self, params: dict[str, str]) -> Answer:
        limit = _integer(params, "limit")
        limit = MAX_LIST_LIMIT if limit is None or limit > MAX_LIST_LIMIT or limit <= 0 else limit
        start = _integer(params, "next_page_token", 0) or 0
        models = self.serving.models()
        page = models[start:start + limit]
        document: dict[str, Any] = {}
        if start + limit < len(models):
            document["nextPageToken"] = str(start + limit)
        document["models"] = [{"modelName": m.name, "modelUrl": m.versions[m.default].url} for m in page]
        return 200, document

    async def describe(self, name: str, version: str | None, customized: bool) -> Answer:
        serving = self.serving
        if version == "all":
            versions = list(serving.model(name).versions.values())
        else:
            versions = [serving.version(name, version)]
        described = [_described(serving, registered) for registered in versions]
        if customized and version != "all":
            described[0]["customizedMetadata"] = await _customized(serving, name, versions[0])
        return 200, described

    async def scale(self, name: str, version: str | None, params: dict[str, str]) -> Answer:
        low = _integer(params, "min_worker", 0)
        low = 1 if low is None else low
        high = _integer(params, "max_worker", 0)
        high = low if high is None else high
        if high < low:
            raise TorchServeError(400, "BadRequestException", "max_worker cannot be less than min_worker.")
        pending = await self.serving.scale(name, version, low, high, wait=_boolean(params, "synchronous", False))
        if pending is not None:
            _log_failure(pending)
            return _status(PROCESSING, 202)
        suffix = f", version: {version}" if version else ""
        return _status(f"Workers scaled to {low} for model: {name}{suffix}")

    async def unregister(self, name: str, version: str | None) -> Answer:
        if not self.serving.config.enable_model_api:
            raise _not_allowed()
        await self.serving.unregister(name, version)
        return _status(f'Model "{name}" unregistered')

    async def set_default(self, name: str, version: str) -> Answer:
        self.serving.set_default(name, version)
        return _status(f'Default version successfully updated for model "{name}" to "{version}"')


def routes(serving: TorchServing) -> list[Route]:
    api = ManagementApi(serving)

    def answering(handle: Callable[[HttpRequest], Awaitable[Answer]]) -> RouteHandler:
        async def answer(request: HttpRequest) -> HttpResponse:
            try:
                status, document = await handle(request)
            except TorchServeError as exc:
                return torchserve_error(exc)
            return pretty_json(document, status)
        return answer

    async def register(request: HttpRequest) -> Answer:
        return await api.register(_parameters(request, json_body=True))

    async def list_models(request: HttpRequest) -> Answer:
        return await api.list_models(_parameters(request))

    async def describe(request: HttpRequest) -> Answer:
        customized = _boolean(_parameters(request), "customized", False)
        return await api.describe(request.params["model"], request.params.get("version"), customized)

    async def scale(request: HttpRequest) -> Answer:
        params = _parameters(request)
        version = request.params.get("version") or params.get("model_version") or None
        return await api.scale(request.params["model"], version, params)

    async def unregister(request: HttpRequest) -> Answer:
        return await api.unregister(request.params["model"], request.params.get("version"))

    async def set_default(request: HttpRequest) -> Answer:
        return await api.set_default(request.params["model"], request.params["version"])

    versioned = rf"/models/{_MODEL}(?:/(?P<version>[^/]+))?"
    return [
        Route("POST", "/models", answering(register), Api.MODEL_REPOSITORY),
        Route("GET", "/models", answering(list_models), Api.MODEL_REPOSITORY),
        Route("PUT", rf"/models/{_MODEL}/(?P<version>[^/]+)/set-default", answering(set_default),
              Api.MODEL_REPOSITORY),
        Route("GET", versioned, answering(describe), Api.MODEL_REPOSITORY),
        Route("PUT", versioned, answering(scale), Api.MODEL_REPOSITORY),
        Route("DELETE", versioned, answering(unregister), Api.MODEL_REPOSITORY),
    ]


def _described(serving: TorchServing, registered: RegisteredVersion) -> dict[str, Any]:
    """One element of describe's array (tsfs §A2.3)."""
    settings = registered.settings
    model = next(m for m in serving.models() if registered in m.versions.values())
    processes: list[int | None] = []
    queued = 0
    if settings.min_workers:
        try:
            processes, queued = serving.dataplane.instances(model.name, str(registered.number))
        except ModelhostError:
            processes = []
    started = datetime.fromtimestamp(registered.started, timezone.utc).isoformat().replace("+00:00", "Z")
    return {
        "modelName": model.name, "modelVersion": registered.version, "modelUrl": registered.url,
        "runtime": registered.manifest.runtime, "minWorkers": settings.min_workers,
        "maxWorkers": settings.max_workers, "batchSize": settings.batch_size,
        "maxBatchDelay": settings.max_batch_delay_ms, "responseTimeout": settings.response_timeout_s,
        "startupTimeout": settings.startup_timeout_s, "maxRetryTimeoutInSec": 300,
        "clientTimeoutInMills": settings.client_timeout_ms, "parallelType": "", "parallelLevel": 0,
        "deviceType": "cpu", "continuousBatching": False, "useJobTicket": False, "useVenv": False,
        "stateful": False, "sequenceMaxIdleMSec": 0, "sequenceTimeoutMSec": 0, "maxNumSequence": 0,
        "maxSequenceJobQueueSize": 0, "loadedAtStartup": registered.loaded_at_startup,
        "workers": [{"id": str(9000 + index), "startTime": started,
                     "status": "READY" if pid is not None else "UNLOADING", "memoryUsage": _rss(pid),
                     "pid": pid if pid is not None else -1, "gpu": False, "gpuUsage": "N/A"}
                    for index, pid in enumerate(processes)],
        "jobQueueStatus": {"remainingCapacity": max(settings.job_queue_size - queued, 0),
                           "pendingRequests": queued},
    }


async def _customized(serving: TorchServing, name: str, registered: RegisteredVersion) -> Any:
    """The handler's own metadata: it runs with request header `describe: "True"` (BaseHandler's describe_handle)."""
    answer = await serving.predict(name, registered.version, HandlerRequest(
        {"body": ("", b"")}, {"describe": "True", "explain": "False", "url_path": ""}, new_request_id()))
    if answer.error:
        raise TorchServeError(answer.status, "InternalServerException", answer.body.decode("utf-8", "replace"))
    try:
        return orjson.loads(answer.body)
    except orjson.JSONDecodeError:
        return answer.body.decode("utf-8", "replace")


def _rss(pid: int | None) -> int:
    if pid is None:
        return 0
    try:
        with open(f"/proc/{pid}/statm", "rb") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, IndexError, ValueError):
        return 0


def _parameters(request: HttpRequest, json_body: bool = False) -> dict[str, str]:
    params = dict(parse_qsl(request.query.decode("latin-1")))
    content_type = request.headers.get(b"content-type", b"").split(b";")[0].strip().lower()
    if json_body and content_type == b"application/json" and request.body:
        try:
            document = orjson.loads(request.body)  # (depth-limited: json.loads recursed until RecursionError)
        except orjson.JSONDecodeError as exc:
            raise TorchServeError(400, "BadRequestException", f"the JSON body does not parse: {exc}") from None
        if not isinstance(document, dict):
            raise TorchServeError(400, "BadRequestException", "the JSON body must be an object of parameters")
        params.update({str(k): json.dumps(v) if isinstance(v, bool) else str(v) for k, v in document.items()})
    return params


def _integer(params: dict[str, str], key: str, smallest: int = 0) -> int | None:
    if key not in params or params[key] == "":
        return None
    try:
        value = int(params[key])
    except ValueError:
        raise TorchServeError(400, "BadRequestException", f"Parameter {key} must be an integer, got "
                                                          f"'{params[key]}'") from None
    if value < smallest:
        raise TorchServeError(400, "BadRequestException", f"Parameter {key} must be >= {smallest}, got {value}")
    return value


def _boolean(params: dict[str, str], key: str, default: bool) -> bool:
    value = params.get(key, "").strip().lower()
    return default if value == "" else value == "true"


def _allowed(url: str, serving: TorchServing) -> str:
    if "://" in url:
        check_allowed(url, serving.config)
    return url


def _not_allowed() -> TorchServeError:
    return TorchServeError(405, "MethodNotAllowedException",
                           "Requested method is not allowed, please refer to API document.")


def _status(message: str, status: int = 200) -> Answer:
    return status, {"status": message}


def _log_failure(task: asyncio.Task[None]) -> None:
    def done(finished: asyncio.Task[None]) -> None:
        if not finished.cancelled() and finished.exception() is not None:
            log.error("workers did not start: %s", finished.exception())
    task.add_done_callback(done)

