"""The queue between a model's requests and its instance threads: priority levels and batch forming.

Thread contract: the event loop puts, withdraws and expires requests; instance threads block in
`take()`. One Condition guards everything, and every critical section is short.
"""

from __future__ import annotations

import asyncio
import collections
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from modelhost.core.clock import MONOTONIC, Clock
from modelhost.core.latency_target import BatchLimits
from modelhost.core.policy import SchedulingPolicy
from modelhost.errors import ErrorKind, ModelhostError

if TYPE_CHECKING:
    from modelhost.core.trace import Trace


@dataclass(slots=True, eq=False)
class Pending:
    """One queued request (or one chunk of a split request)."""

    inputs: dict[str, np.ndarray]
    outputs: Sequence[str]
    rows: int  # its share of a batch: the batch dim, or 1 for models without one
    key: Any  # requests batch together only when their keys are equal
    level: int
    future: asyncio.Future[Any]
    entry: str = ""  # the model's signature it runs ("" Model.infer; batched only with its own, by `key`)
    enqueued: float = 0.0  # the queue's clock when it was put
    sequence: int = 0
    taken: bool = False
    delayed: bool = False
    measures_handoff: bool = False  # queued alone with an instance free (core/loop_gate.py)
    spent: float = 0.0  # seconds the server had the request before it was queued (a latency target counts them)
    trace: Trace | None = None  # the request's, when it is traced: the instance thread stamps its compute
    instance: int = -1  # the one instance that may run it (a sequence's, core/sequences.py); -1: any
    row: int = -1  # its row of the batch (a direct sequence's slot in its instance, core/sequence_slots.py)
    responses: Any = None  # where a decoupled model's responses to it go (core/partial_answers.py), if it streams
    origin: Any = None  # the client's request (types.InferRequest: id, parameters), where the front-end gave it


