"""Scheduler: queue policies (size, timeouts, timeout actions), priorities, cancel, errors, stop and splitting."""

from __future__ import annotations

import asyncio
import functools
import threading
import time
import weakref

import numpy as np
import pytest

from modelhost.core import compute_threads, loading_threads
from modelhost.core.compute_threads import Priority
from modelhost.errors import ErrorKind
from tests.core.scheduler_harness import (
    BATCHING,
    WIDTH,
    Harness,
    gated,
    on_loop_within,
    rows_of,
    serving,
    tags_of,
)
from tests.fakes import Echo, Failing, ManualClock
from tests.helpers import rejected_async, run, until

# --------------------------------------------------------------------------- queue policy


def test_full_queue_rejects_at_once_with_overloaded_and_retry_after() -> None:
    async def scenario() -> None:
        model = gated()
        async with serving("max_batch_size: 1 dynamic_batching { default_queue_policy { max_queue_size: 2 } }",
                           model) as h:
            blocker = await h.hold(model)  # running, not queued
            queued = await h.queue(1, 2)
            started = time.monotonic()
            error = await rejected_async(h.call(3), ErrorKind.OVERLOADED)
            assert time.monotonic() - started < 0.5
            assert error.retry_after is not None and error.retry_after > 0
            assert "max_queue_size 2" in error.message
            assert h.scheduler.queued() == 2 and h.scheduler.inflight() == 3  # blocker + 2 queued
            model.open()
            await asyncio.gather(blocker, *queued)
            await h.call(4)  # room again
            assert [tags_of(b) for b in model.batches] == [[0], [1], [2], [4]]

    run(scenario())


def test_max_queue_size_is_per_priority_level() -> None:
    async def scenario() -> None:
        model = gated()
        config = """max_batch_size: 1 dynamic_batching {
            priority_levels: 2 default_priority_level: 2
            priority_queue_policy { key: 1 value: { max_queue_size: 1 } } }"""
        async with serving(config, model) as h:
            blocker = await h.hold(model)
            high = await h.queue(1, priority=1)
            await rejected_async(h.call(2, priority=1), ErrorKind.OVERLOADED)
            low = await h.queue(3, 4, 5)  # level 2 is unbounded
            model.open()
            await asyncio.gather(blocker, *high, *low)

    run(scenario())


def test_default_timeout_expires_a_queued_request_before_it_runs() -> None:
    async def scenario() -> None:
        model = gated()
        config = "max_batch_size: 8 dynamic_batching { default_queue_policy { default_timeout_microseconds: 50000 } }"
        clock = ManualClock()
        async with serving(config, model, clock=clock) as h:
            blocker = await h.hold(model)
            call = asyncio.ensure_future(rejected_async(h.call(1), ErrorKind.TIMEOUT))
            await until(lambda: h.scheduler.queued() == 1)
            clock.advance(0.049)
            await asyncio.sleep(0.01)
            assert not call.done()
            clock.advance(0.001)  # its 50 ms, exactly
            error = await call
            assert "timed out" in error.message
            assert h.scheduler.queued() == 0 and not blocker.done()
            model.open()
            await blocker
            await h.call(2)
            assert [tags_of(b) for b in model.batches] == [[0], [2]]  # the model never saw request 1
            assert h.statistics.inference_count == 2

    run(scenario())


def test_request_timeout_override_may_only_shorten_the_default() -> None:
    async def scenario() -> None:
        model = gated()
        config = """max_batch_size: 8 dynamic_batching { default_queue_policy {
            default_timeout_microseconds: 150000 allow_timeout_override: true } }"""
        clock = ManualClock()
        async with serving(config, model, clock=clock) as h:
            blocker = await h.hold(model)
            expired: list[int] = []
            tasks = {tag: h.spawn(tag, timeout_us=timeout) for tag, timeout in
                     ((1, 20_000), (2, 60_000_000), (3, None))}
            for tag, task in tasks.items():
                task.add_done_callback(functools.partial(lambda tag, _: expired.append(tag), tag))
            await until(lambda: h.scheduler.queued() == 3)
            clock.advance(0.020)  # its own 20 ms beat the 150 ms default
            await until(lambda: expired == [1])
            clock.advance(0.129)
            await asyncio.sleep(0.01)
            assert expired == [1]
            clock.advance(0.001)  # 60 s could not extend the default, nor no timeout at all
            for task in tasks.values():
                await rejected_async(task, ErrorKind.TIMEOUT)
            await until(lambda: sorted(expired) == [1, 2, 3])
            assert not blocker.done()
            model.open()
            await blocker
            assert model.sizes == [1]

    run(scenario())


