"""Loads and unloads for the whole server under --workers N (--model-control-mode explicit).

Each worker holds every model. A client's load or unload reaches one worker, which makes it as a single server
would (its answer, errors included, is the client's), then has every other worker make the same change over
their sockets (worker_statistics.py) and waits for them before it answers: a load with the same config and files
reloads the model there, an unload unloads it. A worker that could not apply it is logged; the client's change
stands on the worker that made it. Each change carries when it was made (the host's clock, the worker's index):
of two changes to one model made on two workers at once, every worker ends with the later.
"""

from __future__ import annotations

import base64
import logging
import time

import orjson

from modelhost.core.control import Control, ControlChange
from modelhost.core.load_request import LoadRequest
from modelhost.core.worker_statistics import WorkerStatistics
from modelhost.errors import ModelhostError

log = logging.getLogger("modelhost.workers")


class WorkerControl:
    def __init__(self, control: Control, peers: WorkerStatistics, index: int) -> None:
        self._control = control
        self._peers = peers
        self._index = index
        self._latest: dict[str, tuple[int, int]] = {}  # model -> when the change it has now was made, and where

    async def announced(self, change: ControlChange) -> None:
        """This worker made `change` for a client: every other worker makes it too before the client is answered."""
        stamp = self._latest[change.name] = (time.time_ns(), self._index)
        try:
            failures = await self._peers.tell(encode(change, stamp))
        except ModelhostError as exc:
            log.error("not every worker made the %s of model %s: %s", change.action, change.name, exc.message)
            return
        for failure in failures:
            if failure:
                log.error("a worker could not make the %s of model %s: %s", change.action, change.name, failure)

    async def adopt(self, data: bytes) -> str:
        """Another worker's change, made here; what went wrong, or ""."""
        try:
            change, stamp = decode(data)
            if stamp <= self._latest.get(change.name, (0, 0)):
                return ""  # this worker made a later change to the model itself
            self._latest[change.name] = stamp
            if change.request is None:
                await self._control.unload(change.name, change.unload_dependents, announce=False)
            else:
                await self._control.load(change.name, change.request, announce=False)
        except ModelhostError as exc:
            return exc.message
        except (ValueError, KeyError, TypeError) as exc:
            return f"a change that does not decode ({type(exc).__name__})"
        return ""


def encode(change: ControlChange, stamp: tuple[int, int]) -> bytes:
    request = change.request
    return orjson.dumps({
        "name": change.name, "unload_dependents": change.unload_dependents, "stamp": list(stamp),
        "request": None if request is None else {
            "config": request.config,
            "files": {key: base64.b64encode(content).decode() for key, content in request.files.items()}},
    })


def decode(data: bytes) -> tuple[ControlChange, tuple[int, int]]:
    document = orjson.loads(data)
    request = document["request"]
    change = ControlChange(document["name"], None if request is None else LoadRequest(
        request["config"], {key: base64.b64decode(content) for key, content in request["files"].items()}),
        bool(document["unload_dependents"]))
    when, where = document["stamp"]
    return change, (int(when), int(where))
