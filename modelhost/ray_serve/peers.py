"""A Ray Serve replica's peers for statistics and metrics: every replica of its deployment, asked through Ray
Serve's broadcast, so that the statistics extension and /metrics answer for the whole application."""

from __future__ import annotations

import asyncio
from typing import Any

from modelhost.core.model_record import IndexEntry
from modelhost.core.worker_statistics import Statistics
from modelhost.errors import ModelhostError, unavailable

ANSWER_TIMEOUT_S = 5.0
CHANGE_TIMEOUT_S = 300.0  # a peer applying a load reloads the model: as long as a load may take


class ReplicaPeers:
    """`own`: this replica's id, whose answer the asking replica has already."""

    def __init__(self, app_name: str, deployment: str, own: str) -> None:
        self._app_name = app_name
        self._deployment = deployment
        self._own = own
        self._handle: Any = None

    async def gather(self, name: str, version: str) -> list[Statistics]:
        return await self._others("local_statistics", name, version)

    async def gather_metrics(self) -> list[str]:
        return await self._others("local_metrics")

    async def gather_index(self, ready_only: bool) -> list[list[IndexEntry]]:
        return await self._others("local_index", ready_only, purpose="the application's index")

    async def ask_every(self, method: str) -> list[Any]:
        """Every other live replica's answer to `method` (UNAVAILABLE as the statistics' are)."""
        return await self._others(method, purpose="the application's loads and unloads")

    async def tell(self, method: str, *args: Any) -> list[str]:
        """Have every other live replica run `method`, each answering what went wrong there or ""; the failures."""
        answers = await self._others(method, *args, timeout=CHANGE_TIMEOUT_S, purpose="a load or unload")
        return [answer for answer in answers if answer]

    async def _others(self, method: str, *args: Any, timeout: float = ANSWER_TIMEOUT_S,
                      purpose: str = "the application's statistics") -> list[Any]:
        """Every other live replica's answer; UNAVAILABLE when a live one fails to answer (a sum that left it out
        would go backwards between two reads). A replica that died is left out: its counters died with it."""
        from ray import serve
        from ray.exceptions import RayActorError

        if self._handle is None:
            self._handle = serve.get_deployment_handle(self._deployment, self._app_name)
        try:
            answers = await asyncio.wait_for(
                self._handle.broadcast(method, *args).results_async(return_exceptions=True), timeout)
        except Exception as exc:
            raise _unanswered(exc, purpose) from None
        failed = [a for a in answers if isinstance(a, Exception) and not isinstance(a, RayActorError)]
        if failed:
            raise _unanswered(failed[0], purpose)
        return [answer for replica, answer in (a for a in answers if not isinstance(a, Exception))
                if replica != self._own]


def _unanswered(exc: Exception, purpose: str) -> ModelhostError:
    return unavailable(f"a replica did not answer for {purpose} ({type(exc).__name__}); retry")
