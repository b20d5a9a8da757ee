"""The sequence batcher (`sequence_batching`): requests that belong together, run in order, with state.

A sequence model's every request names its sequence (core/sequence_controls.py). The batcher keeps a table of
open sequences and a fixed number of slots: `max(1, max_batch_size)` per instance under the `direct`
strategy, `oldest.max_candidate_sequences` per instance (when set) under `oldest`. A sequence takes a slot at
its first request and keeps it until its END request or until it has been idle `max_sequence_idle_microseconds`
(Triton's default, 1 s, when unset); a sequence that starts while every slot is taken waits, with its
requests, in the backlog until one frees, oldest first. Open sequences (slotted and waiting) are bounded by
the slots plus the config parameter `max_sequence_backlog` (default 1,000); past that a new sequence is
refused as OVERLOADED.

Within a sequence, requests run one at a time in the order they arrived (a FIFO lock), so a batch holds at most
one request of any sequence; across sequences, requests batch in the model's queue as any others (the
strategy's max_queue_delay_microseconds and, for `oldest`, preferred_batch_size: core/policy.py). The control
tensors and the implicit state (core/sequence_state.py) are added to each request's inputs before it queues.
Each slot belongs to one instance, and with several instances a sequence's requests queue for its slot's
instance alone (`Scheduler.submit(instance=...)`), so a model that keeps its own per-sequence state in the
instance sees every request of the sequence; new sequences take the lowest free slot (row), the instances
taking turns at each row, as Triton does. Under `direct`, a request is its slot's row of the batch
(core/sequence_slots.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import math
from collections import deque
from collections.abc import Awaitable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import numpy as np

from modelhost.config.model_config_pb2 import ModelConfig
from modelhost.config.parameters import natural_parameter, string_parameters
from modelhost.config.pbtxt import ConfigError
from modelhost.core.clock import MONOTONIC, Cancellable, Clock
from modelhost.core.sequence_controls import ControlTensors, SequenceFlags
from modelhost.core.sequence_slots import SlotPadding
from modelhost.core.sequence_state import ImplicitState, State
from modelhost.errors import ErrorKind, ModelhostError, invalid

Outputs = dict[str, np.ndarray]


class Submit(Protocol):
    """Runs one request's feeds for the named outputs on the model (its scheduler's submit), on `instance`
    alone when it is >= 0, at batch row `row` when it is >= 0 (a direct slot)."""

    def __call__(self, inputs: dict[str, np.ndarray], outputs: list[str], *, instance: int,
                 row: int) -> Awaitable[Outputs]:
        ...


BACKLOG_PARAMETER = "max_sequence_backlog"
DEFAULT_BACKLOG = 1000
DEFAULT_IDLE_S = 1.0  # Triton's max_sequence_idle_microseconds when the config leaves it 0


@dataclass(eq=False)
class _Sequence:
    id: int | str
    last: float  # when its last request finished (or it opened), on the batcher's clock
    corrid: dict[str, np.ndarray]  # its CORRID control input (ControlTensors.corrid)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)  # FIFO: its requests run one at a time, in order
    users: int = 0  # requests running or waiting for the lock: a sequence in use is never idle
    slot: int = -1  # its slot (instance = slot // slots per instance); -1 while it has none
    state: State | None = None  # None: the initial state
    live: bool = True  # in the table; False once it ended or idled out


class SequenceBatcher:
    def __init__(self, name: str, label: str, config: ModelConfig, instances: int, clock: Clock = MONOTONIC,
                 model_dir: Path | None = None) -> None:
        batching = config.sequence_batching
        if batching.iterative_sequence:
            raise ConfigError("sequence_batching iterative_sequence is not supported")
        self._name = name
        self._label = label
        self._clock = clock
        self._batching = config.max_batch_size > 0
        self.controls = ControlTensors(config)
        self.state = ImplicitState(config, model_dir)
        per_instance = max(1, config.max_batch_size)
        if batching.HasField("oldest") and batching.oldest.max_candidate_sequences > 0:
            per_instance = batching.oldest.max_candidate_sequences
        self.slots = per_instance * max(1, instances)
        self._per_instance = per_instance
        # Direct (a model that batches): a sequence's request is its slot's row of its instance's batch
        # (core/sequence_slots.py), so it always queues for that instance, never runs on the loop.
        self.padding = (SlotPadding(self.controls.not_ready)
                        if self._batching and not batching.HasField("oldest") else None)
        self._pinned = instances > 1 or self.padding is not None  # a sequence's requests go to its slot's instance
        self.backlog = natural_parameter(string_parameters(config), (BACKLOG_PARAMETER,), DEFAULT_BACKLOG)
        self.idle_s = batching.max_sequence_idle_microseconds / 1e6 or DEFAULT_IDLE_S
        # Free slots, lowest row first, the instances taking turns at each row (Triton's order): consecutive
        # sequences start on different instances, and a direct model's batches stay as short as they can.
        self._free = [(s, i * per_instance + s) for s in range(per_instance) for i in range(max(1, instances))]
        heapq.heapify(self._free)
        self._slot_waiters: deque[asyncio.Future[int]] = deque()
        self._table: dict[int | str, _Sequence] = {}
        self._sweep_timer: Cancellable | None = None
        self._emptied: asyncio.Event | None = None  # what `finished` awaits
        self.idled_out = 0  # sequences released for being idle, for tests and logs

    def open_sequences(self) -> int:
        return len(self._table)

    def free_slots(self) -> int:
        return len(self._free)

    def is_open(self, sequence_id: int | str) -> bool:
        return sequence_id in self._table

    async def finished(self) -> None:
        """Returns once no sequence is open: each ended or idled out (a reloaded version's, before it stops)."""
        while self._table:
            if self._emptied is None or self._emptied.is_set():
                self._emptied = asyncio.Event()
            await self._emptied.wait()

    def close_all(self) -> None:
        """Forget every open sequence (the server is stopping): `finished` returns; requests already running
        finish, later ones of those sequences are refused."""
        for sequence in list(self._table.values()):
            self._close(sequence)

    async def run(self, flags: SequenceFlags | None, feeds: dict[str, np.ndarray], names: list[str], rows: int,
                  submit: Submit) -> Outputs:
        """Run one request of a sequence: after the sequence's earlier requests, with its control inputs and
        state. INVALID_INPUT for a request without an id, of more than one row, or for a sequence that was
        not started; OVERLOADED when no more sequences may open."""
        if flags is None or flags.id == 0 or flags.id == "":
            raise invalid(f"inference request to model '{self._name}' must specify a non-zero or non-empty "
                          "correlation ID")
        if self._batching and rows != 1:
            raise invalid(f"inference request to model '{self._name}' must specify batch-size 1 due to "
                          "requirements of sequence batcher")
        sequence = self._table.get(flags.id)
        if sequence is None:
            if not flags.start:
                raise self._not_started(flags)
            sequence = self._open(flags.id)
        sequence.users += 1
        try:
            async with sequence.lock:
                return await self._step(sequence, flags, feeds, names, submit)
        finally:
            sequence.users -= 1
            sequence.last = self._clock.now()
            if sequence.live and self._table.get(sequence.id) is sequence:  # the table stays in order of `last`
                self._table[sequence.id] = self._table.pop(sequence.id)

    async def _step(self, sequence: _Sequence, flags: SequenceFlags, feeds: dict[str, np.ndarray],
                    names: list[str], submit: Submit) -> Outputs:
        if not sequence.live:  # it ended, or idled out, while this request waited behind another of it
            if not flags.start or self._table.get(flags.id, sequence) is not sequence:
                raise self._not_started(flags)
            sequence.live = True
            self._insert(sequence)
        try:
            if flags.start:
                sequence.state = None  # a second START: the sequence so far ends early, a new one begins
            if sequence.slot < 0:
                sequence.slot = await self._take_slot()
            instance, row = divmod(sequence.slot, self._per_instance) if self._pinned else (-1, -1)
            if self.padding is None:
                row = -1
            self.controls.fill(feeds, flags, sequence.corrid)
            if not self.state.tensors:
                return await submit(feeds, names, instance=instance, row=row)
            feeds.update(sequence.state if sequence.state is not None else self.state.initial())
            kept = [name for name in self.state.output_names if name not in names]
            results = await submit(feeds, [*names, *kept], instance=instance, row=row)
            sequence.state = self.state.take(self._label, results, names)
            return results
        finally:
            if flags.end:
                self._close(sequence)

    def _not_started(self, flags: SequenceFlags) -> ModelhostError:
        return invalid(f"inference request for sequence {flags.id} to model '{self._name}' must specify the START "
                       "flag on the first request of the sequence")

    def _open(self, sequence_id: int | str) -> _Sequence:
        if len(self._table) >= self.slots + self.backlog:
            raise ModelhostError(
                ErrorKind.OVERLOADED,
                f"model {self._label}: {len(self._table)} sequences are open, all its {self.slots} slots and "
                f"{self.backlog} backlog places ({BACKLOG_PARAMETER}); retry later",
            )
        sequence = _Sequence(sequence_id, self._clock.now(), self.controls.corrid(sequence_id))
        self._insert(sequence)
        return sequence

    def _insert(self, sequence: _Sequence) -> None:
        self._table[sequence.id] = sequence
        if self._sweep_timer is None:  # the sweep runs while any sequence is open
            self._sweep_timer = self._clock.call_later(self.idle_s, self._sweep)

    def _close(self, sequence: _Sequence) -> None:
        """Forget the sequence: out of the table, state dropped, slot to the oldest waiting sequence."""
        if sequence.live:
            sequence.live = False
            if self._table.get(sequence.id) is sequence:
                del self._table[sequence.id]
                if not self._table and self._emptied is not None:
                    self._emptied.set()
        sequence.state = None
        if sequence.slot >= 0:
            self._give_slot(sequence.slot)
            sequence.slot = -1

    def _sweep(self) -> None:
        """Release the sequences idle for idle_s; come back when the next one could be. The table is in order of
        `last` (each request's end moves its sequence to the end), so the sweep stops at the first sequence that is
        not due, passing over only those in use: a churn of abandoned sequences costs each its own release, not a
        pass over every open one."""
        self._sweep_timer = None
        now = self._clock.now()
        soonest = math.inf
        due = []
        for sequence in self._table.values():
            if sequence.users:
                continue
            left = sequence.last + self.idle_s - now
            if left > 0:
                soonest = left
                break
            due.append(sequence)
        for sequence in due:
            self._close(sequence)
            self.idled_out += 1
        if self._table:
            self._sweep_timer = self._clock.call_later(self.idle_s if soonest == math.inf else soonest, self._sweep)

    async def _take_slot(self) -> int:
        if self._free and not self._slot_waiters:
            return heapq.heappop(self._free)[1]
        waiter: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._slot_waiters.append(waiter)
        try:
            return await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                self._give_slot(waiter.result())  # handed a slot just as its request went away: pass it on
            else:
                with contextlib.suppress(ValueError):  # already passed over by _give_slot
                    self._slot_waiters.remove(waiter)
            raise

    def _give_slot(self, slot: int) -> None:
        while self._slot_waiters:
            waiter = self._slot_waiters.popleft()
            if not waiter.done():
                waiter.set_result(slot)
                return
        heapq.heappush(self._free, (slot % self._per_instance, slot))
