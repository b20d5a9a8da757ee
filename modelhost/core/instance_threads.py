"""The threads model instances run on, kept for the next instance once theirs has unloaded.

Each instance has a thread of its own while it is loaded (core/batch_threads.py). A multi-model endpoint loads
and unloads models many times a second, and creating an OS thread, handing it its first job and ending it
costs each load 0.3-0.5 ms of CPU on the 2-core VM (a Python thread started and joined, 50 in a row,
user plus system time). So a thread whose instance has unloaded waits up to IDLE_SECONDS for the next
instance to start, and at most MAX_IDLE threads wait; a waiting thread holds no model, only its stack.
A thread is handed only to an instance of the compute priority it runs at (core/compute_threads.py): one
the execution watch lowered (`adaptive`) ends instead, as a new instance starts at the loop's priority.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from modelhost.core import compute_threads

IDLE_SECONDS = 30.0
MAX_IDLE = 32

Work = Callable[[], None]


class _Idle:
    __slots__ = ("priority", "work", "given", "thread")

    def __init__(self, priority: compute_threads.Effective) -> None:
        self.priority = priority
        self.thread = threading.get_native_id()
        self.work: tuple[Work, str] | None = None
        self.given = threading.Lock()  # released once `work` is set
        self.given.acquire()


_idle: list[_Idle] = []  # most recently idle last
_lock = threading.Lock()


def start(work: Work, name: str) -> None:
    """Run `work` on a thread of its own named `name`: a waiting one when one runs at the current compute
    priority, else a new daemon thread. `work` must call compute_threads.enter() first, as on any new thread."""
    priority = compute_threads.current_priority()
    with _lock:
        index = next((i for i in range(len(_idle) - 1, -1, -1) if _idle[i].priority == priority), None)
        idle = _idle.pop(index) if index is not None else None
    if idle is None:
        idle = _Idle(priority)
        idle.work = (work, name)
        # The slot, not the work, is the thread's argument: a Thread keeps its arguments until its target returns.
        threading.Thread(target=_run, args=(idle,), name=name, daemon=True).start()
        return
    idle.work = (work, name)
    idle.given.release()


def idle_threads() -> list[int]:
    """The native ids of the threads waiting for an instance."""
    with _lock:
        return [idle.thread for idle in _idle]


def _run(first: _Idle) -> None:
    job, first.work = first.work, None
    while job is not None:
        work, threading.current_thread().name = job
        job = None
        work()
        del work  # what the finished instance held goes now, not once the next one starts
        job = _wait()


def _wait() -> tuple[Work, str] | None:
    priority = compute_threads.entered_priority()
    if priority is None:
        return None
    idle = _Idle(priority)
    with _lock:
        if len(_idle) >= MAX_IDLE:
            return None
        _idle.append(idle)
    if not idle.given.acquire(timeout=IDLE_SECONDS):
        with _lock:
            if idle in _idle:
                _idle.remove(idle)
                return None
        idle.given.acquire()  # taken between the timeout and the lock: its work is on its way
    return idle.work
