"""Models load at the event loop's priority; the threads a load starts compute at the compute priority."""

from __future__ import annotations

import asyncio
import os
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import onnxruntime as ort
import pytest

from modelhost.backends.python.isolated import IsolatedModel
from modelhost.core import compute_threads, loading_threads
from tests.archives import weighted_model
from tests.backends.test_python_backend import CONFIG, ISOLATED, load, write_model

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="per-thread priorities are Linux's")

Policy = tuple[int, int]  # (scheduling policy, nice value)


@pytest.fixture(autouse=True)
def _fresh_loading_threads(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(loading_threads, "_executor", None)  # threads made before a test keep their own priority
    yield
    compute_threads.configure("normal")


def _policy(thread: int) -> Policy:
    return os.sched_getscheduler(thread), os.getpriority(os.PRIO_PROCESS, thread)


def _threads() -> set[int]:
    return {int(name) for name in os.listdir("/proc/self/task")}


def _load_a_session() -> tuple[Policy, set[int], ort.InferenceSession]:
    """On a loading thread: its own priority, and the threads ONNX Runtime started for a session of 3 intra-op
    threads (kept alive by the session returned)."""
    before = _threads()
    options = ort.SessionOptions()
    options.intra_op_num_threads = 3
    session = ort.InferenceSession(weighted_model(1.0, 4).SerializeToString(), options,
                                   providers=["CPUExecutionProvider"])
    return _policy(threading.get_native_id()), _threads() - before, session


def _in_thread(job: Callable[[], object]) -> object:
    result: list[object] = []
    thread = threading.Thread(target=lambda: result.append(job()))
    thread.start()
    thread.join()
    return result[0]


def test_a_load_runs_at_the_loops_priority_and_the_threads_it_starts_below_it() -> None:
    compute_threads.configure("low")
    loop_priority = _policy(threading.get_native_id())
    loading, started, session = asyncio.run(loading_threads.run_loading(_load_a_session))
    assert loading[0] != os.SCHED_IDLE and loading[1] == loop_priority[1]
    assert len(started) == 2 and {os.sched_getscheduler(thread) for thread in started} == {os.SCHED_IDLE}
    assert session.run(None, {"INPUT0": [[1.0] * 4]})[0].tolist() == [[2.0] * 4]
    # Between jobs the loading thread is at the loop's own priority, and nothing is left marked.
    after = asyncio.run(loading_threads.run_loading(lambda: _policy(threading.get_native_id())))
    assert after == (os.SCHED_BATCH, loop_priority[1])  # the mark, while a job runs
    assert os.SCHED_BATCH not in {os.sched_getscheduler(thread) for thread in _threads()}


def test_threads_started_elsewhere_during_a_load_keep_their_priority() -> None:
    compute_threads.configure("low")
    elsewhere_started, release = threading.Event(), threading.Event()
    elsewhere = threading.Thread(target=release.wait, args=(10,))

    async def main() -> None:
        load = loading_threads.start_loading(lambda: elsewhere_started.wait(10))
        elsewhere.start()  # by the loop's thread, while the load runs
        elsewhere_started.set()
        await load

    asyncio.run(main())
    try:
        assert elsewhere.native_id is not None and os.sched_getscheduler(elsewhere.native_id) == os.SCHED_OTHER
    finally:
        release.set()
        elsewhere.join()


def test_a_failed_load_leaves_its_thread_unmarked() -> None:
    compute_threads.configure("low")

    def failing() -> None:
        raise ValueError("no such model")

    async def main() -> int:
        with pytest.raises(ValueError):
            await loading_threads.run_loading(failing)
        return await loading_threads.run_loading(threading.get_native_id)

    assert os.sched_getscheduler(asyncio.run(main())) == os.SCHED_OTHER


def test_under_nice_a_loads_threads_are_niced_at_the_ordinary_policy() -> None:
    compute_threads.configure("nice")
    _, started, _session = asyncio.run(loading_threads.run_loading(_load_a_session))
    assert started and all(os.sched_getscheduler(t) == os.SCHED_OTHER for t in started)
    assert all(os.getpriority(os.PRIO_PROCESS, t) >= 10 for t in started)


def test_a_process_at_another_policy_loads_at_the_compute_priority_as_before() -> None:
    # An operator's `chrt -b`: a thread at SCHED_BATCH is no mark of a load's there, so loads are lowered whole.
    compute_threads.configure("low")

    def at_batch() -> object:
        os.sched_setscheduler(0, os.SCHED_BATCH, os.sched_param(0))
        return asyncio.run(loading_threads.run_loading(_load_a_session))

    loading, started, _session = _in_thread(at_batch)  # type: ignore[misc]
    assert loading[0] == os.SCHED_IDLE
    assert {os.sched_getscheduler(thread) for thread in started} == {os.SCHED_IDLE}


def test_at_normal_nothing_is_marked_or_lowered() -> None:
    compute_threads.configure("normal")
    loading, started, _session = asyncio.run(loading_threads.run_loading(_load_a_session))
    assert loading[0] == os.SCHED_OTHER
    assert {os.sched_getscheduler(thread) for thread in started} == {os.SCHED_OTHER}


def test_a_worker_process_a_load_starts_computes_below_the_loop(tmp_path: Path) -> None:
    # An isolated Python model's worker inherits the loading thread's mark; its starter lowers it.
    compute_threads.configure("low")
    model = asyncio.run(loading_threads.run_loading(
        load, write_model(tmp_path, "isolated", config=CONFIG + ISOLATED)))
    try:
        assert isinstance(model, IsolatedModel)
        pid = model.worker_pid()
        threads = [int(task) for task in os.listdir(f"/proc/{pid}/task")]
        assert {os.sched_getscheduler(thread) for thread in threads} == {os.SCHED_IDLE}
    finally:
        model.unload()


def test_only_marked_threads_started_in_the_window_are_lowered_and_a_wrap_looks_at_every_thread() -> None:
    compute_threads.configure("low")
    ready, release = threading.Event(), threading.Event()

    def marked() -> None:  # as a thread a load started: its creator's mark inherited
        os.sched_setscheduler(0, os.SCHED_BATCH, os.sched_param(0))
        ready.set()
        release.wait(10)

    thread = threading.Thread(target=marked)
    thread.start()
    ready.wait(10)
    try:
        assert thread.native_id is not None
        loading_threads.lower_started(thread.native_id, thread.native_id + 5)  # after it: not its job's
        assert os.sched_getscheduler(thread.native_id) == os.SCHED_BATCH
        loading_threads.lower_started(thread.native_id + 5, 300)  # the ids wrapped: every thread looked at
        assert os.sched_getscheduler(thread.native_id) == os.SCHED_IDLE
    finally:
        release.set()
        thread.join()


def test_requests_wait_while_a_request_waits_for_its_model() -> None:
    assert not loading_threads.requests_wait()
    with loading_threads.waited_for():
        with loading_threads.waited_for():
            assert loading_threads.requests_wait()
        assert loading_threads.requests_wait()
    assert not loading_threads.requests_wait()
    with pytest.raises(ZeroDivisionError), loading_threads.waited_for():
        _ = 1 / 0
    assert not loading_threads.requests_wait()  # a wait that failed ended too
