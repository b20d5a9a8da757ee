"""TorchServe's inference API (tsfs §A1), default port 8080: `/ping`, `/predictions/{m}[/{v}[/...]]`,
`/explanations/...`, KServe v1's `/v1/models/{m}:predict|explain` wrapper and `/invocations`. Each request becomes
one HandlerRequest (request_data.py) for the model's handler, which the core batches with others; its answer is
sent as the handler gave it (status, content type, headers), failures in TorchServe's error shape."""

from __future__ import annotations

from urllib.parse import parse_qsl

from modelhost.access import Api
from modelhost.errors import ModelhostError
from modelhost.handler_messages import HandlerRequest, HandlerResponse
from modelhost.protocols.http.app import HttpRequest, HttpResponse, Route, RouteHandler
from modelhost.protocols.torchserve.answers import core_error, error, headers, pretty_json, torchserve_error
from modelhost.protocols.torchserve.request_data import request_parameters
from modelhost.protocols.torchserve.serving import TorchServeError, TorchServing, new_request_id

_MODEL = r"(?P<model>[^/]+)"
_VERSIONED = _MODEL + r"(?:/(?P<version>[^/]+)(?:/(?P<extra>.+))?)?"
PREDICT_METHODS = ("POST", "PUT", "GET")  # TorchServe routes predictions whatever the method


def routes(serving: TorchServing) -> list[Route]:
    async def ping(request: HttpRequest) -> HttpResponse:
        healthy = serving.healthy()
        return pretty_json({"status": "Healthy" if healthy else "Unhealthy"}, 200 if healthy else 500,
                           new_request_id())

    def predict(explain: bool) -> RouteHandler:
        async def handle(request: HttpRequest) -> HttpResponse:
            params = request.params
            return await _predict(serving, request, params["model"], params.get("version"), params.get("extra", ""),
                                  explain)
        return handle

    async def kserve_v1(request: HttpRequest) -> HttpResponse:
        return await _predict(serving, request, request.params["model"], None, "",
                              request.params["verb"] == "explain")

    async def invocations(request: HttpRequest) -> HttpResponse:
        query = dict(parse_qsl(request.query.decode("latin-1")))
        name = query.get("model_name") or serving.only_startup_model()
        if not name:
            return error(400, "BadRequestException", "Parameter model_name is required.")
        return await _predict(serving, request, name, None, "", False, query)

    predictions = [Route(method, rf"/predictions/{_VERSIONED}", predict(False), Api.INFERENCE)
                   for method in PREDICT_METHODS]
    return [
        Route("GET", "/ping", ping, Api.HEALTH),
        Route("POST", "/ping", ping, Api.HEALTH),
        *predictions,
        Route("POST", rf"/explanations/{_VERSIONED}", predict(True), Api.INFERENCE),
        Route("POST", r"/v1/models/(?P<model>[^/:]+):(?P<verb>predict|explain)", kserve_v1, Api.INFERENCE),
        Route("POST", "/invocations", invocations, Api.INFERENCE),
    ]


async def _predict(serving: TorchServing, request: HttpRequest, model: str, version: str | None, url_path: str,
                   explain: bool, query: dict[str, str] | None = None) -> HttpResponse:
    request_id = new_request_id()
    request_headers = {name.decode("latin-1"): value.decode("latin-1") for name, value in request.headers.items()}
    try:
        parameters = request_parameters(request_headers.get("content-type", ""), request.body)
        for name, value in (query or {}).items():  # query parameters reach the handler on /invocations only
            parameters.setdefault(name, ("", value.encode("utf-8")))
        request_headers["url_path"] = url_path
        request_headers["explain"] = "True" if explain else "False"
        answer = await serving.predict(model, version, HandlerRequest(parameters, request_headers, request_id))
    except TorchServeError as exc:
        return torchserve_error(exc, request_id)
    except ModelhostError as exc:
        return core_error(exc, request_id)
    return handler_answer(answer, request_id)


def handler_answer(answer: HandlerResponse, request_id: str) -> HttpResponse:
    """The handler's answer as TorchServe's frontend sends it: no content type unless the handler set one."""
    if answer.error:
        return error(answer.status, "InternalServerException", answer.body.decode("utf-8", "replace"), request_id)
    own = [(name.lower().encode("latin-1"), value.encode("latin-1", "replace"))
           for name, value in answer.headers.items()
           if name.lower() not in ("content-length", "content-type", "ts_stream_next")]
    if answer.content_type:
        own.append((b"content-type", answer.content_type.encode("latin-1", "replace")))
    return HttpResponse(answer.status, [answer.body], own + headers(request_id))
