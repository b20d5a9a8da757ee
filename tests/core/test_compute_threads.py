"""Model threads run below the event loop's CPU priority (--compute-priority)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from modelhost.core import compute_threads
from tests.core.scheduler_harness import serving
from tests.fakes import Slow
from tests.helpers import until
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


# A process that starts a thread at once, says so, then starts one more when told and prints its policy.
_THREADED_CHILD = """
import os, sys, threading
threading.Thread(target=threading.Event().wait, daemon=True).start()
print("started", flush=True)
sys.stdin.readline()
later = []
thread = threading.Thread(target=lambda: later.append(os.sched_getscheduler(0)))
thread.start()
thread.join()
print(later[0], flush=True)
sys.stdin.readline()
"""


@linux_only
def test_a_started_process_is_lowered_with_the_threads_it_started_before() -> None:
    # A worker started by a loading thread inherits its mark (SCHED_BATCH) and may start threads (numpy's,
    # its interpreter's) before its starter gets to it: each of them computes below the loop too.
    compute_threads.configure("low")

    def start_and_lower() -> tuple[set[int], int]:
        os.sched_setscheduler(0, os.SCHED_BATCH, os.sched_param(0))
        child = subprocess.Popen([sys.executable, "-c", _THREADED_CHILD], stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE, text=True)
        try:
            assert child.stdout is not None and child.stdin is not None
            assert child.stdout.readline().strip() == "started"
            compute_threads.lower_process(child.pid)
            policies = {os.sched_getscheduler(int(task)) for task in os.listdir(f"/proc/{child.pid}/task")}
            child.stdin.write("\n")
            child.stdin.flush()
            return policies, int(child.stdout.readline())
        finally:
            child.kill()
            child.wait()

    policies, later = _in_new_thread(start_and_lower)  # type: ignore[misc]
    assert policies == {os.SCHED_IDLE}
    assert later == os.SCHED_IDLE


@linux_only
def test_nice_lowers_by_nice_value() -> None:
    compute_threads.configure("nice")

    def job() -> int:
        compute_threads.enter()
        return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())

    loop = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())  # above 0 when the suite runs under `nice`
    assert _in_new_thread(job) == max(loop, 10)
    assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == loop  # the caller's is left alone


@linux_only
def test_normal_leaves_threads_alone() -> None:
    compute_threads.configure("normal")

    def job() -> tuple[int, int]:
        compute_threads.enter()
        return os.sched_getscheduler(0), os.getpriority(os.PRIO_PROCESS, threading.get_native_id())

    assert _in_new_thread(job) == (os.SCHED_OTHER, os.getpriority(os.PRIO_PROCESS, threading.get_native_id()))




def test_auto_is_low_on_two_cpus_or_more_and_adaptive_on_one() -> None:
    assert compute_threads.configure("auto", cpus=2) == "low"
    assert compute_threads.configure("auto", cpus=16) == "low"
    assert compute_threads.configure("auto", cpus=1) == "adaptive"
    assert compute_threads.configure("nice", cpus=1) == "nice"  # what the operator names is kept


@linux_only
def test_adaptive_lowers_a_thread_only_after_a_run_of_long_executions() -> None:
    compute_threads.configure("auto", cpus=1)
    long, short = compute_threads.LONG_EXECUTION_NS, compute_threads.LONG_EXECUTION_NS - 1
    runs = compute_threads.LONG_RUNS

    def job() -> list[tuple[bool, int]]:
        compute_threads.enter()
        watch = compute_threads.execution_watch()
        assert watch is not None
        seen = [(False, os.sched_getscheduler(0))]
        for duration in [long] * (runs - 1) + [short] + [long] * (runs - 1):  # a short one restarts the count
            seen.append((watch(duration), os.sched_getscheduler(0)))
        seen.append((watch(long), os.sched_getscheduler(0)))
        return seen

    seen = _in_new_thread(job)
    assert seen[:-1] == [(False, os.SCHED_OTHER)] * (2 * runs)  # type: ignore[index]
    assert seen[-1] == (True, os.SCHED_IDLE)  # type: ignore[index]
    assert os.sched_getscheduler(0) == os.SCHED_OTHER


def test_only_adaptive_watches_executions() -> None:
    for priority in ("low", "nice", "normal"):
        compute_threads.configure(priority)  # type: ignore[arg-type]
        assert compute_threads.execution_watch() is None


def test_unknown_priority_is_refused() -> None:
    with pytest.raises(ValueError, match="compute priority must be one of auto, low, nice, normal"):
        compute_threads.configure("high")  # type: ignore[arg-type]


@linux_only
def test_a_served_models_threads_run_below_the_event_loop(example_server: ServerProcess) -> None:
    # The example server runs with the default (auto: low on two CPUs or more): its instance threads and the
    # intra-op threads ONNX Runtime started while loading are SCHED_IDLE; the event loop (main) thread is not.
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("auto is adaptive on one CPU (the next tests)")
    pid = example_server.process.pid
    policies = {int(task.name): os.sched_getscheduler(int(task.name)) for task in Path(f"/proc/{pid}/task").iterdir()}
    assert policies[pid] == os.SCHED_OTHER
    assert sum(policy == os.SCHED_IDLE for policy in policies.values()) >= 3  # one instance per example model
    assert os.SCHED_BATCH not in policies.values()  # the loading threads' mark (core/loading_threads.py)


@linux_only
def test_an_instance_thread_whose_model_runs_long_lowers_itself_under_adaptive() -> None:
    class Recording(Slow):
        thread = 0

        def work(self) -> None:
            self.thread = threading.get_native_id()
            super().work()

    async def main() -> tuple[int, int]:
        compute_threads.configure("auto", cpus=1)
        model = Recording(seconds=2 * compute_threads.LONG_EXECUTION_NS / 1e9)
        async with serving("", model) as harness:
            for tag in range(compute_threads.LONG_RUNS - 1):
                await harness.call(tag)
            before = os.sched_getscheduler(model.thread)
            await harness.call(99)
            await until(lambda: os.sched_getscheduler(model.thread) == os.SCHED_IDLE, what="the thread to lower")
            return before, os.sched_getscheduler(model.thread)

    assert asyncio.run(main()) == (os.SCHED_OTHER, os.SCHED_IDLE)


@linux_only
def test_a_server_pinned_to_one_cpu_keeps_a_cheap_models_threads_at_the_loops_priority(tmp_path: Path) -> None:
    # auto on one CPU: a lowered thread holding the GIL would make the loop wait on it (module docstring).
    import requests

    from modelhost.example_repository import ensure_example_repository

    own = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {min(own)})  # inherited by the server
    try:
        server = ServerProcess(ensure_example_repository(tmp_path))
    finally:
        os.sched_setaffinity(0, own)
    try:
        server.wait_ready()
        body = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 4], "data": [1, 2, 3, 4]}]}
        url = f"{server.base}/v2/models/tiny/infer"
        # More clients than LOOP_MAX_IN_PROGRESS, so that requests run on the instance threads.
        with requests.Session() as session, ThreadPoolExecutor(16) as clients:
            list(clients.map(lambda _: session.post(url, json=body, timeout=10).raise_for_status(), range(200)))
        pid = server.process.pid
        policies = [os.sched_getscheduler(int(task.name)) for task in Path(f"/proc/{pid}/task").iterdir()]
        assert len(policies) >= 4 and set(policies) == {os.SCHED_OTHER}
    finally:
        server.stop()
