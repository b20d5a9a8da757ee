"""Fake backend models for scheduler unit tests: they echo, wait on a gate, or fail, and record what they saw."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from modelhost.backends.base import Model
from modelhost.core.clock import Clock

GATE_TIMEOUT = 5.0  # a held instance never blocks a failing test longer than this


class Echo(Model):
    """OUTPUTn = INPUTn * 1 for every requested OUTPUTn; records each batch (its inputs, rows, outputs asked for
    and thread)."""

    def __init__(self) -> None:
        self.batches: list[dict[str, np.ndarray]] = []  # the inputs of every call, in call order
        self.asked: list[list[str]] = []  # the outputs each call asked for
        self.threads: list[str] = []
        self.started = 0  # calls entered
        self.finished = 0  # calls returned or raised
        self.unloaded_after = -1  # calls finished when unload() ran; -1 until it does
        self._lock = threading.Lock()

    @property
    def sizes(self) -> list[int]:
        """Rows of every batch, in call order."""
        return [len(next(iter(b.values()))) for b in self.batches]

    def infer(self, inputs: dict[str, np.ndarray], outputs: Sequence[str]) -> dict[str, np.ndarray]:
        with self._lock:
            self.batches.append({k: v.copy() for k, v in inputs.items()})
            self.asked.append(list(outputs))
            self.threads.append(threading.current_thread().name)
            self.started += 1
        try:
            self.work()
            return {name: inputs[name.replace("OUTPUT", "INPUT")] * 1 for name in outputs}
        finally:
            with self._lock:
                self.finished += 1

    def work(self) -> None:
        """Subclasses wait or fail here."""

    def unload(self) -> None:
        self.unloaded_after = self.finished


class Slow(Echo):
    """An Echo that sleeps `seconds` per call, and first waits for `gate` (when given) to be set."""

    def __init__(self, seconds: float = 0.0, gate: threading.Event | None = None) -> None:
        super().__init__()
        self.seconds = seconds
        self.gate = gate

    def open(self) -> None:
        """Let held and future calls through."""
        if self.gate is not None:
            self.gate.set()

    def work(self) -> None:
        if self.gate is not None and not self.gate.wait(GATE_TIMEOUT):
            raise TimeoutError("the test never opened the gate")
        if self.seconds:
            time.sleep(self.seconds)


class Failing(Slow):
    """A Slow model whose every call raises RuntimeError("boom") once its gate (if any) opens."""

    def work(self) -> None:
        super().work()
        raise RuntimeError("boom")


class ManualClock(Clock):
    """A scheduler clock the test moves with `advance`: queue delays and timeouts end exactly when it says.

    Instance threads waiting on the queue look at it every millisecond of real time (a short real wait), so
    what `advance` makes due happens within a few milliseconds; timers run inside `advance`, on the loop.
    It counts whole nanoseconds from 0, so a delay of N microseconds ends at exactly the float the scheduler
    computes for it (N / 1e6), with no rounding left over to wait for.
    """

    def __init__(self) -> None:
        self._ns = 0
        self._timers: list[_Timer] = []

    def now(self) -> float:
        return self._ns / 1e9

    def wait(self, condition: threading.Condition, timeout: float) -> None:
        condition.wait(0.001)

    def call_later(self, delay: float, callback: Callable[..., Any], *args: Any) -> _Timer:
        timer = _Timer(self.now() + delay, callback, args)
        self._timers.append(timer)
        return timer

    def advance(self, seconds: float) -> None:
        """Move the clock on, running the timers that fall due in order (call it on the event loop)."""
        target = self._ns + round(seconds * 1e9)
        while due := sorted((t for t in self._timers if t.when <= target / 1e9 and not t.cancelled),
                            key=lambda t: t.when):
            timer = due[0]
            self._timers.remove(timer)
            self._ns = max(self._ns, round(timer.when * 1e9))
            timer.callback(*timer.args)
        self._ns = target


@dataclass
class _Timer:
    when: float
    callback: Callable[..., Any]
    args: tuple[Any, ...]
    cancelled: bool = False

    def cancel(self) -> None:
        self.cancelled = True
