"""TorchServe's inference API (tsfs §A1), default port 8080: `/ping`, `/predictions/{m}[/{v}[/...]]`,
`/explanations/...`, KServe v1's `/v1/models/{m}:predict|explain` wrapper and `/invocations`. Each request becomes
one HandlerRequest (request_data.py) for the model's handler, which the core batches with others; its answer is
sent as the handler gave it (status, content type, headers), failures in TorchServe's error shape. A handler that
sends intermediate answers (tsfs §A1.6) has them streamed as they come, one chunk each, the head from the first."""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator
from urllib.parse import parse_qsl

from modelhost.access import Api
from modelhost.errors import ErrorKind, ModelhostError
from modelhost.handler_messages import STREAM_NEXT_HEADER, HandlerRequest, HandlerResponse
from modelhost.protocols.http.app import HttpRequest, HttpResponse, Route, RouteHandler
from modelhost.protocols.torchserve.answers import core_error, error, headers, pretty_json, torchserve_error
from modelhost.protocols.torchserve.errors import TorchServeError
from modelhost.protocols.torchserve.request_data import request_parameters
from modelhost.protocols.torchserve.serving import TorchServing, new_request_id

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
        answers = serving.answers(model, version, HandlerRequest(parameters, request_headers, request_id))
        answer, last = await anext(answers)
    except TorchServeError as exc:
        return torchserve_error(exc, request_id)
    except ModelhostError as exc:
        return core_error(exc, request_id)
    if last:
        await answers.aclose()
        return handler_answer(answer, request_id)
    return HttpResponse(answer.status, [answer.body], _answer_headers(answer, request_id, streamed=True),
                        _later_parts(answers))


async def _later_parts(answers: AsyncGenerator[tuple[HandlerResponse, bool], None]) -> AsyncIterator[bytes]:
    """The bodies of a streamed answer after its first, as TorchServe sends them: one chunk each, no framing. A
    final answer that is a failure cuts the stream (its head, with the first answer's status, is sent)."""
    try:
        async for answer, _ in answers:
            if answer.error:
                raise ModelhostError(ErrorKind.INTERNAL, answer.body.decode("utf-8", "replace"))
            yield answer.body
    finally:
        await answers.aclose()  # a request the client left is withdrawn from its queue


def handler_answer(answer: HandlerResponse, request_id: str) -> HttpResponse:
    """The handler's answer as TorchServe's frontend sends it: no content type unless the handler set one."""
    if answer.error:
        return error(answer.status, "InternalServerException", answer.body.decode("utf-8", "replace"), request_id)
    return HttpResponse(answer.status, [answer.body], _answer_headers(answer, request_id, streamed=False))


def _answer_headers(answer: HandlerResponse, request_id: str, streamed: bool) -> list[tuple[bytes, bytes]]:
    """The handler's headers and content type, and TorchServe's own. A streamed answer's head is its first part's,
    which carries `ts_stream_next: true` as TorchServe's does."""
    skipped = ("content-length", "content-type", "transfer-encoding") + (() if streamed else (STREAM_NEXT_HEADER,))
    own = [(name.lower().encode("latin-1"), value.encode("latin-1", "replace"))
           for name, value in answer.headers.items() if name.lower() not in skipped]
    if answer.content_type:
        own.append((b"content-type", answer.content_type.encode("latin-1", "replace")))
    return own + headers(request_id)
