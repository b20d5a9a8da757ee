"""GET /metrics: the Prometheus text exposition, on its own port (Triton's --metrics-port)."""

from __future__ import annotations

import asyncio

from modelhost.access import AccessPolicy, Api
from modelhost.core.worker_statistics import StatisticsPeers
from modelhost.metrics import MetricsExporter
from modelhost.metrics_sum import sum_expositions
from modelhost.protocols.front_end import FrontEnd
from modelhost.protocols.http.app import HttpApp, HttpRequest, HttpResponse, Route


def routes(exporter: MetricsExporter, workers: StatisticsPeers | None = None) -> list[Route]:
    content_type = exporter.content_type.encode()

    async def metrics(request: HttpRequest) -> HttpResponse:
        body = await exporter.scrape()
        if workers is not None:  # every worker's, summed: a scrape of any of them is the server's
            texts = [body.decode(), *await workers.gather_metrics()]
            body = await asyncio.to_thread(sum_expositions, texts)
        return HttpResponse(200, [body], [(b"content-type", content_type)])

    return [Route("GET", "/metrics", metrics, Api.METRICS)]


class MetricsFrontEnd(FrontEnd):
    """With --workers, every worker listens on the port and answers for all of them."""

    name = "metrics"
    counts_in_flight = False  # a scrape is not inference work

    def __init__(self, exporter: MetricsExporter, port: int, access: AccessPolicy,
                 workers: StatisticsPeers | None = None) -> None:
        self.port = port
        self.app = HttpApp(routes(exporter, workers), access=access)
