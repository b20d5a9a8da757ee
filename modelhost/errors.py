"""One error vocabulary for the whole server; each protocol maps ErrorKind to its own codes."""

from __future__ import annotations

import enum
import os
import re
import reprlib


class ErrorKind(enum.Enum):
    INVALID_INPUT = "invalid_input"
    TOO_LARGE = "too_large"  # a request over a size limit of the server's (HTTP 413)
    NOT_FOUND = "not_found"
    UNAVAILABLE = "unavailable"
    OVERLOADED = "overloaded"
    TIMEOUT = "timeout"
    UNSUPPORTED = "unsupported"
    # The request is well formed but the model cannot run it this way (TF Serving's FAILED_PRECONDITION: no
    # signature of that name for a gRPC Predict); HTTP 400, as TF Serving's REST answers it.
    PRECONDITION = "precondition"
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


def too_large(message: str) -> ModelhostError:
    return ModelhostError(ErrorKind.TOO_LARGE, message)


def not_found(message: str) -> ModelhostError:
    return ModelhostError(ErrorKind.NOT_FOUND, message)


def unavailable(message: str) -> ModelhostError:
    return ModelhostError(ErrorKind.UNAVAILABLE, message)


# --------------------------------------------------------------------------- client-visible messages

# An absolute path of two or more components, not part of a URL or a word ("s3://b/k", "text/csv" stay).
_ABSOLUTE_PATH = re.compile(r"(?<![\w.~:/\\-])/(?:[^\s'\"`,;:()\[\]{}<>/]+/)+[^\s'\"`,;:()\[\]{}<>/]*")
_private_roots: list[str] = []


def hide_paths_under(*roots: str | os.PathLike[str]) -> None:
    """Directories whose paths messages show relative to them (the model repository, the work directory).
    Called by the composition root at start; process-wide, as the directories are."""
    for root in roots:
        for form in {os.path.abspath(root), os.path.realpath(root)}:
            if form not in _private_roots and form != "/":
                _private_roots.append(form)
    _private_roots.sort(key=len, reverse=True)


def public_message(text: str) -> str:
    """`text` without server file paths, for a client: paths under a registered root become relative to it,
    other absolute paths their last component. Protocols apply it to every error message they send."""
    if "/" not in text:
        return text
    for root in _private_roots:
        text = text.replace(root + "/", "").replace(root, ".")
    return _ABSOLUTE_PATH.sub(_last_component, text)


def _last_component(match: re.Match[str]) -> str:
    return match.group(0).rstrip("/").rsplit("/", 1)[-1]


# A client's value in a message: bounded in depth and length, so a value nested a thousand lists deep (which
# repr() cannot print) or a megabyte long makes a short message, not an internal error.
_CLIENT_REPR = reprlib.Repr()
_CLIENT_REPR.maxlevel = 3
_CLIENT_REPR.maxstring = 60
_CLIENT_REPR.maxother = 60


def client_value(value: object) -> str:
    """repr(value), shortened for an error message (deep lists end in '...', long strings are cut)."""
    return _CLIENT_REPR.repr(value)
