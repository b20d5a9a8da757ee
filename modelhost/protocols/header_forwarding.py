"""Triton's `--http-header-forward-pattern` / `--grpc-header-forward-pattern`: request headers whose names match
the operator's regular expression become string parameters of the inference request (a Triton Python model's
`request.parameters()`).

As Triton: the pattern matches anywhere in the name (a partial match), case-insensitively unless it starts with
`(?-i)` (names are matched as they arrive: lower-cased by this server's HTTP parser, as gRPC metadata is);
a matching header named like a parameter the server reads (`priority`, `sequence_id`, ...) or starting
`triton_` is refused with Triton's words. Python's `re` stands in for RE2: the patterns Triton's docs show are read
the same.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from modelhost.core.request_parameters import CONSUMED, RESERVED_PREFIX
from modelhost.errors import invalid

_CASE_SENSITIVE = "(?-i)"


class HeaderForwarding:
    """`pattern` None or empty: no header is forwarded."""

    def __init__(self, pattern: str | None) -> None:
        self.pattern = pattern or ""
        self._regex: re.Pattern[str] | None = None
        if self.pattern.startswith(_CASE_SENSITIVE):
            self._regex = re.compile(self.pattern[len(_CASE_SENSITIVE):])
        elif self.pattern:
            self._regex = re.compile(self.pattern, re.IGNORECASE)

    @property
    def active(self) -> bool:
        return self._regex is not None

    def parameters(self, headers: Iterable[tuple[str, str]]) -> dict[str, str]:
        """The headers to forward, by name; INVALID_INPUT for one the server keeps to itself."""
        regex = self._regex
        if regex is None:
            return {}
        forwarded = {}
        for name, value in headers:
            if regex.search(name):
                if name in CONSUMED or name.startswith(RESERVED_PREFIX):
                    raise invalid(f"Header '{name}' is reserved for Triton usage and cannot be forwarded.")
                forwarded[name] = value
        return forwarded


def check_pattern(flag: str, pattern: str | None) -> None:
    """ValueError naming `flag` when `pattern` is not a regular expression."""
    try:
        HeaderForwarding(pattern)
    except re.error as exc:
        raise ValueError(f"{flag} {pattern!r} is not a regular expression: {exc}") from None
