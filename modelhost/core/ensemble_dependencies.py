"""Which models each ensemble composes, as its last load planned them, and the cycles among them: an ensemble that
needs itself, through others or not, is refused before its loads wait on each other's locks for ever."""

from __future__ import annotations

from collections.abc import Iterable


class EnsembleDependencies:
    def __init__(self) -> None:
        self._composing: dict[str, set[str]] = {}  # ensemble -> its composing models, as last planned

    def planned(self, ensemble: str, composing: Iterable[str]) -> None:
        """`ensemble`'s load needs the models `composing`. Recorded before the load's first await, so that of two
        ensembles that need each other (loading at once, each holding its own lock), the second to get here sees
        the cycle instead of deadlocking."""
        self._composing[ensemble] = set(composing)

    def forget(self, name: str) -> None:
        """`name` is being loaded again: what it needed, if it was an ensemble, is planned anew."""
        self._composing.pop(name, None)

    def cycle(self, start: str) -> list[str]:
        """A path from `start` back to itself through ensembles' composing models, or []."""
        stack: list[tuple[str, list[str]]] = [(start, [start])]
        seen: set[str] = set()
        while stack:
            name, path = stack.pop()
            for dependency in self._composing.get(name, ()):
                if dependency == start:
                    return [*path, start]
                if dependency not in seen:
                    seen.add(dependency)
                    stack.append((dependency, [*path, dependency]))
        return []
