"""Instance threads are kept for the next instance once theirs has unloaded (core/instance_threads.py)."""

from __future__ import annotations

import sys
import threading
import weakref

import pytest

from modelhost.core import compute_threads, instance_threads
from tests.helpers import run, until


@pytest.fixture(autouse=True)
def _restore() -> object:
    yield
    compute_threads.configure("normal")


def _run_and_wait(name: str) -> tuple[int, str]:
    """Start work on an instance thread and wait until it is done; the thread's native id and name as it ran."""
    seen: list[tuple[int, str]] = []
    done = threading.Event()

    def work() -> None:
        compute_threads.enter()
        seen.append((threading.get_native_id(), threading.current_thread().name))
        done.set()

    instance_threads.start(work, name)
    assert done.wait(10)
    return seen[0]


def _waiting(thread: int) -> None:
    run(until(lambda: thread in instance_threads.idle_threads(), "the thread waiting for the next instance"))


def test_a_finished_thread_runs_the_next_instance_under_its_name() -> None:
    first, first_name = _run_and_wait("model-a:1#0")
    _waiting(first)
    waiting = instance_threads.idle_threads()  # other tests' threads may wait too, and park after this one
    second, second_name = _run_and_wait("model-b:1#0")
    assert second in waiting  # no new thread
    assert (first_name, second_name) == ("model-a:1#0", "model-b:1#0")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="per-thread priorities are Linux's")
def test_a_thread_is_kept_only_for_instances_of_its_priority() -> None:
    compute_threads.configure("nice")
    lowered, _ = _run_and_wait("nice-model:1#0")
    _waiting(lowered)
    compute_threads.configure("normal")
    other, _ = _run_and_wait("normal-model:1#0")
    assert other != lowered  # a niced thread cannot rise again: a normal instance gets a thread of its own


def test_a_thread_the_execution_watch_lowered_ends() -> None:
    assert compute_threads.configure("auto", cpus=1) == "adaptive"
    ended = threading.Event()
    ran_on: list[int] = []

    def work() -> None:
        compute_threads.enter()
        watch = compute_threads.execution_watch()
        assert watch is not None
        while not watch(compute_threads.LONG_EXECUTION_NS):
            pass
        threading.current_thread().name = "watched"
        ran_on.append(threading.get_native_id())

    def ends() -> None:
        work()
        ended.set()

    instance_threads.start(ends, "slow-model:1#0")
    assert ended.wait(10)
    run(until(lambda: not any(t.name == "watched" for t in threading.enumerate()), "the lowered thread gone"))
    assert ran_on[0] not in instance_threads.idle_threads()


def test_an_idle_thread_ends_after_the_idle_time(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(instance_threads, "IDLE_SECONDS", 0.05)
    ident, _ = _run_and_wait("short-lived:1#0")
    run(until(lambda: not any(t.native_id == ident for t in threading.enumerate()), "the idle thread ended"))


def test_a_waiting_thread_holds_nothing_of_the_instance_it_ran(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(instance_threads, "MAX_IDLE", 10_000)  # it waits, whatever other tests left waiting
    ran_on: list[int] = []

    class Instance:
        def run(self) -> None:
            compute_threads.enter()
            ran_on.append(threading.get_native_id())

    instance = Instance()
    gone = weakref.ref(instance)
    instance_threads.start(instance.run, "done-model:1#0")
    del instance
    run(until(lambda: bool(ran_on), "the instance to run"))
    _waiting(ran_on[0])
    run(until(lambda: gone() is None, "the finished instance released"))
