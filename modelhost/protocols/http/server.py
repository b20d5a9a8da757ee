"""HTTP/1.1 server for the ASGI app: listening, signals, lifespan and graceful shutdown.

Why not uvicorn: for a 2 MB tensor body uvicorn's flow control (pause at 64 KB, one ASGI
message per chunk, a bytes copy per chunk, then our join) cost 1.9 ms per request on
loopback where the socket itself needs 0.4 ms (benchmarks/http_stack). Connections
(protocols/http/connection.py) read a Content-Length body straight into one buffer instead.

Scope: HTTP/1.1 and 1.0, keep-alive, pipelining (answered in order), Content-Length and
chunked request bodies, `Expect: 100-continue`, write back-pressure, the limits and deadlines
of HttpLimits (protocols/http/limits.py), and graceful shutdown (stop listening, finish in-flight
requests, close idle connections, then the ASGI lifespan shutdown).
"""

from __future__ import annotations

import asyncio
import logging
import signal
import ssl
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from modelhost.core.in_flight import InFlight
from modelhost.protocols.http.connection import HttpConnection
from modelhost.protocols.http.exchange import ASGIApp
from modelhost.protocols.http.limits import HttpLimits
from modelhost.protocols.http.memory import BufferBudget, MemoryReturner

log = logging.getLogger("modelhost.http")
_READ_SIZE = 256 * 1024
_MEMORY_WATCH_SECONDS = 1.0


@dataclass(frozen=True, slots=True)
class Listener:
    """One ASGI app served on one port; `name` is for the logs."""

    name: str
    app: ASGIApp
    port: int | None  # None: the app runs (its lifespan too) but no port serves it
    in_flight: InFlight = field(default_factory=InFlight)  # counts this listener's requests in progress
    shared: bool = True  # with --workers, every process listens on this port (SO_REUSEPORT)
    tls: ssl.SSLContext | None = None  # None: plain HTTP; shared by listeners, reloaded in place (protocols/tls.py)
    tls_handshake_seconds: float = 10.0  # a client gets this long for its TLS handshake
    host: str | None = None  # None: the server's host


class HttpServer:
    """Serves ASGI apps on their ports of one host until SIGTERM/SIGINT (or `stop()`)."""

    def __init__(self, listeners: Sequence[Listener], host: str, limits: HttpLimits, graceful_seconds: float,
                 reuse_port: bool = False, on_stop: Callable[[], object] | None = None) -> None:
        self.listeners = list(listeners)
        # Called on the loop when stopping begins (a signal or stop()): other servers stop accepting too.
        self._on_stop = on_stop
        self.reuse_port = reuse_port  # several processes share the HTTP port (--workers)
        self.host = host
        self.limits = limits
        self.graceful_seconds = graceful_seconds
        self.connections: set[HttpConnection] = set()
        # One read buffer for every connection: callbacks run one at a time and the parser copies what it
        # keeps, so a connection costs a few KiB, not a buffer (protocols/http/connection.py).
        self.read_buffer = bytearray(_READ_SIZE)
        self._memory = MemoryReturner()
        self.budget = BufferBudget(limits.max_buffered_bytes)
        self._stopping = asyncio.Event()
        self._memory_watch: asyncio.TimerHandle | None = None

    def connection_opened(self, connection: HttpConnection) -> None:
        self.connections.add(connection)
        self._observe()

    def connection_closed(self, connection: HttpConnection) -> None:
        self.connections.discard(connection)
        self._observe()

    def _observe(self) -> None:
        self._memory.observe(len(self.connections), self.budget.used)

    def _watch_memory(self) -> None:
        """Once a second: the budget's peak since the last look, then what it holds now (bursts of bytes are
        seen here rather than at every release, which is on every request's path)."""
        budget = self.budget
        self._memory.observe(len(self.connections), budget.peak)
        self._observe()
        budget.peak = budget.used
        self._memory_watch = asyncio.get_running_loop().call_later(_MEMORY_WATCH_SECONDS, self._watch_memory)

    def stop(self) -> None:
        if not self._stopping.is_set() and self._on_stop is not None:
            self._on_stop()
        self._stopping.set()

    async def serve(self) -> None:
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, self.stop)
        lifespans = [Lifespan(listener.app) for listener in self.listeners]
        for lifespan in lifespans:
            await lifespan.startup()
        servers = []
        try:
            for listener in self.listeners:
                if listener.port is None:
                    continue
                reuse = self.reuse_port and listener.shared
                protocol = partial(HttpConnection, self, listener.app, listener.in_flight)
                handshake = listener.tls_handshake_seconds if listener.tls is not None else None
                host = listener.host or self.host
                servers.append(await loop.create_server(protocol, host, listener.port, backlog=2048,
                                                        reuse_port=reuse, ssl=listener.tls,
                                                        ssl_handshake_timeout=handshake))
                log.info("%s listening on %s:%d%s", listener.name, host, listener.port,
                         " (TLS)" if listener.tls else "")
        except OSError as exc:
            for server in servers:
                server.close()
            for lifespan in reversed(lifespans):
                await lifespan.shutdown()
            raise SystemExit(f"modelhost: cannot listen on {listener.host or self.host}:{listener.port}: "
                             f"{exc.strerror or exc}") from None
        self._watch_memory()
        await self._stopping.wait()
        if self._memory_watch is not None:
            self._memory_watch.cancel()
        log.info("shutting down: no new connections, finishing %d open", len(self.connections))
        for server in servers:
            server.close()
        for connection in list(self.connections):
            connection.close_when_idle()
        deadline = loop.time() + self.graceful_seconds
        while self.connections and loop.time() < deadline:
            await asyncio.sleep(0.01)
        for connection in list(self.connections):
            connection.abort()
        for lifespan in reversed(lifespans):
            await lifespan.shutdown()

class Lifespan:
    """Runs the ASGI lifespan protocol around serving; an app without it is fine."""

    def __init__(self, app: ASGIApp) -> None:
        self._app = app
        self._inbox: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self._outbox: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self._task: asyncio.Task[None] | None = None

    async def startup(self) -> None:
        self._task = asyncio.create_task(self._run())
        await self._inbox.put({"type": "lifespan.startup"})
        reply = await self._outbox.get()
        if reply["type"] == "lifespan.startup.failed":
            raise RuntimeError(f"application startup failed: {reply.get('message', '')}")

    async def shutdown(self) -> None:
        if self._task is None or self._task.done():
            return
        await self._inbox.put({"type": "lifespan.shutdown"})
        await self._outbox.get()

    async def _run(self) -> None:
        scope = {"type": "lifespan", "asgi": {"version": "3.0", "spec_version": "2.0"}, "state": {}}
        try:
            await self._app(scope, self._inbox.get, self._outbox.put)
        except Exception:
            log.debug("application does not support the lifespan protocol", exc_info=True)
            await self._outbox.put({"type": "lifespan.startup.complete"})