def test_request_timeout_is_ignored_without_allow_timeout_override() -> None:
    async def scenario() -> None:
        model = gated()
        clock = ManualClock()
        async with serving("max_batch_size: 8 dynamic_batching { }", model, clock=clock) as h:
            blocker = await h.hold(model)
            task = h.spawn(1, timeout_us=10_000)
            await until(lambda: h.scheduler.queued() == 1)
            clock.advance(60.0)
            await asyncio.sleep(0.01)
            assert not task.done()
            model.open()
            await asyncio.gather(blocker, task)

    run(scenario())


def test_request_timeout_alone_expires_with_allow_timeout_override() -> None:
    async def scenario() -> None:
        model = gated()
        config = "max_batch_size: 8 dynamic_batching { default_queue_policy { allow_timeout_override: true } }"
        clock = ManualClock()
        async with serving(config, model, clock=clock) as h:
            blocker = await h.hold(model)
            call = asyncio.ensure_future(rejected_async(h.call(1, timeout_us=30_000), ErrorKind.TIMEOUT))
            await until(lambda: h.scheduler.queued() == 1)
            clock.advance(0.029)
            await asyncio.sleep(0.01)
            assert not call.done()
            clock.advance(0.001)
            await call
            model.open()
            await blocker
            assert model.sizes == [1]

    run(scenario())


def test_timeout_action_delay_runs_an_expired_request_after_the_others() -> None:
    async def scenario() -> None:
        model = gated()
        config = """max_batch_size: 1 dynamic_batching { default_queue_policy {
            timeout_action: DELAY allow_timeout_override: true } }"""
        clock = ManualClock()
        async with serving(config, model, clock=clock) as h:
            blocker = await h.hold(model)
            late = h.spawn(1, timeout_us=20_000)
            await until(lambda: h.scheduler.queued() == 1)
            clock.advance(0.020)  # request 1 is at its timeout
            await asyncio.sleep(0.01)
            assert not late.done()
            in_time = await h.queue(2, 3)
            model.open()
            await asyncio.gather(blocker, late, *in_time)  # DELAY: it still runs, and succeeds
            assert [tags_of(b) for b in model.batches] == [[0], [2], [3], [1]]

    run(scenario())


def test_timeout_action_delay_keeps_the_request_ahead_of_lower_priority_levels() -> None:
    """Triton (model_config.proto): DELAY holds a request "until all other requests at the same (or higher)
    priority levels that have not reached their timeouts are processed" - not behind lower levels too."""
    async def scenario() -> None:
        model = gated()
        config = """max_batch_size: 1 dynamic_batching { priority_levels: 2 default_priority_level: 2
            priority_queue_policy { key: 1 value: { timeout_action: DELAY allow_timeout_override: true } } }"""
        clock = ManualClock()
        async with serving(config, model, clock=clock) as h:
            blocker = await h.hold(model)
            late = h.spawn(1, priority=1, timeout_us=20_000)
            await until(lambda: h.scheduler.queued() == 1)
            clock.advance(0.020)  # request 1 (level 1) is at its timeout: delayed
            low = await h.queue(2, priority=2)
            high = await h.queue(3, priority=1)
            model.open()
            await asyncio.gather(blocker, late, *low, *high)
            assert [tags_of(b) for b in model.batches] == [[0], [3], [1], [2]]

    run(scenario())


def test_delayed_requests_still_count_toward_max_queue_size() -> None:
    """Triton's PolicyQueue::Enqueue rejects when queue_.size() + delayed_queue_.size() >= max_queue_size."""
    async def scenario() -> None:
        model = gated()
        config = """max_batch_size: 1 dynamic_batching { default_queue_policy {
            max_queue_size: 1 timeout_action: DELAY allow_timeout_override: true } }"""
        clock = ManualClock()
        async with serving(config, model, clock=clock) as h:
            blocker = await h.hold(model)
            late = h.spawn(1, timeout_us=20_000)
            await until(lambda: h.scheduler.queued() == 1)
            clock.advance(0.020)  # delayed, still queued
            assert h.scheduler.queued() == 1
            try:
                await rejected_async(asyncio.wait_for(h.call(2), 0.3), ErrorKind.OVERLOADED)
            except asyncio.TimeoutError:
                pytest.fail("a second request was queued past max_queue_size 1 (the delayed one was not counted)")
            model.open()
            await asyncio.gather(blocker, late)

    run(scenario())


