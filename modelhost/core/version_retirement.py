"""Retiring a model version: no request is routed to it from then on, the requests holding it and its queue finish
on it, and then its scheduler stops (the manager's reloads, unloads and evictions; runs on the event loop).

A version a reload swapped out keeps its open sequences until each ends or idles out (`finish_sequences`); until
then `hold_sequence` finds it for their requests.
"""

from __future__ import annotations

import asyncio

from modelhost.core.lifecycle import ModelState
from modelhost.core.model_record import ModelRecord
from modelhost.core.served_model import ServedModel


class VersionRetirement:
    """The manager's versions on their way out: the tasks draining them, and those whose sequences go on."""

    def __init__(self) -> None:
        self._retiring: set[asyncio.Task[None]] = set()
        # Reloaded-away versions whose sequences go on (hold_sequence); a list: a ServedModel does not hash.
        self._finishing: list[ServedModel] = []

    def retire(self, record: ModelRecord, version: int, reason: str, keep: bool = False,
               finish_sequences: bool = False) -> asyncio.Task[None] | None:
        """Stop routing to a version; its queued requests finish on it, then it unloads. `keep`: its status stays
        in the record (UNAVAILABLE, `reason`). `finish_sequences` (a reload: another version takes the new
        requests): its open sequences go on on it until they end or idle out (`hold_sequence`)."""
        status = record.versions[version] if keep else record.versions.pop(version)
        served, status.served = status.served, None
        status.state, status.reason = ModelState.UNAVAILABLE, reason
        return self.retire_served(served, finish_sequences) if served is not None else None

    def retire_served(self, served: ServedModel, finish_sequences: bool = False) -> asyncio.Task[None]:
        """Retire a version no record routes to any more (a reload swapped it out): the task that drains it."""
        task = asyncio.get_running_loop().create_task(self._stop_when_released(served, finish_sequences))
        self._retiring.add(task)
        task.add_done_callback(self._retiring.discard)
        return task

    async def _stop_when_released(self, served: ServedModel, finish_sequences: bool) -> None:
        """Requests holding the version finish on it (ModelManager.acquire), and, after a reload, its open
        sequences (each ends or idles out); then its queue closes and drains."""
        if finish_sequences and served.sequences is not None:
            self._finishing.append(served)
            try:
                await served.sequences.finished()
            finally:
                self._finishing = [other for other in self._finishing if other is not served]
        await served.pins.released()
        await served.scheduler.stop()

    def hold_sequence(self, name: str, sequence_id: int | str) -> ServedModel | None:
        """A reloaded-away version of the model on which this sequence is open, pinned as `hold` pins; None when
        there is none (the rare path: a sequence request the serving version does not know)."""
        for served in self._finishing:
            if served.name == name and served.sequences is not None and served.sequences.is_open(sequence_id):
                served.pins.hold()
                return served
        return None

    def close_sequences(self) -> None:
        """End the open sequences of every reloaded-away version (the server stops: they do not hold it up)."""
        for served in self._finishing:
            assert served.sequences is not None
            served.sequences.close_all()

    def under_way(self) -> list[asyncio.Task[None]]:
        """The tasks draining retired versions now."""
        return list(self._retiring)
