"""Threads that compute run below the event loop's CPU priority.

The event loop thread is every request's critical path: it reads, decodes, answers and hands batches
out. When model threads keep every core busy, the kernel lets a running compute thread finish its
slice before the loop thread, just woken by a request, gets the core back: a 1-4 ms stall per
execution, which is the latency tail of a busy server and of every answer it gives meanwhile,
overload rejections included (benchmarks/abuse.py). Compute threads therefore run at a lower
priority (Linux):

- `low`: SCHED_IDLE. Such a thread runs whenever no normal thread of the process (or of the machine,
  outside a container's cgroup) wants the core, and yields it at once when one wakes.
- `nice`: nice 10: the kernel favours the loop about 10:1, but lets a compute slice finish first.
- `normal`: the loop's own priority (what the process had before this module).

Which threads: model instances (core/scheduler.py), and model loading (`run_loading`), so that the
thread pools a framework creates while loading a model (ONNX Runtime's intra-op threads) inherit it;
threads a model creates as it first runs (torch's) inherit it from the instance thread. A lowered
thread cannot raise itself back without privileges, so only threads started for these jobs are lowered.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Literal, TypeVar

log = logging.getLogger("modelhost")

Priority = Literal["low", "nice", "normal"]
PRIORITIES: tuple[Priority, ...] = ("low", "nice", "normal")
_NICE = 10
T = TypeVar("T")

_priority: Priority = "normal"
_loading: ThreadPoolExecutor | None = None
_lock = threading.Lock()


def configure(priority: Priority) -> None:
    """Set for the process before any model loads (Server does it from --compute-priority)."""
    global _priority
    if priority not in PRIORITIES:
        raise ValueError(f"compute priority must be one of {', '.join(PRIORITIES)}, got {priority!r}")
    _priority = priority


def enter() -> None:
    """Lower the calling thread to the configured compute priority (it stays there)."""
    if _priority == "normal" or not hasattr(os, "sched_setscheduler"):  # the per-thread calls are Linux's
        return
    thread = threading.get_native_id()
    try:
        if _priority == "low":
            os.sched_setscheduler(thread, os.SCHED_IDLE, os.sched_param(0))
        else:
            os.setpriority(os.PRIO_PROCESS, thread, max(os.getpriority(os.PRIO_PROCESS, thread), _NICE))
    except OSError as exc:  # a seccomp profile may refuse it: compute at the loop's priority
        log.warning("cannot lower the priority of compute thread %s: %s", threading.current_thread().name, exc)


async def run_loading(function: Callable[..., T], *args: object) -> T:
    """`function(*args)` on a model-loading thread, at the compute priority."""
    global _loading
    with _lock:
        if _loading is None:
            _loading = ThreadPoolExecutor(thread_name_prefix="modelhost-load", initializer=enter)
    return await asyncio.get_running_loop().run_in_executor(_loading, lambda: function(*args))
