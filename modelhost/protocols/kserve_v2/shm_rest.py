"""Triton's shared memory routes over HTTP: /v2/systemsharedmemory/... (register, status, unregister) and
/v2/cudasharedmemory/..., which this server, without GPU support, answers as a server with no CUDA regions."""

from __future__ import annotations

from typing import Any

from modelhost.access import Api
from modelhost.core.shared_memory import SharedMemory
from modelhost.errors import ErrorKind, ModelhostError, invalid, not_found
from modelhost.protocols.http.app import HttpRequest, HttpResponse, Route, json_response
from modelhost.protocols.json_body import json_object

_SYSTEM = "/v2/systemsharedmemory"
_CUDA = "/v2/cudasharedmemory"
_REGION = "/region/(?P<region>.+)"
NO_CUDA = ("this server has no GPU support: CUDA shared memory cannot be registered; use system shared memory "
           "(/v2/systemsharedmemory) instead")


def routes(regions: SharedMemory) -> list[Route]:
    async def status(request: HttpRequest) -> HttpResponse:
        return json_response([{"name": s.name, "key": s.key, "offset": s.offset, "byte_size": s.byte_size}
                              for s in regions.status(request.params.get("region", ""))])

    async def register(request: HttpRequest) -> HttpResponse:
        body = json_object(request.body, holding="key, offset and byte_size")
        key = body.get("key")
        if not isinstance(key, str):
            raise invalid(f"register needs 'key', the shared memory object's key, as a string, got {key!r}")
        if "byte_size" not in body:
            raise invalid("register needs 'byte_size', the region's size in bytes")
        regions.register(request.params["region"], key, _number(body, "offset"), _number(body, "byte_size"))
        return HttpResponse(200, (), [])

    async def unregister(request: HttpRequest) -> HttpResponse:
        regions.unregister(request.params.get("region", ""))
        return HttpResponse(200, (), [])

    async def cuda_status(request: HttpRequest) -> HttpResponse:
        if "region" in request.params:
            raise not_found(f"no CUDA shared memory region '{request.params['region']}': {NO_CUDA}")
        return json_response([])

    async def cuda_register(request: HttpRequest) -> HttpResponse:
        raise ModelhostError(ErrorKind.UNSUPPORTED, NO_CUDA)

    async def cuda_unregister(request: HttpRequest) -> HttpResponse:
        return HttpResponse(200, (), [])  # there is none to unregister

    api = Api.SHARED_MEMORY
    return [
        Route("GET", _SYSTEM + "/status", status, api),
        Route("GET", _SYSTEM + _REGION + "/status", status, api),
        Route("POST", _SYSTEM + _REGION + "/register", register, api),
        Route("POST", _SYSTEM + "/unregister", unregister, api),
        Route("POST", _SYSTEM + _REGION + "/unregister", unregister, api),
        Route("GET", _CUDA + "/status", cuda_status, api),
        Route("GET", _CUDA + _REGION + "/status", cuda_status, api),
        Route("POST", _CUDA + _REGION + "/register", cuda_register, api),
        Route("POST", _CUDA + "/unregister", cuda_unregister, api),
        Route("POST", _CUDA + _REGION + "/unregister", cuda_unregister, api),
    ]


def _number(body: dict[str, Any], field: str) -> int:
    value = body.get(field, 0)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise invalid(f"register field '{field}' must be a non-negative integer, got {value!r}")
    return value
