"""What app.py asks of a front-end that has a port of its own: its app, and its part in starting and stopping."""

from __future__ import annotations

from modelhost.protocols.http.exchange import ASGIApp


class FrontEnd:
    """One protocol's port. `start` runs once the models to load at start are loaded; `stop` before they unload."""

    name: str  # for the logs, and as --tls-off names its port
    port: int
    app: ASGIApp
    shared: bool = True  # with --workers, every process listens on its port (SO_REUSEPORT)
    counts_in_flight: bool = True  # its requests count in InFlight, which tells the schedulers a lone request
    host: str | None = None  # where it listens; None: the server's --host

    async def start(self) -> None:
        return None

    async def stop(self) -> None:
        return None
