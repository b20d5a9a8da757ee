"""Triton's logging extension: GET/POST /v2/logging and the LogSettings RPC; parse, call LogSettings, encode.

Both answer every setting (Triton's JSON object; gRPC's map of SettingValue: bool_param, uint32_param or
string_param by the value's type). A JSON null or a SettingValue with no value changes nothing, as in Triton.
The RPC is a second Service under Triton's service name: grpc tries each service's handlers in turn.
"""

from __future__ import annotations

from typing import Any

from modelhost.access import Api
from modelhost.errors import invalid
from modelhost.log_settings import LogSettings
from modelhost.protocols.grpc_service import Service, Unary
from modelhost.protocols.http.app import HttpRequest, HttpResponse, Route, json_response
from modelhost.protocols.json_body import json_object
from modelhost.protocols.kserve_v2 import grpc_service_pb2 as pb
from modelhost.protocols.kserve_v2.grpc import SERVICE_NAME


def routes(settings: LogSettings) -> list[Route]:
    async def get(request: HttpRequest) -> HttpResponse:
        return json_response(settings.current())

    async def post(request: HttpRequest) -> HttpResponse:
        return json_response(settings.update(json_object(request.body, holding="log settings")))

    return [Route("GET", "/v2/logging", get, Api.LOGGING), Route("POST", "/v2/logging", post, Api.LOGGING)]


def service(settings: LogSettings) -> Service:
    async def log_settings(request: pb.LogSettingsRequest) -> pb.LogSettingsResponse:
        changes: dict[str, Any] = {}
        for name, value in request.settings.items():
            choice = value.WhichOneof("parameter_choice")
            changes[name] = None if choice is None else getattr(value, choice)
        return _response(settings.update(changes) if changes else settings.current())

    return Service(SERVICE_NAME, [Unary("LogSettings", pb.LogSettingsRequest, log_settings, Api.LOGGING)])


def _response(values: dict[str, Any]) -> pb.LogSettingsResponse:
    response = pb.LogSettingsResponse()
    for name, value in values.items():
        entry = response.settings[name]
        if isinstance(value, bool):
            entry.bool_param = value
        elif isinstance(value, int):
            entry.uint32_param = value
        elif isinstance(value, str):
            entry.string_param = value
        else:
            raise invalid(f"log setting '{name}' has no gRPC form")  # not reached: LogSettings holds these types
    return response