class RequestQueue:
    def __init__(self, policy: SchedulingPolicy, clock: Clock = MONOTONIC, limits: BatchLimits | None = None) -> None:
        """`limits`: the batch size and queue delay batches form with, when something other than the policy sets
        them (a latency target); the policy's otherwise."""
        self._policy = policy
        self._clock = clock
        self.limits = limits or BatchLimits(policy.max_batch_size, policy.max_queue_delay_s)
        self.rows = 0  # rows of the requests waiting
        self._cond = threading.Condition()
        self._levels: list[collections.deque[Pending]] = [collections.deque() for _ in policy.levels]
        self._delayed: list[collections.deque[Pending]] = [collections.deque() for _ in policy.levels]
        self._closed = False
        self._pinned = 0  # queued requests that one instance alone may run
        # Rows of a queued request -> how many are queued: a batch being formed stops looking further down the queue
        # once its room is less than the fewest rows of any request queued.
        self._sizes: dict[int, int] = {}

    def put(self, pending: Pending, model: str) -> None:
        level_policy = self._policy.levels[pending.level]
        with self._cond:
            if self._closed:
                raise ModelhostError(ErrorKind.UNAVAILABLE, f"model {model} is stopping")
            queue = self._levels[pending.level]
            waiting = len(queue) + len(self._delayed[pending.level])
            if level_policy.max_queue_size and waiting >= level_policy.max_queue_size:
                raise self._full(pending.level, model)
            pending.enqueued = self._clock.now()
            queue.append(pending)
            self.rows += pending.rows
            sizes = self._sizes
            sizes[pending.rows] = sizes.get(pending.rows, 0) + 1
            if pending.instance < 0:
                self._cond.notify()
            else:  # only its instance's thread may take it: wake them all rather than maybe another
                self._pinned += 1
                self._cond.notify_all()

    def check_room(self, level: int, model: str) -> None:
        """OVERLOADED if `level`'s queue is full now, as `put` would find it. Lock-free (the lengths are read
        under the GIL), so advisory: a request it lets through may still be refused by `put`."""
        size = self._policy.levels[level].max_queue_size
        if size and len(self._levels[level]) + len(self._delayed[level]) >= size:
            raise self._full(level, model)

    def _full(self, level: int, model: str) -> ModelhostError:
        return ModelhostError(
            ErrorKind.OVERLOADED,
            f"model {model}: the queue of priority level {level + 1} is full "
            f"(max_queue_size {self._policy.levels[level].max_queue_size}); retry later",
            retry_after=1,
        )

    def withdraw(self, pending: Pending) -> bool:
        """Remove a request that no instance has taken yet; False if one already has."""
        with self._cond:
            if pending.taken:
                return False
            self._remove(pending)
            return True

    def delay(self, pending: Pending) -> None:
        """timeout_action DELAY: move an expired request behind every request still in time."""
        with self._cond:
            if pending.taken or pending.delayed:
                return
            self._levels[pending.level].remove(pending)
            pending.delayed = True
            self._delayed[pending.level].append(pending)

    @property
    def closed(self) -> bool:
        return self._closed

    def depth(self) -> int:
        return sum(map(len, self._levels)) + sum(map(len, self._delayed))

    def close(self) -> None:
        """Instance threads finish what is queued, then `take` returns None."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def take(self, instance: int = -1) -> list[Pending] | None:
        """Block until a batch is due; None once closed and empty (of what `instance` may run). Called by
        instance threads, each with its index: requests pinned to another instance are not its to take."""
        with self._cond:
            while True:
                head = self._head(instance)
                if head is None:
                    if self._closed:
                        return None
                    self._cond.wait()
                    continue
                delay = self.limits.max_queue_delay_s
                wait = head.enqueued + delay - self._clock.now()
                batch, complete = self._form(head, instance, expired=delay > 0 and wait <= 0)
                if complete or wait <= 0 or self._closed:
                    for pending in batch:
                        self._remove(pending)
                    return batch
                self._clock.wait(self._cond, wait)

    def _head(self, instance: int) -> Pending | None:
        if self._pinned:
            return next((p for p in self._ordered() if p.instance in (-1, instance)), None)
        for queue, delayed in zip(self._levels, self._delayed):
            if queue:
                return queue[0]
            if delayed:
                return delayed[0]
        return None

    def _ordered(self) -> Any:
        for queue, delayed in zip(self._levels, self._delayed):
            yield from queue
            yield from delayed

    def _form(self, head: Pending, instance: int, expired: bool = False) -> tuple[list[Pending], bool]:
        """The batch to run now, and whether to run it now rather than wait out the queue delay (`expired`: the
        head has waited it out).

        As Triton's dynamic batcher: a batch with preferred sizes holds no more rows than the largest (unless its
        delay has expired: then up to max_batch_size) and is cut at the largest it reaches; it runs now when full,
        at a preferred size, or once a queued request cannot join it: another batch key (inputs of other shapes or
        types, another signature) or too many rows for the room left. Waiting could not help the batch past such a
        request, and the request would wait behind it. Unlike Triton's, the batch still takes the requests further
        down that can join it (a batch that is a prefix of the queue runs interleaved shapes one at a time)."""
        policy = self._policy
        if not policy.batching:
            return [head], True
        preferred = () if expired else policy.preferred_batch_sizes
        room = min(self.limits.max_batch_size, preferred[0]) if preferred else self.limits.max_batch_size
        room = max(room, head.rows)  # a request of more rows than the room still runs (alone)
        batch: list[Pending] = []
        sizes: list[int] = []
        rows = 0
        pinned = self._pinned
        fewest = None
        blocked = False
        for pending in self._ordered():
            if pending.key != head.key or rows + pending.rows > room:
                if pinned and pending.instance not in (-1, instance):
                    continue
                blocked = True
                if fewest is None:
                    fewest = min(self._sizes)
                if room - rows < fewest:  # no request left in the queue fits the room
                    break
                continue
            if pinned and pending.instance not in (-1, instance):
                continue
            batch.append(pending)
            rows += pending.rows
            sizes.append(rows)
            if rows == room:
                break
        for size in preferred:  # descending
            if size in sizes:
                return batch[: sizes.index(size) + 1], True
        return batch, blocked or rows == room

    def _remove(self, pending: Pending) -> None:
        queue = (self._delayed if pending.delayed else self._levels)[pending.level]
        queue.remove(pending)
        pending.taken = True
        self.rows -= pending.rows
        sizes = self._sizes
        left = sizes[pending.rows] - 1
        if left:
            sizes[pending.rows] = left
        else:
            del sizes[pending.rows]
        if pending.instance >= 0:
            self._pinned -= 1
