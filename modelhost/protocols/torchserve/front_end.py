"""The TorchServe front-ends, each a port of its own: its inference API on the inference address (and, where the
management address is the same, the management API with it, as SageMaker's containers configure it), the
management API, and the metrics API (unless `enable_metrics_api=false`). Every answer of the API ports counts in
`Requests2XX`/`4XX`/`5XX`."""

from __future__ import annotations

from dataclasses import replace
from urllib.parse import parse_qsl

from modelhost.access import Api
from modelhost.protocols.front_end import FrontEnd
from modelhost.protocols.http.app import HttpApp, HttpRequest, HttpResponse, Route, RouteHandler
from modelhost.protocols.torchserve import inference, management
from modelhost.protocols.torchserve.answers import app_error, error
from modelhost.protocols.torchserve.config_properties import Address
from modelhost.protocols.torchserve.metrics import CONTENT_TYPE, TorchServeMetrics
from modelhost.protocols.torchserve.serving import TorchServing
from modelhost.protocols.torchserve.tokens import API, FAILED, INFERENCE, MANAGEMENT, TokenKeys


class TorchServeFrontEnd(FrontEnd):
    """One API port: its route groups, each with the key it needs when token authorization is on."""

    def __init__(self, name: str, address: Address, groups: list[tuple[str, list[Route]]], max_body_bytes: int,
                 metrics: TorchServeMetrics, tokens: TokenKeys | None, owns_key_file: bool = False) -> None:
        self.name = name
        self.host = address.host
        self.port = address.port
        self._key_file = tokens if owns_key_file else None

        def counted_error(status: int, message: str) -> HttpResponse:
            metrics.status(status)
            return app_error(status, message)

        def counted(handler: RouteHandler, kind: str) -> RouteHandler:
            async def handle(request: HttpRequest) -> HttpResponse:
                authorization = request.headers.get(b"authorization", b"").decode("latin-1")
                if tokens is not None and not tokens.allows(kind, authorization):
                    response = error(400, "InvalidKeyException", FAILED)
                else:
                    response = await handler(request)
                metrics.status(response.status)
                return response
            return handle

        routes = [replace(route, handler=counted(route.handler, kind)) for kind, group in groups for route in group]
        if tokens is not None and any(kind == MANAGEMENT for kind, _ in groups):
            routes.insert(0, Route("GET", "/token", _token_route(tokens), Api.MODEL_REPOSITORY))
        self.app = HttpApp(routes, max_body_bytes=max_body_bytes, errors=counted_error)

    async def stop(self) -> None:
        if self._key_file is not None:
            self._key_file.remove()


def _token_route(tokens: TokenKeys) -> RouteHandler:
    """`GET /token?type=management|inference` with the API key: that key replaced (tsfs §A7.3)."""
    async def renew(request: HttpRequest) -> HttpResponse:
        kind = dict(parse_qsl(request.query.decode("latin-1"))).get("type", "").lower()
        authorization = request.headers.get(b"authorization", b"").decode("latin-1")
        if kind not in (MANAGEMENT, INFERENCE) or not tokens.allows(API, authorization):
            return error(400, "InvalidKeyException",
                         "Token Authentication failed. Token either incorrect, expired, or not provided correctly")
        tokens.renew(kind)
        return HttpResponse(200, [b""], [(b"content-type", b"application/json")])
    return renew


def torchserve_front_ends(serving: TorchServing, tokens: TokenKeys | None) -> list[FrontEnd]:
    """The front-ends; `tokens` the keys of token authorization (None: it is off), whose file the inference
    front-end removes at stop."""
    config, metrics = serving.config, serving.metrics
    limit = config.max_request_size
    inference_routes = (INFERENCE, inference.routes(serving))
    management_routes = (MANAGEMENT, management.routes(serving))
    if config.management_address == config.inference_address:  # one listener, both APIs (SageMaker's)
        front_ends: list[FrontEnd] = [TorchServeFrontEnd(
            "TorchServe", config.inference_address, [inference_routes, management_routes], limit, metrics, tokens,
            owns_key_file=True)]
    else:
        front_ends = [
            TorchServeFrontEnd("TorchServe inference", config.inference_address, [inference_routes], limit,
                               metrics, tokens, owns_key_file=True),
            TorchServeFrontEnd("TorchServe management", config.management_address, [management_routes], limit,
                               metrics, tokens),
        ]
    if config.enable_metrics_api:
        front_ends.append(TorchServeMetricsFrontEnd(metrics, config.metrics_address))
    return front_ends


class TorchServeMetricsFrontEnd(FrontEnd):
    counts_in_flight = False  # a scrape is not inference work

    def __init__(self, metrics: TorchServeMetrics, address: Address) -> None:
        self.name = "TorchServe metrics"
        self.host, self.port = address.host, address.port

        async def scrape(request: HttpRequest) -> HttpResponse:
            names = {value for key, value in parse_qsl(request.query.decode("latin-1")) if key == "name[]"}
            return HttpResponse(200, [metrics.render(names or None)], [(b"content-type", CONTENT_TYPE)])

        self.app = HttpApp([Route("GET", "/metrics", scrape, Api.METRICS)], errors=app_error)
