"""Composition root: store -> manager (-> multi-model cache) -> data plane and control -> protocols -> servers.

Start in that order, stop in reverse: on SIGTERM the HTTP and gRPC servers stop accepting and
finish their in-flight requests together, then every model drains and unloads. Both servers run
on the one uvloop event loop and call the one data plane, so a request over either joins the
same per-model batch queue.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import shutil
import signal
import ssl
import tempfile
from dataclasses import replace
from pathlib import Path

import uvloop

from modelhost import __version__, client_log
from modelhost.access import AccessPolicy
from modelhost.backends.python import triton_bls
from modelhost.core import compute_threads, loop_gate, spare_cores
from modelhost.core.code_policy import CodePolicy
from modelhost.core.control import Control
from modelhost.core.dataplane import DataPlane
from modelhost.core.in_flight import InFlight
from modelhost.core.manager import ModelManager
from modelhost.core.model_cache import ModelCache
from modelhost.core.repository_poll import RepositoryPoller
from modelhost.core.shared_memory import SharedMemory
from modelhost.core.spare_cores import FILE_NAME as SPARE_CORES_FILE
from modelhost.core.spare_cores import SpareCores
from modelhost.core.trace import Tracer
from modelhost.core.trace_setup import make_tracer
from modelhost.core.worker_control import WorkerControl
from modelhost.core.worker_statistics import StatisticsPeers, WorkerStatistics
from modelhost.embeddings.store import StoreSettings, configure_store, shared_store
from modelhost.embeddings.watcher import TableWatcher
from modelhost.errors import hide_paths_under
from modelhost.log_settings import LogSettings, update_refusal
from modelhost.metrics import MetricsExporter
from modelhost.model_sources import open_model_sources
from modelhost.protocols import openapi
from modelhost.protocols.front_end import FrontEnd
from modelhost.protocols.grpc_server import GrpcOptions, GrpcServer, ListenError
from modelhost.protocols.header_forwarding import HeaderForwarding
from modelhost.protocols.http.app import HttpApp
from modelhost.protocols.http.limits import HttpLimits
from modelhost.protocols.http.server import HttpServer, Listener
from modelhost.protocols.kserve_v2 import grpc as kserve_v2_grpc
from modelhost.protocols.kserve_v2 import logging_api, shm_rest
from modelhost.protocols.kserve_v2 import rest as kserve_v2_rest
from modelhost.protocols.prometheus import MetricsFrontEnd
from modelhost.protocols.sagemaker.front_end import SageMakerFrontEnd, SageMakerOptions, local_url
from modelhost.protocols.sagemaker.target_model import ArchiveLimits
from modelhost.protocols.sagemaker.target_models import TargetModels
from modelhost.protocols.tfserving import grpc as tfserving_grpc
from modelhost.protocols.tfserving import rest as tfserving_rest
from modelhost.protocols.tfserving.model_config_poll import ModelConfigPoller
from modelhost.protocols.tfserving.model_server import TfServingSetup
from modelhost.protocols.tfserving.serving import TfServing
from modelhost.protocols.tfserving.warmup_records import read_warmup_requests
from modelhost.protocols.tls import ServerTls, TlsError, TlsFiles
from modelhost.protocols.torchserve import grpc as torchserve_grpc
from modelhost.protocols.torchserve.front_end import torchserve_front_ends
from modelhost.protocols.torchserve.model_server import TorchServeSetup
from modelhost.protocols.torchserve.serving import TorchServing
from modelhost.protocols.torchserve.tokens import TokenKeys
from modelhost.settings import (
    ServerSettings,
    handler_threads,
    model_load_roots,
    request_limits,
    unpacked_cache_bytes,
)

log = logging.getLogger("modelhost")
GC_YOUNG_THRESHOLD = 10_000


class Server:
    """One modelhost server; `build_asgi()` gives the ASGI app, `run()` serves it (and gRPC) until a signal."""

    def __init__(self, settings: ServerSettings, tfserving: TfServingSetup | None = None,
                 torchserve: TorchServeSetup | None = None, peers: StatisticsPeers | None = None) -> None:
        """`tfserving`: serve as `modelhost tfserving` does, its model list instead of a repository; `torchserve`:
        as `modelhost torchserve`, the models registered with its APIs. `peers`: the other processes serving the
        same models (a Ray Serve deployment's replicas), whose statistics and metrics answers add up with this
        one's; --workers' are found without it."""
        self.settings = settings
        self.tfserving_setup = tfserving
        self.torchserve_setup = torchserve
        settings.cache_dir.mkdir(parents=True, exist_ok=True)
        # This process's own files (generated layouts, unpacked archives), removed at stop.
        self.work_dir = Path(tempfile.mkdtemp(prefix="server-", dir=settings.cache_dir))
        # What clients may make this process log, and see: errors name files relative to these directories.
        client_log.configure(settings.client_log_lines_per_second)
        compute_threads.configure(settings.compute_priority)
        loop_gate.configure(settings.lone_request_max_us * 1000)
        # Each process of --workers holds its own state of a table: only a lone process takes updates.
        configure_store(StoreSettings(settings.embedding_cache_bytes, settings.embedding_io_threads,
                                      settings.embedding_cache_policy, updates=settings.workers == 1,
                                      compact_log_bytes=settings.embedding_compact_log_bytes))
        self.table_watcher = TableWatcher(shared_store(), settings.embedding_poll_seconds)
        # A young-generation collection every 10,000 net container allocations, not Python's 700: a 500-row JSON
        # request holds a list per row while it decodes, which at 700 triggered a collection in every request
        # (0.2 ms each); what requests allocate is freed by refcounting when they end, so few collections remain.
        gc.set_threshold(GC_YOUNG_THRESHOLD, *gc.get_threshold()[1:])
        hide_paths_under(self.work_dir, settings.cache_dir,
                         *([settings.model_repository] if settings.model_repository and
                           "://" not in settings.model_repository else []))
        self.in_flight = InFlight()
        spare_cores.configure(
            SpareCores.shared(Path(settings.workers_dir) / SPARE_CORES_FILE, settings.worker_index,
                              settings.cpu_count * settings.workers, self.in_flight)
            if settings.workers > 1 and settings.workers_dir else SpareCores.alone(settings.cpu_count, self.in_flight))
        self.tls = self._server_tls()
        self.http_access = AccessPolicy(settings.http_restricted_apis + settings.token_restrictions)
        self.grpc_access = AccessPolicy(settings.grpc_restricted_protocols + settings.token_restrictions)
        self.sources = open_model_sources(settings, self.work_dir, tfserving, torchserve)
        store = self.sources.store
        self.code_policy = CodePolicy(settings.user_code)
        # TF Serving's warmup requests (assets.extra/tf_serving_warmup_requests) are replayed unless
        # `modelhost tfserving --enable_model_warmup=false` says not to.
        warmup = None if tfserving is not None and not tfserving.model_warmup else read_warmup_requests
        overrides = replace(settings.model_overrides, gpu_fallback=settings.gpu_fallback == "cpu")
        self.manager = ModelManager(store, settings.cpu_count, settings.default_max_batch_size, self.in_flight,
                                    overrides, self.work_dir, self.code_policy, warmup)
        self.dataplane = DataPlane(self.manager, __version__, settings.strict_readiness, request_limits(settings),
                                   settings.embedding_updates, self._tracer(), settings.server_name,
                                   SharedMemory(settings.allow_client_shm, settings.client_shm_max_regions,
                                                settings.client_shm_max_bytes))
        self.log_settings = LogSettings(settings.log_level, update_refusal(settings.logging_updates, settings.workers),
                                        process=f"worker {settings.worker_index}" if settings.workers > 1 else "")
        self.tfserving = TfServing(self.dataplane, typed_outputs=tfserving is None or tfserving.typed_outputs)
        self.model_config_poller = None if tfserving is None else ModelConfigPoller(tfserving, self.tfserving.labels)
        mar_repository = self.sources.mar_repository
        self.torchserving = None if torchserve is None or mar_repository is None else TorchServing(
            self.dataplane, self.manager, mar_repository, torchserve.config, settings.cpu_count)
        # TorchServe's token authorization: its key file is written now, in the working directory, as TorchServe's.
        self.torchserve_tokens = None if torchserve is None or torchserve.config.disable_token_authorization \
            else TokenKeys(Path.cwd(), torchserve.config.token_expiration_min)
        self.worker_statistics = (WorkerStatistics(Path(settings.workers_dir), settings.worker_index, settings.workers)
                                  if settings.workers > 1 and settings.workers_dir else None)
        self.peers = peers or self.worker_statistics
        if self.peers is not None:
            self.dataplane.sum_statistics_with(self.peers)
        # A multi-model endpoint: every model in memory is within the cache's budget.
        self.cache = (ModelCache(self.manager, settings.model_cache_bytes, settings.model_cache_policy)
                      if settings.multi_model or settings.models_on_demand else None)
        if self.cache is not None:
            self.manager.set_budget(self.cache)
        self.metrics = MetricsExporter(self.manager.served, self.in_flight, self.cache)
        self.control = Control(self.manager, settings.model_control_mode, store)
        self.poller = (RepositoryPoller(self.manager, store, settings.repository_poll_seconds)
                       if store is not None and settings.model_control_mode == "poll" else None)
        # The front-ends with a port of their own besides the HTTP port, each served when its port is set.
        self.front_ends: list[FrontEnd] = [
            front_end for port, make in ((settings.sagemaker_port, self._sagemaker_front_end),
                                         (settings.metrics_port, self._metrics_front_end)) if port
            for front_end in [make()]
        ] + (torchserve_front_ends(self.torchserving, self.torchserve_tokens) if self.torchserving is not None else [])
        self._loading: asyncio.Task[None] | None = None
        self._http: HttpServer | None = None  # set by run()
        self.grpc = self._grpc_server() if settings.grpc_port else None
        # Every gRPC server: modelhost's own port, and TorchServe's two.
        self.grpc_servers = ([self.grpc] if self.grpc is not None else []) + self._torchserve_grpc_servers()

    def _tracer(self) -> Tracer:
        try:
            return make_tracer(self.settings.trace_config, self.settings.worker_index if self.settings.workers > 1
                               else None)
        except ImportError as exc:
            raise SystemExit(f"modelhost: {exc}") from None

    def _server_tls(self) -> ServerTls | None:
        s = self.settings
        if s.tls_cert_file is None or s.tls_key_file is None:
            return None
        try:
            return ServerTls(TlsFiles(s.tls_cert_file, s.tls_key_file, s.tls_ca_file))
        except TlsError as exc:
            raise SystemExit(f"modelhost: {exc}") from None

    def _tls_for(self, site: str) -> ssl.SSLContext | None:
        """The TLS context of one of settings.TLS_SITES, None when it is plain."""
        return self.tls.context if self.tls is not None and site not in self.settings.tls_off else None

    def _reload_tls(self) -> None:
        """SIGHUP: new handshakes on every port use the certificate files as they are now."""
        assert self.tls is not None
        try:
            self.tls.reload()
        except TlsError as exc:
            log.error("SIGHUP: TLS certificate not reloaded, the old one stays in use: %s", exc)
            return
        log.info("SIGHUP: reloaded the TLS certificate %s (open connections keep theirs)", self.tls.files.cert)

    def _grpc_server(self) -> GrpcServer:
        s = self.settings
        options = GrpcOptions(s.grpc_max_message_bytes, s.grpc_keepalive_time_seconds,
                              s.grpc_keepalive_timeout_seconds, reuse_port=s.workers > 1)
        credentials = self.tls.grpc_credentials() if self.tls is not None and "grpc" not in s.tls_off else None
        reload = None if self.model_config_poller is None else self.model_config_poller.reload
        services = [kserve_v2_grpc.service(self.dataplane, self.control,
                                           HeaderForwarding(self.settings.grpc_header_forward_pattern)),
                    logging_api.service(self.log_settings),
                    kserve_v2_grpc.embedding_service(self.dataplane), *tfserving_grpc.services(self.tfserving, reload)]
        return GrpcServer(services, s.host, s.grpc_port, options, self.in_flight, self.grpc_access, credentials)

    def _torchserve_grpc_servers(self) -> list[GrpcServer]:
        if self.torchserving is None:
            return []
        s, config = self.settings, self.torchserving.config
        options = GrpcOptions(max(config.max_request_size, config.max_response_size), s.grpc_keepalive_time_seconds,
                              s.grpc_keepalive_timeout_seconds)
        credentials = self.tls.grpc_credentials() if self.tls is not None else None
        return [GrpcServer([service], host, port, options, self.in_flight, credentials=credentials)
                for service, host, port in (
                    (torchserve_grpc.inference_service(self.torchserving, self.torchserve_tokens),
                     config.grpc_inference_address, config.grpc_inference_port),
                    (torchserve_grpc.management_service(self.torchserving, self.torchserve_tokens),
                     config.grpc_management_address, config.grpc_management_port))]

    def build_asgi(self) -> HttpApp:
        return HttpApp(
            kserve_v2_rest.routes(self.dataplane, self.control,
                                  HeaderForwarding(self.settings.http_header_forward_pattern))
            + logging_api.routes(self.log_settings)
            + shm_rest.routes(self.dataplane.shared_memory)
            + tfserving_rest.routes(self.dataplane, self.tfserving,
                                    self.tfserving_setup.metrics_path if self.tfserving_setup else None)
            + openapi.routes(),
            startup=self._start,
            shutdown=self._stop,
            max_body_bytes=self.settings.http_max_body_bytes,
            access=self.http_access,
        )

    def _sagemaker_front_end(self) -> SageMakerFrontEnd:
        s = self.settings
        options = SageMakerOptions(
            s.sagemaker_port, local_url(s.host, s.sagemaker_port, self._tls_for("sagemaker") is not None),
            s.default_accept, s.invocation_timeout_seconds, s.sagemaker_program, s.default_model_name,
            handler_threads(s), s.http_max_body_bytes,
            # The TF Serving container's context.grpc_port: this server's gRPC port, where handlers reach it in plain
            # text (with TLS on gRPC they would need credentials the container's conventions have no place for).
            s.grpc_port if s.grpc_port and (self.tls is None or "grpc" in s.tls_off) else None,
        )
        target_models = None if self.cache is None else TargetModels(
            self.cache, self.manager, self.sources.archives, self.work_dir / "cache",
            ArchiveLimits(s.max_unpacked_bytes, s.max_archive_members, unpacked_cache_bytes(s, self.work_dir)),
            s.default_model_name, model_load_roots(s), program=s.sagemaker_program)
        return SageMakerFrontEnd(options, self.dataplane, self.manager.names_view(), target_models,
                                 self.sources.layout, self.sources.root, self.work_dir, self.code_policy,
                                 self.http_access)

    def _metrics_front_end(self) -> MetricsFrontEnd:
        return MetricsFrontEnd(self.metrics, self.settings.metrics_port, self.http_access, self.peers)

    def front_end(self, name: str) -> FrontEnd:
        """The front-end of that name (e.g. "SageMaker"), when its port is set."""
        return next(front_end for front_end in self.front_ends if front_end.name == name)

    async def _start(self) -> None:
        triton_bls.connect(self.dataplane, self.control)  # Triton Python models' BLS calls and model loading API
        if self.worker_statistics is not None:  # before the models load: the other workers may ask any time
            control = WorkerControl(self.control, self.worker_statistics, self.settings.worker_index)
            self.control.on_change(control.announced)
            await self.worker_statistics.serve(self.dataplane.local_statistics, self.metrics.scrape, control.adopt)
        if self.settings.workers > 1:
            # Workers share the port: one that binds before its models load would take connections
            # it can only answer 503, so it loads first and binds after.
            await self._load()
            await self._start_grpc()
            return
        # One process binds first and loads after, so that liveness answers while models load.
        await self._start_grpc()
        self._loading = asyncio.create_task(self._load())

    async def _start_grpc(self) -> None:
        if self._http is None:
            return
        for server in self.grpc_servers:
            await server.start()

    def _stop_grpc(self) -> None:
        """When HTTP begins to stop (a signal): gRPC stops accepting at once too; each drains its own calls."""
        for server in self.grpc_servers:
            server.stop(self.settings.graceful_shutdown_seconds)

    async def _load(self) -> None:
        if self.cache is not None:
            log.info("multi-model endpoint: models load on first use (cache %d bytes)", self.cache.budget_bytes)
        else:
            log.info("loading models from %s (model control mode %s)", self.sources.description,
                     self.settings.model_control_mode)
        await self.manager.load_all(self._models_at_start())
        if self.torchserving is not None:
            await self.torchserving.register_at_start()
        for entry in self.manager.index():
            if entry.state == "READY":
                log.info("model %s version %s: READY", entry.name, entry.version)
            else:
                log.warning("model %s version %s: %s (%s)", entry.name, entry.version or "-", entry.state, entry.reason)
        for front_end in self.front_ends:
            await front_end.start()
        if self.poller is not None:
            self.poller.start()
        if self.settings.embedding_poll_seconds > 0:
            self.table_watcher.start()
        model_list = self.sources.model_list
        if self.model_config_poller is not None and model_list is not None:
            apply = (self.poller or RepositoryPoller(self.manager, model_list, 1.0)).poll
            self.model_config_poller.start(model_list, apply)
        self.dataplane.mark_started()
        grpc = f", gRPC on {self.settings.host}:{self.settings.grpc_port}" if self.grpc else ""
        http = f"HTTP on {self.settings.host}:{self.settings.http_port}" if self._serves_http() else "no HTTP"
        log.info("ready: %s%s", http, grpc)

    def _models_at_start(self) -> list[str] | None:
        """None (every model of the repository), or in explicit mode the --load-model names; a multi-model
        endpoint's models load on first use, so only those names."""
        names = self.settings.load_models
        if self.settings.multi_model and self.settings.model_control_mode != "explicit":
            return []
        if self.settings.model_control_mode != "explicit" or "*" in names:
            return None
        return list(names)

    async def _stop(self) -> None:
        if self._loading is not None and not self._loading.done():
            self._loading.cancel()
        if self.poller is not None:
            await self.poller.stop()
        await asyncio.to_thread(self.table_watcher.stop)
        if self.model_config_poller is not None:
            await self.model_config_poller.stop()
        for server in self.grpc_servers:  # (stopping since the signal, unless startup failed before it)
            await server.stop(self.settings.graceful_shutdown_seconds)
        for front_end in reversed(self.front_ends):
            await front_end.stop()
        log.info("stopping: draining and unloading models")
        if self.cache is not None:
            await self.cache.stop()
        await self.manager.stop()
        await self.dataplane.tracer.close()  # the answered requests' traces, written or exported
        self.dataplane.shared_memory.close()
        if self.worker_statistics is not None:
            await self.worker_statistics.stop()
        await asyncio.to_thread(shutil.rmtree, self.work_dir, True)
        log.info("stopped")

    def run(self) -> None:
        s = self.settings
        self.log_settings.install()  # on the handlers the command line configured
        log.info(
            "modelhost %s: HTTP %s:%d, gRPC %s, SageMaker %s, metrics %s",
            __version__, s.host, s.http_port, f"{s.host}:{s.grpc_port}" if s.grpc_port else "off",
            f"{s.host}:{s.sagemaker_port}" if s.sagemaker_port else "off",
            f"{s.host}:{s.metrics_port}" if s.metrics_port else "off",
        )
        handshake = s.tls_handshake_timeout_seconds
        # TF Serving's --rest_api_port 0: no REST port (the app still runs its lifespan: it starts the server).
        http_port = s.http_port if self._serves_http() else None
        listeners = [Listener("HTTP", self.build_asgi(), http_port, self.in_flight, tls=self._tls_for("http"),
                              tls_handshake_seconds=handshake)]
        for front_end in self.front_ends:
            in_flight = self.in_flight if front_end.counts_in_flight else InFlight()
            listeners.append(Listener(front_end.name, front_end.app, front_end.port, in_flight, front_end.shared,
                              self._tls_for(front_end.name.lower()), handshake, front_end.host))
        self._http = HttpServer(listeners, s.host, http_limits(s), s.graceful_shutdown_seconds,
                                reuse_port=s.workers > 1, on_stop=self._stop_grpc)
        uvloop.run(self._serve(self._http))

    def _serves_http(self) -> bool:
        """Whether the HTTP port listens: always, but for `modelhost tfserving --rest_api_port 0` and `modelhost
        torchserve`, whose clients use the ports of the server they know."""
        return (self.tfserving_setup is None and self.torchserve_setup is None) or bool(self.settings.http_port)

    async def _serve(self, http: HttpServer) -> None:
        if self.tls is not None:  # without TLS, SIGHUP keeps its default (it stops the server)
            asyncio.get_running_loop().add_signal_handler(signal.SIGHUP, self._reload_tls)
        if self.settings.workers == 1:
            # Bound before any model loads, so that a busy port stops the server at once, as HTTP's does;
            # calls wait until _start starts it. (Workers share the port and bind it after loading.)
            try:
                for server in self.grpc_servers:
                    server.bind()
            except ListenError as exc:
                raise SystemExit(f"modelhost: {exc}") from None
        await http.serve()


def http_limits(s: ServerSettings) -> HttpLimits:
    """The HTTP transport's limits, from the settings' "HTTP edge limits" block."""
    return HttpLimits(
        max_body_bytes=s.http_max_body_bytes, max_buffered_bytes=s.http_max_buffered_bytes,
        max_connections=s.http_max_connections, max_head_bytes=s.http_max_head_bytes,
        max_headers=s.http_max_headers, max_url_bytes=s.http_max_url_bytes, max_pipeline=s.http_max_pipeline,
        max_pipeline_bytes=s.http_max_pipeline_bytes, idle_timeout=s.http_idle_timeout_seconds,
        head_timeout=s.http_head_timeout_seconds, body_timeout=s.http_body_timeout_seconds,
        min_body_rate=s.http_min_body_rate, send_timeout=s.http_send_timeout_seconds,
    )