# --------------------------------------------------------------------------- priority


def test_queued_higher_priority_requests_run_first() -> None:
    async def scenario() -> None:
        model = gated()
        config = "max_batch_size: 2 dynamic_batching { priority_levels: 3 default_priority_level: 2 }"
        async with serving(config, model) as h:
            blocker = await h.hold(model)
            queued = [h.spawn(1), h.spawn(2, priority=3), h.spawn(3, priority=1), h.spawn(4, priority=2)]
            await until(lambda: h.scheduler.queued() == 4)
            model.open()
            await asyncio.gather(blocker, *queued)
            # level 1 first, then the default level 2 (1 and 4 in arrival order), then level 3
            assert [tags_of(b) for b in model.batches] == [[0], [3, 1], [4, 2]]

    run(scenario())


def test_priority_out_of_range_is_invalid_input() -> None:
    async def scenario() -> None:
        async with serving("max_batch_size: 8 dynamic_batching { priority_levels: 2 default_priority_level: 1 }",
                           Echo()) as h:
            error = await rejected_async(h.call(1, priority=3), ErrorKind.INVALID_INPUT)
            assert "priority" in error.message
            await h.call(2, priority=2)
            await h.call(3, priority=0)  # 0: the default level
        async with serving("max_batch_size: 8 dynamic_batching { }", Echo()) as h:
            await rejected_async(h.call(1, priority=2), ErrorKind.INVALID_INPUT)
            await h.call(2, priority=1)
            assert h.scheduler.queued() == 0 and h.scheduler.inflight() == 0

    run(scenario())


# --------------------------------------------------------------------------- cancel, errors, stop


def test_cancelled_queued_request_is_dropped_before_it_runs() -> None:
    async def scenario() -> None:
        model = gated()
        async with serving(BATCHING, model) as h:
            blocker = await h.hold(model)
            gone, kept = await h.queue(1, 2)
            gone.cancel()
            with pytest.raises(asyncio.CancelledError):
                await gone
            assert h.scheduler.queued() == 1
            model.open()
            await asyncio.gather(blocker, kept)
            assert [tags_of(b) for b in model.batches] == [[0], [2]]
            assert h.statistics.inference_count == 2 and h.statistics.execution_count == 2
            assert h.scheduler.inflight() == 0

    run(scenario())


def test_cancelled_running_request_does_not_break_its_batch() -> None:
    async def scenario() -> None:
        model = gated()
        async with serving(BATCHING, model) as h:
            blocker = await h.hold(model)
            blocker.cancel()  # already running: it finishes, the caller is gone
            with pytest.raises(asyncio.CancelledError):
                await blocker
            queued = await h.queue(1, 2)
            model.open()
            await asyncio.gather(*queued)
            assert model.sizes == [1, 2]

    run(scenario())


def test_a_model_error_reaches_every_request_of_its_batch() -> None:
    async def scenario() -> None:
        model = Failing(gate=threading.Event())
        async with serving(BATCHING, model) as h:
            blocker = await h.hold(model)
            queued = await h.queue(1, 2, 3)
            model.open()
            results = await asyncio.gather(blocker, *queued, return_exceptions=True)
            assert all(isinstance(r, RuntimeError) and str(r) == "boom" for r in results), results
            assert model.sizes == [1, 3]
            with pytest.raises(RuntimeError, match="boom"):  # the instance thread survived
                await h.call(4)

    run(scenario())


def test_stop_drains_queued_requests_then_unloads_instances() -> None:
    async def scenario() -> None:
        a, b = gated(), gated()
        h = Harness("max_batch_size: 2 dynamic_batching { }", (a, b))
        try:
            first = h.spawn(0)
            await until(lambda: a.started + b.started == 1, "one instance to take the first request")
            second = h.spawn(1)
            await until(lambda: a.started == b.started == 1, "the other to take the second")
            queued = await h.queue(2, 3, 4, 5, 6)
            stopping = asyncio.create_task(h.scheduler.stop())
            await asyncio.sleep(0.01)
            error = await rejected_async(h.call(7), ErrorKind.UNAVAILABLE)
            assert "stopping" in error.message
            assert not stopping.done() and a.unloaded_after == -1 and b.unloaded_after == -1
            a.open()
            b.open()
            await asyncio.wait_for(stopping, 5)
            await asyncio.gather(first, second, *queued)
            assert sorted(t for m in (a, b) for batch in m.batches for t in tags_of(batch)) == [0, 1, 2, 3, 4, 5, 6]
            assert a.unloaded_after == a.finished and b.unloaded_after == b.finished  # after their last batch
        finally:
            a.open()
            b.open()
            await asyncio.wait_for(h.scheduler.stop(), 5)

    run(scenario())


