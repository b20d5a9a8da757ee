"""An isolated Triton Python model's side of a batch, in its worker process (stub.py): the batch's requests one
by one, and a decoupled model's responses sent to the server as they come.

Each streamed request's responses go over the channel as ("partial", index, (response, final)), from whichever
thread the model sends them; the batch's reply follows once every streamed request's final response is sent,
so that no response of a batch arrives after its reply (the instance is busy until then: a decoupled model that
sends after execute returns keeps its worker until its last response, within execute_timeout_seconds). A
request's cancellation is not seen in the worker: is_cancelled() is False there.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

from modelhost.backends.python.channel import Channel
from modelhost.errors import ModelhostError

Outputs = dict[str, np.ndarray]


def portable(item: Outputs | ModelhostError | None) -> Any:
    """A response, or an error, as it pickles: an error as (ErrorKind value, message)."""
    return (item.kind.value, item.message) if isinstance(item, ModelhostError) else item


class _Stream:
    """One streamed request's responses, sent to the server (`PartialAnswers`'s part the model uses)."""

    cancelled = False

    def __init__(self, channel: Channel, lock: threading.Lock, index: int) -> None:
        self._channel = channel
        self._lock = lock
        self._index = index
        self.done = threading.Event()

    def put(self, answer: tuple[Outputs | ModelhostError | None, bool], size: int, last: bool = False) -> None:
        item, final = answer
        with self._lock:
            self._channel.send(("partial", self._index, (portable(item), final)))
        if last:
            self.done.set()


def execute_requests(model: Any, channel: Channel, inputs: list[Outputs], outputs: list[str],
                     streams: list[bool]) -> tuple[Any, ...]:
    """Run a "requests" message on a TritonUserModel: ("ok", each request's outputs or portable error)."""
    lock = threading.Lock()
    senders = [_Stream(channel, lock, index) if streamed else None for index, streamed in enumerate(streams)]
    try:
        results = model.execute_requests(list(zip(inputs, senders, strict=True)), outputs)
    except ModelhostError as exc:
        return "error", exc.kind.value, exc.message, getattr(exc, "details", "")
    for sender, result in zip(senders, results, strict=True):
        if sender is not None and not isinstance(result, ModelhostError):
            sender.done.wait()
    return "ok", [portable(result) for result in results]
