"""What a call can fail with, and whether trying it again is safe."""

from __future__ import annotations


class ClientError(Exception):
    """A call that failed: the server's answer (`status` is the HTTP status, or the gRPC code's name such as
    "UNAVAILABLE"; `message` is the server's own message) or a transport failure (`status` 0).

    `sent` is False when the server cannot have run the request: it was never delivered, or the server
    refused it before running it (HTTP 503/429, or gRPC UNAVAILABLE with Retry-After). `retry_after` is the
    server's Retry-After, in seconds.
    """

    def __init__(self, status: int | str, message: str, *, sent: bool = True, retry_after: float | None = None,
                 transient: bool = False) -> None:
        super().__init__(f"[{status}] {message}" if status else message)
        self.status = status
        self.message = message
        self.sent = sent
        self.retry_after = retry_after
        # Worth trying again at all (overload, a refused or reset connection), if also safe.
        self.transient = transient

    def retryable(self, idempotent: bool) -> bool:
        """Whether another attempt may succeed without running the request twice (unless it is idempotent)."""
        return self.transient and (not self.sent or idempotent)


class DeadlineExceeded(ClientError):
    """The call's deadline passed before its answer came; the server was told (timeout parameter, gRPC
    deadline, or its connection closed) so that it drops the request if it has not run it."""

    def __init__(self, message: str) -> None:
        super().__init__("DEADLINE_EXCEEDED", message)


RETRY_STATUSES = frozenset({429, 503})


def http_error(status: int, message: str, retry_after: float | None) -> ClientError:
    """The error of an HTTP answer: 503 and 429 are refusals of requests the server did not run."""
    refused = status in RETRY_STATUSES
    return ClientError(status, message, sent=not refused, retry_after=retry_after, transient=refused)


def retry_after_seconds(value: str | bytes | None) -> float | None:
    """Retry-After as seconds (its delta-seconds form; an HTTP date is not honoured: None)."""
    if value is None:
        return None
    try:
        seconds = float(value)
    except ValueError:
        return None
    return seconds if seconds >= 0 else None
