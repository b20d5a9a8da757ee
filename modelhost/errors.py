"""One error vocabulary for the whole server; each protocol maps ErrorKind to its own codes."""

from __future__ import annotations

import enum


class ErrorKind(enum.Enum):
    INVALID_INPUT = "invalid_input"
    NOT_FOUND = "not_found"
    UNAVAILABLE = "unavailable"
    OVERLOADED = "overloaded"
    TIMEOUT = "timeout"
    UNSUPPORTED = "unsupported"
    ALREADY_EXISTS = "already_exists"
    # Not enough memory for a model even after evicting every idle one (SageMaker answers 507).
    NO_MEMORY = "no_memory"
    INTERNAL = "internal"


class ModelhostError(Exception):
    """An error with a kind the protocols translate and a message meant for the client."""

    def __init__(self, kind: ErrorKind, message: str, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message
        # Seconds after which a retry may succeed (an overloaded queue); protocols that can, say so.
        self.retry_after = retry_after

    def __repr__(self) -> str:
        return f"ModelhostError({self.kind.name}, {self.message!r})"


def invalid(message: str) -> ModelhostError:
    return ModelhostError(ErrorKind.INVALID_INPUT, message)


def not_found(message: str) -> ModelhostError:
    return ModelhostError(ErrorKind.NOT_FOUND, message)


def unavailable(message: str) -> ModelhostError:
    return ModelhostError(ErrorKind.UNAVAILABLE, message)
