"""Composition root: store -> manager -> data plane and control -> protocols -> HTTP server.

Start in that order, stop in reverse: the HTTP server stops accepting and finishes its
in-flight requests first, then every model drains and unloads.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import uvloop

from modelhost import __version__
from modelhost.core.control import Control
from modelhost.core.dataplane import DataPlane
from modelhost.core.load import ServerLoad
from modelhost.core.manager import ModelManager
from modelhost.metrics import MetricsExporter
from modelhost.protocols import prometheus
from modelhost.protocols.http import HttpApp
from modelhost.protocols.http_server import HttpServer, Site
from modelhost.protocols.kserve_v2 import rest as kserve_v2_rest
from modelhost.settings import ServerSettings
from modelhost.store.local import LocalStore

log = logging.getLogger("modelhost")


class Server:
    """One modelhost server; `build_asgi()` gives the ASGI app, `run()` serves it until a signal."""

    def __init__(self, settings: ServerSettings) -> None:
        self.settings = settings
        self.repository = self._repository_path()
        self.load = ServerLoad()
        self.manager = ModelManager(
            LocalStore(self.repository), settings.cpu_count, settings.default_max_batch_size, self.load
        )
        self.dataplane = DataPlane(self.manager, __version__, settings.strict_readiness)
        self.control = Control(self.manager)
        self._loading: asyncio.Task[None] | None = None

    def _repository_path(self) -> Path:
        if self.settings.model_repository is not None:
            path = self.settings.model_repository
            if not path.is_dir():
                raise SystemExit(f"--model-repository {path} is not a directory")
            return path
        from modelhost.example_repository import ensure_example_repository

        return ensure_example_repository(self.settings.cache_dir)

    def build_asgi(self) -> HttpApp:
        return HttpApp(
            kserve_v2_rest.routes(self.dataplane, self.control),
            startup=self._start,
            shutdown=self._stop,
            max_body_bytes=self.settings.http_max_body_bytes,
        )

    def build_metrics_asgi(self) -> HttpApp:
        return HttpApp(prometheus.routes(MetricsExporter(self.manager.served, self.load)))

    async def _start(self) -> None:
        if self.settings.workers > 1:
            # Workers share the port: one that binds before its models load would take connections
            # it can only answer 503, so it loads first and binds after.
            await self._load()
            return
        # One process binds first and loads after, so that liveness answers while models load.
        self._loading = asyncio.create_task(self._load())

    async def _load(self) -> None:
        log.info("loading models from %s", self.repository)
        await self.manager.load_all()
        for entry in self.manager.index():
            if entry.state == "READY":
                log.info("model %s version %s: READY", entry.name, entry.version)
            else:
                log.warning("model %s version %s: %s (%s)", entry.name, entry.version or "-", entry.state, entry.reason)
        self.dataplane.mark_started()
        log.info("ready: HTTP on %s:%d", self.settings.host, self.settings.http_port)

    async def _stop(self) -> None:
        if self._loading is not None and not self._loading.done():
            self._loading.cancel()
        log.info("stopping: draining and unloading models")
        await self.manager.stop()
        log.info("stopped")

    def run(self) -> None:
        s = self.settings
        log.info(
            "modelhost %s: HTTP %s:%d, metrics %s (gRPC port %d is reserved for the gRPC front-end)",
            __version__, s.host, s.http_port, f"{s.host}:{s.metrics_port}" if s.metrics_port else "off", s.grpc_port,
        )
        sites = [Site("HTTP", self.build_asgi(), s.http_port, self.load)]
        if s.metrics_port:
            sites.append(Site("metrics", self.build_metrics_asgi(), s.metrics_port + s.worker_index))
        server = HttpServer(sites, s.host, s.http_max_body_bytes, s.graceful_shutdown_seconds,
                            reuse_port=s.workers > 1)
        uvloop.run(server.serve())
