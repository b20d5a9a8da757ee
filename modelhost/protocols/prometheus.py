"""GET /metrics: the Prometheus text exposition, on its own port (Triton's --metrics-port)."""

from __future__ import annotations

from modelhost.access import AccessPolicy, Api
from modelhost.metrics import MetricsExporter
from modelhost.protocols.front_end import FrontEnd
from modelhost.protocols.http.app import HttpApp, HttpRequest, HttpResponse, Route


def routes(exporter: MetricsExporter) -> list[Route]:
    content_type = exporter.content_type.encode()

    async def metrics(request: HttpRequest) -> HttpResponse:
        return HttpResponse(200, [exporter.render()], [(b"content-type", content_type)])

    return [Route("GET", "/metrics", metrics, Api.METRICS)]


class MetricsFrontEnd(FrontEnd):
    """Each worker process its own port (the base port plus its index): a scrape sees one process's figures."""

    name = "metrics"
    shared = False
    counts_in_flight = False  # a scrape is not inference work

    def __init__(self, exporter: MetricsExporter, port: int, access: AccessPolicy) -> None:
        self.port = port
        self.app = HttpApp(routes(exporter), access=access)
