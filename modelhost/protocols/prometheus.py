"""GET /metrics: the Prometheus text exposition, on its own port (Triton's --metrics-port)."""

from __future__ import annotations

from modelhost.access import Api
from modelhost.metrics import MetricsExporter
from modelhost.protocols.http import HttpRequest, HttpResponse, Route


def routes(exporter: MetricsExporter) -> list[Route]:
    content_type = exporter.content_type.encode()

    async def metrics(request: HttpRequest) -> HttpResponse:
        return HttpResponse(200, [exporter.render()], [(b"content-type", content_type)])

    return [Route("GET", "/metrics", metrics, Api.METRICS)]
