"""Repository control: the index now; load and unload arrive with the model control modes."""

from __future__ import annotations

from modelhost.core.manager import IndexEntry, ModelManager
from modelhost.errors import ErrorKind, ModelhostError


class Control:
    def __init__(self, manager: ModelManager) -> None:
        self._manager = manager

    def index(self, ready_only: bool = False) -> list[IndexEntry]:
        return self._manager.index(ready_only)

    async def load(self, name: str) -> None:
        raise ModelhostError(
            ErrorKind.UNSUPPORTED,
            f"cannot load model '{name}': model control mode is 'none' (every model loads at start)",
        )

    async def unload(self, name: str) -> None:
        raise ModelhostError(
            ErrorKind.UNSUPPORTED,
            f"cannot unload model '{name}': model control mode is 'none' (every model loads at start)",
        )
