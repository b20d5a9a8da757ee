"""gRPC server (grpc.aio, on the process's one event loop): binding, message size and keepalive options, start
and graceful stop. Protocol modules hand in `Service`s (grpc_service.py); grpc_handlers.py runs each call.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass

import grpc

from modelhost.access import AccessPolicy
from modelhost.core.in_flight import InFlight
from modelhost.protocols.grpc_handlers import generic_handler
from modelhost.protocols.grpc_service import Service

log = logging.getLogger("modelhost.grpc")

_INT32_MAX = 2**31 - 1
# Clients may ping an idle connection this often (gRPC's server default, 5 minutes, answers a client
# that keeps alive every 10 s with GOAWAY "too_many_pings").
MIN_CLIENT_PING_INTERVAL_MS = 5000


class ListenError(Exception):
    """The gRPC port cannot be bound; the message says which and why."""


@dataclass(frozen=True, slots=True)
class GrpcOptions:
    max_message_bytes: int  # received and sent
    keepalive_time_seconds: float
    keepalive_timeout_seconds: float
    reuse_port: bool = False  # several processes share the port (--workers)


def server_options(options: GrpcOptions) -> list[tuple[str, int]]:
    """grpc channel arguments for the server."""
    return [
        ("grpc.max_receive_message_length", options.max_message_bytes),
        ("grpc.max_send_message_length", options.max_message_bytes),
        ("grpc.keepalive_time_ms", _milliseconds(options.keepalive_time_seconds)),
        ("grpc.keepalive_timeout_ms", _milliseconds(options.keepalive_timeout_seconds)),
        ("grpc.keepalive_permit_without_calls", 1),  # idle connections are pinged too: dead peers get closed
        ("grpc.http2.max_pings_without_data", 0),  # no cap on the server's own keepalive pings
        ("grpc.http2.min_ping_interval_without_data_ms", MIN_CLIENT_PING_INTERVAL_MS),
        # gRPC sets SO_REUSEPORT by default: then a second server would share a busy port silently.
        ("grpc.so_reuseport", 1 if options.reuse_port else 0),
    ]


class GrpcServer:
    """Serves `services` on host:port: `bind()`, `start()`, `stop(grace)`, all on one event loop."""

    def __init__(self, services: Sequence[Service], host: str, port: int, options: GrpcOptions,
                 in_flight: InFlight, access: AccessPolicy | None = None,
                 credentials: grpc.ServerCredentials | None = None) -> None:
        self.services = list(services)
        self.access = access or AccessPolicy()
        self.credentials = credentials  # TLS (tls.py); None: plaintext
        self.address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        self.options = options
        self.in_flight = in_flight
        self._server: grpc.aio.Server | None = None
        self._stopping: asyncio.Future[None] | None = None

    def bind(self) -> None:
        """Create the server and bind its port (connections then wait until `start()`); ListenError if busy."""
        server = grpc.aio.server(options=server_options(self.options))
        limit = self.options.max_message_bytes
        server.add_generic_rpc_handlers([generic_handler(service, self.in_flight, limit, self.access)
                                         for service in self.services])
        try:
            if self.credentials is None:
                server.add_insecure_port(self.address)
            else:
                server.add_secure_port(self.address, self.credentials)
        except RuntimeError:
            raise ListenError(f"cannot listen on {self.address} for gRPC: "
                              "the port is in use or the address is not this machine's") from None
        self._server = server

    async def start(self) -> None:
        """Accept calls (binding first if `bind()` was not called)."""
        if self._server is None:
            self.bind()
        assert self._server is not None
        await self._server.start()
        log.info("gRPC listening on %s", self.address)

    def stop(self, grace: float) -> asyncio.Future[None]:
        """Stop accepting RPCs; those in flight get `grace` seconds, then are cancelled. Idempotent:
        every call returns the one stop in progress, to await."""
        if self._stopping is None:
            self._stopping = asyncio.ensure_future(self._stop(grace))
        return self._stopping

    async def _stop(self, grace: float) -> None:
        if self._server is not None:
            log.info("gRPC: no new calls, finishing those in flight (up to %gs)", grace)
            await self._server.stop(grace)


def _milliseconds(seconds: float) -> int:
    return max(1, min(_INT32_MAX, math.ceil(seconds * 1000)))
