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
from modelhost.protocols.torchserve.answers import app_error
from modelhost.protocols.torchserve.config_properties import Address
from modelhost.protocols.torchserve.metrics import CONTENT_TYPE, TorchServeMetrics
from modelhost.protocols.torchserve.serving import TorchServing


class TorchServeFrontEnd(FrontEnd):
    def __init__(self, name: str, address: Address, routes: list[Route], max_body_bytes: int,
                 metrics: TorchServeMetrics) -> None:
        self.name = name
        self.host = address.host
        self.port = address.port

        def counted_error(status: int, message: str) -> HttpResponse:
            metrics.status(status)
            return app_error(status, message)

        def counted(handler: RouteHandler) -> RouteHandler:
            async def handle(request: HttpRequest) -> HttpResponse:
                response = await handler(request)
                metrics.status(response.status)
                return response
            return handle

        self.app = HttpApp([replace(route, handler=counted(route.handler)) for route in routes],
                           max_body_bytes=max_body_bytes, errors=counted_error)


def torchserve_front_ends(serving: TorchServing) -> list[FrontEnd]:
    config, metrics = serving.config, serving.metrics
    limit = config.max_request_size
    if config.management_address == config.inference_address:  # one listener, both APIs (SageMaker's)
        front_ends: list[FrontEnd] = [TorchServeFrontEnd(
            "TorchServe", config.inference_address, inference.routes(serving) + management.routes(serving), limit,
            metrics)]
    else:
        front_ends = [
            TorchServeFrontEnd("TorchServe inference", config.inference_address, inference.routes(serving), limit,
                               metrics),
            TorchServeFrontEnd("TorchServe management", config.management_address, management.routes(serving),
                               limit, metrics),
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
