"""The trace extension's settings over HTTP (`/v2[/models/<m>]/trace/setting`) and gRPC (`TraceSetting`).

Values travel as strings or lists of strings (gRPC: always lists); null, or an empty list, clears a setting.
The core (core/trace_settings.py) validates and applies them; this module only translates.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from modelhost.access import Api
from modelhost.core.dataplane import DataPlane
from modelhost.errors import invalid, not_found
from modelhost.protocols.grpc_service import Unary
from modelhost.protocols.http.app import HttpRequest, HttpResponse, Route, json_response
from modelhost.protocols.json_body import json_object
from modelhost.protocols.kserve_v2 import grpc_service_pb2 as pb

_GLOBAL = "/v2/trace/setting"
_MODEL = r"/v2/models/(?P<model>[^/]+)/trace/setting"
Changes = dict[str, Sequence[str] | None]


def trace_routes(dataplane: DataPlane) -> list[Route]:
    tracer = dataplane.tracer

    async def get(request: HttpRequest) -> HttpResponse:
        return json_response(tracer.get(_model(dataplane, request.params.get("model"))))

    async def update(request: HttpRequest) -> HttpResponse:
        model = _model(dataplane, request.params.get("model"))
        changes = _json_changes(json_object(request.body)) if request.body.strip() else {}
        return json_response(tracer.update(changes, model))

    return [
        Route("GET", _GLOBAL, get, Api.TRACE),
        Route("POST", _GLOBAL, update, Api.TRACE),
        Route("GET", _MODEL, get, Api.TRACE),
        Route("POST", _MODEL, update, Api.TRACE),
    ]


def trace_rpc(dataplane: DataPlane) -> Unary:
    """`TraceSetting`: settings to change in `settings` (an empty value list clears one); none: a read."""
    tracer = dataplane.tracer

    async def trace_setting(request: pb.TraceSettingRequest) -> pb.TraceSettingResponse:
        model = _model(dataplane, request.model_name or None)
        changes: Changes = {name: list(value.value) or None for name, value in request.settings.items()}
        answer = tracer.update(changes, model) if changes else tracer.get(model)
        response = pb.TraceSettingResponse()
        for name, value in answer.items():
            response.settings[name].value.extend(value if isinstance(value, list) else [value])
        return response

    return Unary("TraceSetting", pb.TraceSettingRequest, trace_setting, Api.TRACE)


def _model(dataplane: DataPlane, name: str | None) -> str | None:
    """The model a request names (None: the global settings); NOT_FOUND when the server has none of that name."""
    if name is not None and not dataplane.knows(name):
        raise not_found(f"unknown model '{name[:200]}': no trace settings")
    return name


def _json_changes(body: Mapping[str, Any]) -> Changes:
    changes: Changes = {}
    for name, value in body.items():
        if value is None or isinstance(value, str):
            changes[name] = value if value is None else [value]
        elif isinstance(value, list) and all(isinstance(item, str) for item in value):
            changes[name] = value
        else:
            raise invalid(f"trace setting '{name[:64]}' must be a string, a list of strings or null, "
                          f"got {type(value).__name__}")
    return changes
