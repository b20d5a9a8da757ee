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
- `auto` (the default): `low` when the process may run on two CPUs or more. On one CPU the loop and
  the compute thread share the core, and the GIL turns `low` into priority inversion for cheap models:
  a request arriving while a lowered thread holds the GIL wakes the loop, which preempts that thread and
  then waits for the GIL it holds. Measured with the server pinned to one core and `tiny` (wrk, c=8):
  ~3 context switches per request instead of ~0.6, and 0.64x the requests/s. For a model whose
  executions take milliseconds the GIL is free nearly all the time and the stall is what matters (a
  10x overload's rejections: p99 3.1 ms at `normal`, 0.24 ms at `low`). So on one CPU an instance
  thread starts at `normal` and lowers itself to `low` once LONG_RUNS executions in a row took
  LONG_EXECUTION_NS or more (`adaptive`).

Which threads: model instances (core/batch_threads.py); the thread pools a framework creates while loading a
model (ONNX Runtime's intra-op threads), which core/loading_threads.py finds and lowers (loading itself is
not hot-path compute and runs at the loop's priority); threads a model creates as it first runs (torch's)
inherit it from the instance thread. A lowered thread cannot raise itself back without privileges, so
only threads started for these jobs are lowered.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from typing import Literal

log = logging.getLogger("modelhost")

Priority = Literal["auto", "low", "nice", "normal"]
PRIORITIES: tuple[Priority, ...] = ("auto", "low", "nice", "normal")
Effective = Literal["low", "nice", "normal", "adaptive"]  # what `auto` resolves to included
_NICE = 10
LONG_EXECUTION_NS = 1_000_000
LONG_RUNS = 8

_priority: Effective = "normal"
_thread = threading.local()  # `entered`: the priority a compute thread entered at; `watched_down`: lowered since


def configure(priority: Priority, cpus: int | None = None) -> Effective:
    """Set for the process before any model loads (Server does it from --compute-priority); returns the
    priority in effect, `auto` resolved against `cpus` (default: the CPUs of the process's affinity)."""
    global _priority
    if priority not in PRIORITIES:
        raise ValueError(f"compute priority must be one of {', '.join(PRIORITIES)}, got {priority!r}")
    if priority == "auto":
        if cpus is None:
            cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
        _priority = "low" if cpus >= 2 else "adaptive"
    else:
        _priority = priority
    return _priority


def current_priority() -> Effective:
    """The configured compute priority, `auto` resolved."""
    return _priority


def enter() -> None:
    """Lower the calling thread to the configured compute priority (it stays there)."""
    _thread.entered = _priority
    if _priority == "low" or _priority == "nice":
        _lower(_priority)


def entered_priority() -> Effective | None:
    """The priority the calling thread computes at now, as `enter` and the execution watch left it: what a thread
    kept for other work must match. None for a thread that never entered, or that the watch lowered (`adaptive`
    starts every instance at the loop's priority, and a lowered thread cannot rise again)."""
    if getattr(_thread, "watched_down", False):
        return None
    entered: Effective | None = getattr(_thread, "entered", None)
    return entered


def execution_watch() -> Callable[[int], bool] | None:
    """For an instance thread under `adaptive`: a function to give each execution's duration (ns). After
    LONG_RUNS long executions in a row it lowers the calling thread to `low` and returns True (stop
    calling it). None under every other priority."""
    if _priority != "adaptive":
        return None
    long_runs = 0

    def executed(duration_ns: int) -> bool:
        nonlocal long_runs
        long_runs = long_runs + 1 if duration_ns >= LONG_EXECUTION_NS else 0
        if long_runs < LONG_RUNS:
            return False
        _lower("low")
        _thread.watched_down = True
        return True

    return executed


def lowers() -> bool:
    """Whether compute threads start below the loop's priority (`low`, `nice`)."""
    return _priority == "low" or _priority == "nice"


def lower(thread: int) -> None:
    """Lower another thread of this process (its native id), or a process's first thread (its pid), to the
    configured compute priority, whatever scheduling policy it inherited; nothing unless `lowers()`."""
    if _priority == "low" or _priority == "nice":
        _lower(_priority, thread)


def lower_process(pid: int) -> None:
    """Lower every thread of a process this one started (`lower` for each), the threads it may already have
    started too: a new thread inherits its creator's policy, so a pass that finds no thread it has not lowered
    leaves none at its start's priority. Nothing unless `lowers()`."""
    if not lowers():
        return
    lowered: set[int] = set()
    while True:
        try:
            threads = {int(task) for task in os.listdir(f"/proc/{pid}/task")}
        except OSError:  # it ended, or no /proc: its first thread, as `lower` does
            if not lowered:
                lower(pid)
            return
        if threads <= lowered:
            return
        for thread in sorted(threads - lowered):
            lower(thread)
        lowered |= threads


def _lower(priority: Literal["low", "nice"], thread: int | None = None) -> None:
    if not hasattr(os, "sched_setscheduler"):  # the per-thread calls are Linux's
        return
    thread = threading.get_native_id() if thread is None else thread
    try:
        if priority == "low":
            os.sched_setscheduler(thread, os.SCHED_IDLE, os.sched_param(0))
        else:
            if os.sched_getscheduler(thread) != os.SCHED_OTHER:  # (a loading thread's mark, inherited)
                os.sched_setscheduler(thread, os.SCHED_OTHER, os.sched_param(0))
            os.setpriority(os.PRIO_PROCESS, thread, max(os.getpriority(os.PRIO_PROCESS, thread), _NICE))
    except ProcessLookupError:  # it ended meanwhile
        pass
    except OSError as exc:  # a seccomp profile may refuse it: compute at the loop's priority
        log.warning("cannot lower the priority of compute thread %s: %s", thread, exc)
