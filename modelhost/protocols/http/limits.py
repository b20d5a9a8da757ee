"""HttpLimits: every byte, connection and second a client can make the HTTP transport spend.

Built once from ServerSettings (app.py) and passed to HttpServer; the connection reads it. The flag
that sets each field is named in the error a client gets when it hits that limit.
"""

from __future__ import annotations

from dataclasses import dataclass

KIB, MIB, GIB = 1024, 1024**2, 1024**3


@dataclass(frozen=True, slots=True)
class HttpLimits:
    """Limits of one server process (all its HTTP sites together where a limit is process-wide).

    What one connection can hold: a request head (max_head_bytes), the body being received (it grows
    as bytes arrive, up to max_body_bytes), and requests waiting behind the one being answered (reading
    stops at max_pipeline of them or max_pipeline_bytes). Bodies and unfinished heads are charged to
    max_buffered_bytes across the process; a connection that cannot get budget stops being read until
    another request's bytes are released (TCP flow control holds the client back), its deadlines still
    running. A connection beyond max_connections gets 503 + Retry-After to its first request.
    """

    max_body_bytes: int = 64 * MIB  # --http-max-body-bytes
    max_buffered_bytes: int = GIB  # --http-max-buffered-bytes
    max_connections: int = 10_000  # --http-max-connections
    max_head_bytes: int = 64 * KIB  # --http-max-head-bytes
    max_headers: int = 100  # --http-max-headers
    max_url_bytes: int = 8 * KIB  # --http-max-url-bytes
    max_pipeline: int = 16  # --http-max-pipeline
    max_pipeline_bytes: int = MIB  # --http-max-pipeline-bytes
    idle_timeout: float = 75.0  # --http-idle-timeout-seconds
    head_timeout: float = 30.0  # --http-head-timeout-seconds
    body_timeout: float = 30.0  # --http-body-timeout-seconds
    min_body_rate: int = 1024  # --http-min-body-rate (bytes/s)
    send_timeout: float = 60.0  # --http-send-timeout-seconds

    @property
    def min_body_bytes_per_window(self) -> int:
        """What a body must gain in each body_timeout window (at least one byte)."""
        return max(1, int(self.min_body_rate * self.body_timeout))
