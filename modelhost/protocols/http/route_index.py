"""An app's routes looked up by the first segment of a request's path: only the routes that could match it are
tried, in their order, so a request to the last of forty routes does not pay forty regular expressions (about
0.3 µs each).

A route whose pattern begins with a literal segment (`/v2/...`, `(?i)/v1/...`) is tried only for paths whose first
segment is that one, compared without case (a necessary condition whether or not the pattern ignores case); a
route whose first segment is not literal is tried for every path."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Generic, TypeVar

Entry = TypeVar("Entry")

_LITERAL_FIRST = re.compile(r"(?:\(\?i\))?/([A-Za-z0-9_\-]+)(?=/|$)")  # no regex syntax in the segment


class RouteIndex(Generic[Entry]):
    def __init__(self, entries: Sequence[Entry], patterns: Sequence[str]) -> None:
        firsts = [_first_segment(pattern) for pattern in patterns]
        self._everywhere = [entry for entry, first in zip(entries, firsts, strict=True) if first is None]
        self._by_first = {first: [entry for entry, other in zip(entries, firsts, strict=True) if other in (first, None)]
                          for first in {first for first in firsts if first is not None}}

    def of(self, path: str) -> list[Entry]:
        """The routes that could match `path`, in the order given."""
        end = path.find("/", 1)
        first = path[1:end] if end > 0 else path[1:]
        routes = self._by_first.get(first)
        return routes if routes is not None else self._by_first.get(first.lower(), self._everywhere)


def _first_segment(pattern: str) -> str | None:
    """The pattern's first path segment when it is literal text (lowercased), else None (also for a pattern with an
    alternative outside every group, which may match paths that begin otherwise)."""
    match = _LITERAL_FIRST.match(pattern)
    return match.group(1).lower() if match is not None and not _top_level_alternative(pattern) else None


def _top_level_alternative(pattern: str) -> bool:
    depth, escaped = 0, False
    for char in pattern:
        if escaped:
            escaped = False
        elif char == "\\":
            escaped = True
        elif char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
        elif char == "|" and depth == 0:  # (or inside a character class: then tried everywhere, which is safe)
            return True
    return False
