"""Telling Ray Serve which models this replica holds, so that its router sends each model's requests here.

Ray's own `@serve.multiplexed` decides what a replica holds by a count of models and reports it to the
controller; here modelhost's byte-budgeted cache decides, and this reports the same way: the ids of the models
loaded or loading, pushed to the controller whenever they change (checked every 0.1 s, Ray's own period).
The controller passes them to every router, which prefers a replica holding a request's model id.

The one place modelhost uses Ray Serve internals (`_get_global_client`, `RequestRoutingInfo`): the report
`@serve.multiplexed` makes, without its count-based cache. Checked by tests/ray against the pinned Ray.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

log = logging.getLogger("modelhost.ray")

PUSH_INTERVAL_S = 0.1


class HeldModels:
    def __init__(self, held: Callable[[], set[str]]) -> None:
        self._held = held
        self._reported: set[str] | None = None
        self._changed = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    def changed(self) -> None:
        """A load began: report it now rather than at the next check, so that the model's next requests come
        here instead of starting a load elsewhere."""
        self._changed.set()

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _run(self) -> None:
        while True:
            held = self._held()
            if held != self._reported:
                try:
                    _report(held)
                    self._reported = held
                except Exception as exc:  # the controller may be restarting: the next check tries again
                    log.warning("could not report this replica's models to Ray Serve: %s", exc)
            self._changed.clear()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._changed.wait(), PUSH_INTERVAL_S)


def _report(held: set[str]) -> None:
    from ray import serve
    from ray.serve._private.common import RequestRoutingInfo
    from ray.serve.context import _get_global_client

    replica_id = serve.get_replica_context().replica_id
    client = _get_global_client()
    if client is None:
        raise RuntimeError("no connection to the Serve controller")
    client.record_request_routing_info(
        RequestRoutingInfo(replica_id=replica_id, multiplexed_model_ids=sorted(held)))
