"""The threads models load on: at the event loop's priority, while the threads a load starts compute below it.

Loading is not hot-path compute, and a multi-model endpoint's miss waits for its load: at SCHED_IDLE (the
compute priority on two CPUs, core/compute_threads.py) a loading thread waits behind every normal thread of
the machine that wants a core, other processes' included. But the thread pools a framework starts while
loading a model (ONNX Runtime's intra-op threads, TensorFlow's) compute that model's requests, so they must
run at the compute priority, and a new thread inherits its creator's scheduling policy.

So, when the compute priority is below the loop's and the process runs at SCHED_OTHER, a loading thread
stays at the loop's priority and marks itself SCHED_BATCH while it runs a job (the same weight; an
unprivileged thread may switch between the two both ways, never back from SCHED_IDLE). Threads the job
starts inherit the mark. Their ids lie between the pid namespace's last id before the job and after it
(/proc/sys/kernel/ns_last_pid; 2 µs to read where listing the process's threads takes 40): after the job,
each thread of the process with such an id, at SCHED_BATCH and not a loading thread, is lowered to the
compute priority. Nothing else in modelhost uses SCHED_BATCH. A process a load starts inherits the mark as
well: its starter lowers it (compute_threads.lower). Where the process runs at another policy (an operator's
`chrt`) or the last id cannot be read, loading threads take the compute priority as before.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import threading
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import TypeVar

from modelhost.core import compute_threads

log = logging.getLogger("modelhost")

T = TypeVar("T")

_LAST_ID = "/proc/sys/kernel/ns_last_pid"
_WINDOW = 256  # ids started during a job, beyond which (or when the ids wrapped) the process's threads are listed

_executor: ThreadPoolExecutor | None = None
_lock = threading.Lock()
_marking: set[int] = set()  # native ids of the loading threads that mark their jobs
_last_id: int | None = None  # a descriptor of _LAST_ID, opened by the first marking thread


_waiting = 0  # requests waiting for their model to load (counted on the event loop)


@contextlib.contextmanager
def waited_for() -> Iterator[None]:
    """A request waits for its model to load (a multi-model endpoint's miss) for the block (on the event loop)."""
    global _waiting
    _waiting += 1
    try:
        yield
    finally:
        _waiting -= 1


def requests_wait() -> bool:
    """Whether a request waits for its model to load."""
    return _waiting > 0


async def run_loading(function: Callable[..., T], *args: object) -> T:
    """`function(*args)` on a model-loading thread."""
    return await start_loading(lambda: function(*args))


def start_loading(job: Callable[[], T]) -> asyncio.Future[T]:
    """`job()` started on a model-loading thread: its future (no task to await it in)."""
    global _executor
    with _lock:
        if _executor is None:
            _executor = ThreadPoolExecutor(thread_name_prefix="modelhost-load", initializer=_enter)
    return asyncio.get_running_loop().run_in_executor(_executor, partial(_run_marked, job))


def _enter() -> None:
    """A new loading thread: marks its jobs where it can, else computes at the compute priority."""
    global _last_id
    if compute_threads.lowers() and hasattr(os, "sched_setscheduler") and os.sched_getscheduler(0) == os.SCHED_OTHER:
        with _lock:
            if _last_id is None:
                with contextlib.suppress(OSError):
                    _last_id = os.open(_LAST_ID, os.O_RDONLY)
            if _last_id is not None:
                _marking.add(threading.get_native_id())
                return
    compute_threads.enter()


def _run_marked(job: Callable[[], T]) -> T:
    thread = threading.get_native_id()
    if thread not in _marking:
        return job()
    try:
        first = _read_last_id()
        os.sched_setscheduler(thread, os.SCHED_BATCH, os.sched_param(0))
    except OSError as exc:  # a seccomp profile may refuse it: load at the compute priority, as before
        log.warning("cannot mark loading thread %s (%s): it loads at the compute priority", thread, exc)
        with _lock:
            _marking.discard(thread)
        compute_threads.enter()
        return job()
    try:
        return job()
    finally:
        try:
            os.sched_setscheduler(thread, os.SCHED_OTHER, os.sched_param(0))
        except OSError:  # (allowed to any thread; if refused, it computes as the threads it started will)
            with _lock:
                _marking.discard(thread)
            compute_threads.enter()
        lower_started(first, _read_last_id())


def _read_last_id() -> int:
    assert _last_id is not None
    return int(os.pread(_last_id, 32, 0))


def lower_started(first: int, last: int) -> None:
    """Lower the threads that loading jobs started with ids in (first, last]: at SCHED_BATCH, not loading threads."""
    if 0 <= last - first <= _WINDOW:
        candidates: Iterable[int] = range(first + 1, last + 1)
    else:
        candidates = [int(name) for name in os.listdir("/proc/self/task")]
    for thread in candidates:
        try:
            marked = os.sched_getscheduler(thread) == os.SCHED_BATCH  # (any process's id: checked next)
        except OSError:  # no such id now
            continue
        if marked and thread not in _marking and os.path.exists(f"/proc/self/task/{thread}"):
            compute_threads.lower(thread)
