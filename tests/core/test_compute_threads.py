"""Model threads run below the event loop's CPU priority (--compute-priority)."""

from __future__ import annotations

import asyncio
import os
import sys
import threading
from pathlib import Path

import pytest

from modelhost.core import compute_threads
from tests.server import ServerProcess

linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="per-thread priorities are Linux's")


def _in_new_thread(job) -> object:  # type: ignore[no-untyped-def]
    result: list[object] = []
    thread = threading.Thread(target=lambda: result.append(job()))
    thread.start()
    thread.join()
    return result[0]


@pytest.fixture(autouse=True)
def _restore() -> object:
    yield
    compute_threads.configure("normal")


@linux_only
def test_low_is_sched_idle_for_the_thread_only() -> None:
    compute_threads.configure("low")

    def job() -> tuple[int, int]:
        compute_threads.enter()
        inner = _in_new_thread(lambda: os.sched_getscheduler(0))  # threads it starts inherit it
        return os.sched_getscheduler(0), inner  # type: ignore[return-value]

    assert _in_new_thread(job) == (os.SCHED_IDLE, os.SCHED_IDLE)
    assert os.sched_getscheduler(0) == os.SCHED_OTHER  # the caller's thread is untouched


@linux_only
def test_nice_lowers_by_nice_value() -> None:
    compute_threads.configure("nice")

    def job() -> int:
        compute_threads.enter()
        return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())

    assert _in_new_thread(job) >= 10
    assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) < 10


@linux_only
def test_normal_leaves_threads_alone() -> None:
    compute_threads.configure("normal")

    def job() -> tuple[int, int]:
        compute_threads.enter()
        return os.sched_getscheduler(0), os.getpriority(os.PRIO_PROCESS, threading.get_native_id())

    assert _in_new_thread(job) == (os.SCHED_OTHER, os.getpriority(os.PRIO_PROCESS, threading.get_native_id()))


@linux_only
def test_loading_runs_on_a_lowered_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    # Model loads: ONNX Runtime starts its intra-op threads there, and they inherit the priority.
    monkeypatch.setattr(compute_threads, "_loading", None)  # threads made before this test kept their own
    compute_threads.configure("low")
    policy = asyncio.run(compute_threads.run_loading(os.sched_getscheduler, 0))
    assert policy == os.SCHED_IDLE


def test_unknown_priority_is_refused() -> None:
    with pytest.raises(ValueError, match="compute priority must be one of low, nice, normal"):
        compute_threads.configure("high")  # type: ignore[arg-type]


@linux_only
def test_a_served_models_threads_run_below_the_event_loop(example_server: ServerProcess) -> None:
    # The example server runs with the default (low): its instance threads and the intra-op threads
    # ONNX Runtime started while loading are SCHED_IDLE; the event loop (main) thread is not.
    pid = example_server.process.pid
    policies = {int(task.name): os.sched_getscheduler(int(task.name)) for task in Path(f"/proc/{pid}/task").iterdir()}
    assert policies[pid] == os.SCHED_OTHER
    assert sum(policy == os.SCHED_IDLE for policy in policies.values()) >= 3  # one instance per example model
