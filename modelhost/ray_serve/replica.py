"""One replica of modelhost's Ray Serve application: modelhost's server core in this process (manager,
schedulers, backends, the byte-budgeted model cache), its HTTP protocols run on the requests the ingress
forwards, and the models a request names loaded on first use."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

from modelhost.app import Server
from modelhost.core.lifecycle import ModelState
from modelhost.core.model_record import IndexEntry
from modelhost.errors import ModelhostError
from modelhost.protocols import prometheus
from modelhost.protocols.http.app import HttpApp
from modelhost.protocols.http.exchange import ASGIApp
from modelhost.protocols.http.server import Lifespan
from modelhost.ray_serve import forwarded
from modelhost.ray_serve.affinity_router import FREE_BYTES
from modelhost.ray_serve.control_ledger import ControlLedger, LedgerEntry
from modelhost.ray_serve.forwarded import ForwardedRequest, ForwardedResponse
from modelhost.ray_serve.grpc_forwarding import GrpcAnswer, ReplicaRpcs
from modelhost.ray_serve.held_models import HeldModels
from modelhost.ray_serve.peers import ReplicaPeers
from modelhost.settings import ServerSettings

log = logging.getLogger("modelhost.ray")

START_TIMEOUT_S = 300.0
# SageMaker's routes (/ping, /invocations, the Runtime API's /endpoints/..., the multi-model /models), which its own
# front-end answers.
SAGEMAKER_PATHS = ("/ping", "/invocations", "/endpoints/", "/models", "/execution-parameters")
HELD_STATES = (ModelState.READY.value, ModelState.LOADING.value)


class ModelhostReplica:
    """`client_control`: clients may load and unload models (`--model-control-mode explicit`)."""

    async def __init__(self, settings: ServerSettings,  # type: ignore[misc]  # Ray Serve awaits it
                       client_control: bool = False) -> None:
        from ray import serve

        context = serve.get_replica_context()
        self.replica_id = context.replica_id.unique_id
        peers = ReplicaPeers(context.app_name, context.deployment, self.replica_id)
        self.server = Server(settings, peers=peers)
        self._app = self.server.build_asgi()
        self._sagemaker: ASGIApp | None = (self.server.front_end("SageMaker").app if settings.sagemaker_port
                                           else None)
        self._metrics = HttpApp(prometheus.routes(self.server.metrics, peers), access=self.server.http_access)
        self._loads: dict[str, asyncio.Task[None]] = {}
        self._found = 0  # requests naming a model that was ready here when they came
        self._missed = 0  # and those that waited for it to load
        self._rpcs = ReplicaRpcs(self.server)
        self._ledger = ControlLedger(self.replica_id, self.server.control, peers, self._holds)
        self.server.control.on_change(self._ledger.announced)
        if not client_control:
            self.server.control.refuse_changes("none", "models load when a request first names them")
        self.server.control.merge_index_with(peers)
        self._lifespan = Lifespan(self._app)
        await self._lifespan.startup()
        await self._until_started()
        self._held = HeldModels(self._held_models)
        self._held.start()
        self._ledger.start()

    # `sequence` (unused here): the sequence a request continues, read by the router (request_sequence.py).
    async def __call__(self, request: ForwardedRequest, model: str | None, sequence: str = "") -> ForwardedResponse:
        if model is not None:
            await self._load(model)
        in_flight = self.server.in_flight  # counted as the HTTP transport counts: the schedulers tell a lone request
        in_flight.arrived()
        try:
            return await forwarded.answer(self._app_for(request.path), request)
        finally:
            in_flight.requests -= 1

    async def stream(self, request: ForwardedRequest, model: str | None) -> AsyncIterator[ForwardedResponse | bytes]:
        if model is not None:
            await self._load(model)
        in_flight = self.server.in_flight
        in_flight.arrived()
        try:
            async for part in forwarded.stream(self._app_for(request.path), request):
                yield part
        finally:
            in_flight.requests -= 1

    async def grpc_call(self, method: str, data: bytes, metadata: list[tuple[str, str]],
                        model: str | None, sequence: str = "") -> GrpcAnswer:
        if model is not None:
            await self._load(model)
        return await self._rpcs.answer(method, data, metadata)

    async def local_statistics(self, name: str, version: str) -> tuple[str, list[dict[str, Any]]]:
        """This replica's statistics (for a peer summing them): none for a model it does not hold."""
        try:
            return self.replica_id, self.server.dataplane.local_statistics(name, version)
        except ModelhostError:
            return self.replica_id, []

    async def local_metrics(self) -> tuple[str, str]:
        return self.replica_id, (await self.server.metrics.scrape()).decode()

    async def local_index(self, ready_only: bool) -> tuple[str, list[IndexEntry]]:
        return self.replica_id, await self.server.control.local_index(ready_only)

    async def adopt_control(self, entry: LedgerEntry) -> tuple[str, str]:
        """A peer's load or unload for a client (control_ledger.py); what went wrong here, or ""."""
        return self.replica_id, await self._ledger.adopt(entry)

    async def control_entries(self) -> tuple[str, list[LedgerEntry]]:
        return self.replica_id, self._ledger.entries()

    def record_routing_stats(self) -> dict[str, Any]:
        """What Ray Serve passes to the routers every ROUTING_STATS_PERIOD_S: the bytes this replica's model cache
        has free, by which a cold model goes to the emptier of its two first-ranked replicas."""
        cache = self.server.cache
        return {FREE_BYTES: max(cache.budget_bytes - cache.used_bytes, 0) if cache is not None else 0}

    async def describe(self) -> dict[str, Any]:
        """This replica, for operators and tests: its id, its Ray actor's name, the models it holds, the bytes
        its model cache charges for them, and how many requests found their model here or waited for a load."""
        import ray

        cache = self.server.cache
        return {"replica": self.replica_id, "actor": ray.get_runtime_context().get_actor_name(),
                "models": sorted(self._held_models()), "cache_bytes": cache.used_bytes if cache else 0,
                "cache_budget_bytes": cache.budget_bytes if cache else 0, "found": self._found,
                "missed": self._missed}

    async def __del__(self) -> None:
        """Ray Serve's graceful shutdown: called once the requests this replica accepted are answered."""
        await self._ledger.stop()
        await self._held.stop()
        await self._lifespan.shutdown()

    def _app_for(self, path: str) -> ASGIApp:
        if path == "/metrics":
            return self._metrics
        if self._sagemaker is not None and path.startswith(SAGEMAKER_PATHS):
            return self._sagemaker
        return self._app

    async def _load(self, name: str) -> None:
        """Load `name` unless it is ready here, or a client unloaded it; concurrent requests for it wait for the same
        load. A model that fails to load, does not exist or was unloaded is left to the protocol to answer for in
        its own words."""
        if self._is_ready(name):
            self._found += 1
            return
        await self._ledger.joined()
        if self._ledger.refuses(name):
            return
        self._missed += 1
        load = self._loads.get(name)
        if load is None:
            load = self._loads[name] = asyncio.create_task(self._load_once(name))
            self._held.changed()
        await asyncio.shield(load)

    async def _load_once(self, name: str) -> None:
        try:
            started = time.monotonic()
            await self.server.manager.load(name, self._ledger.override(name))
            log.info("model %s loaded on first use in %.2f s", name, time.monotonic() - started)
        except ModelhostError as exc:
            log.info("model %s not loaded: %s", name, exc.message)
        finally:
            del self._loads[name]

    def _is_ready(self, name: str) -> bool:
        try:
            return any(entry.state == ModelState.READY.value for entry in self.server.manager.index_of(name))
        except ModelhostError:
            return False

    def _holds(self, name: str) -> bool:
        return name in self._loads or name in self._held_models()

    def _held_models(self) -> set[str]:
        held = {entry.name for entry in self.server.manager.index() if entry.state in HELD_STATES}
        return held | set(self._loads)

    async def _until_started(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while not self.server.dataplane.ready():
            if time.monotonic() > deadline:
                raise RuntimeError(f"modelhost did not start within {START_TIMEOUT_S:g} s")
            await asyncio.sleep(0.01)