def test_stop_awaited_twice_at_once_returns_to_both_after_the_unload() -> None:
    async def scenario() -> None:
        a = gated()
        h = Harness("max_batch_size: 2 dynamic_batching { }", (a,))
        try:
            first = await h.hold(a)
            stops = [asyncio.create_task(h.scheduler.stop()) for _ in range(2)]
            await asyncio.sleep(0.01)
            assert not any(stop.done() for stop in stops) and a.unloaded_after == -1
            a.open()
            await asyncio.wait_for(asyncio.gather(*stops), 5)
            await first
            assert a.unloaded_after == a.finished
            await asyncio.wait_for(h.scheduler.stop(), 5)  # and once more, stopped already
        finally:
            a.open()

    run(scenario())


def test_an_idle_instance_thread_holds_no_tensor_of_its_last_batch() -> None:
    """A model's memory is what its instances hold: the last request's tensors go with the request, not when
    the instance's thread next takes a batch (a multi-model cache measures a victim's memory freed)."""
    async def scenario() -> None:
        async with serving(BATCHING, Echo()) as h:
            x = rows_of(1)
            freed = weakref.ref(x)
            outputs = await h.scheduler.submit({"INPUT0": x}, ["OUTPUT0"], 1)
            np.testing.assert_array_equal(outputs["OUTPUT0"], x)
            del x, outputs
            await until(lambda: freed() is None, "the request's input to be freed")

    run(scenario())


@pytest.mark.parametrize("priority", ["low", "normal"])
def test_while_a_request_waits_for_a_load_others_compute_on_their_instance_threads(priority: Priority) -> None:
    """Where compute runs below the loop, a request that would run on the loop runs on its instance thread while
    another waits for its model to load: the loop's thread computes at the loading thread's priority, and the
    request waiting for the load is the oldest. At the loop's priority there is nothing to yield: it runs on the
    loop as ever."""
    async def scenario() -> None:
        model = Echo()
        h = Harness("max_batch_size: 8 " + on_loop_within(1_000_000), (model,))
        try:
            await h.call(1)  # (measured on its instance thread first)
            await h.call(2)
            with loading_threads.waited_for():
                await h.call(3)
            await h.call(4)
            loop = threading.current_thread().name
            assert model.threads[1] == model.threads[3] == loop, model.threads
            assert (model.threads[2] == loop) == (priority == "normal"), model.threads
        finally:
            await h.scheduler.stop()

    compute_threads.configure(priority)
    try:
        run(scenario())
    finally:
        compute_threads.configure("normal")


# --------------------------------------------------------------------------- request splitting

SPLIT = 'parameters { key: "request_split_size" value: { string_value: "4" } }'


def test_a_split_request_gets_all_its_rows_back_in_order() -> None:
    async def scenario() -> None:
        models = (Echo(), Echo())
        async with serving(f"max_batch_size: 4 dynamic_batching {{ }} {SPLIT}", *models) as h:
            x = (np.arange(10 * WIDTH, dtype=np.float32)).reshape(10, WIDTH)
            outputs = await h.scheduler.submit({"INPUT0": x}, ["OUTPUT0"], 10)
            np.testing.assert_array_equal(outputs["OUTPUT0"], x)
            sizes = sorted(size for m in models for size in m.sizes)
            assert sizes == [2, 4, 4]
            assert h.statistics.inference_count == 10 and h.statistics.execution_count == 3

    run(scenario())


def test_cancelling_a_split_request_drops_all_its_queued_chunks() -> None:
    async def scenario() -> None:
        model = gated()
        async with serving(f"max_batch_size: 4 dynamic_batching {{ }} {SPLIT}", model) as h:
            blocker = await h.hold(model)
            big = h.spawn(1, rows=10)
            await until(lambda: h.scheduler.queued() == 3)
            big.cancel()
            with pytest.raises(asyncio.CancelledError):
                await big
            await until(lambda: h.scheduler.queued() == 0)
            model.open()
            await blocker
            await h.call(2)
            assert [tags_of(b) for b in model.batches] == [[0], [2]]

    run(scenario())
