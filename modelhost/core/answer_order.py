"""When a model's queued requests get their answers: as each is ready, or under `preserve_ordering` in the
order they arrived (an answer ready early waits for every earlier one's).

Thread contract: the event loop alone calls `finish`.
"""

from __future__ import annotations

import asyncio

from modelhost.core.batch_run import Outputs
from modelhost.core.request_queue import Pending

Answer = tuple[asyncio.Future[Outputs], Outputs | None, BaseException | None]


class AnswerOrder:
    def __init__(self, preserve_ordering: bool) -> None:
        """`preserve_ordering`: answer in the order of `Pending.sequence`, which the scheduler numbers from 0 as
        requests arrive (each number finished once, withdrawn requests included)."""
        self._preserve_ordering = preserve_ordering
        self._next_to_settle = 0
        self._finished: dict[int, Answer] = {}

    def finish(self, pending: Pending, result: Outputs | None, error: BaseException | None) -> None:
        """`pending` is done: its answer is `result`, or `error` (neither: withdrawn, its place given up)."""
        if not self._preserve_ordering:
            _resolve(pending.future, result, error)
            return
        self._finished[pending.sequence] = (pending.future, result, error)
        while self._next_to_settle in self._finished:
            _resolve(*self._finished.pop(self._next_to_settle))
            self._next_to_settle += 1


def _resolve(future: asyncio.Future[Outputs], result: Outputs | None, error: BaseException | None) -> None:
    if future.done():
        return
    if error is not None:
        future.set_exception(error)
    elif isinstance(result, Exception):  # one request's own error, from a model that takes requests one by one
        future.set_exception(result)
    else:
        future.set_result(result)  # type: ignore[arg-type]
