"""Scheduler unit tests: dynamic batching, queue policies, priorities, timeouts, ordering, cancel and stop.

The scheduler is driven directly on an asyncio loop (asyncio.run, no plugin) with fake models from
tests/fakes.py and policies parsed from real config.pbtxt text. A gated instance holds the model busy
so that requests queue deterministically; every wait is bounded.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import threading
import time
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any

import numpy as np
import pytest

from modelhost.config.pbtxt import ConfigError, parse_config
from modelhost.core.in_flight import InFlight
from modelhost.core.policy import LevelPolicy, SchedulingPolicy
from modelhost.core.scheduler import LOOP_MAX_IN_PROGRESS, Scheduler
from modelhost.core.statistics import ModelStatistics
from modelhost.errors import ErrorKind, ModelhostError
from tests.fakes import Echo, Failing, Slow

WIDTH = 4


def policy_of(text: str) -> SchedulingPolicy:
    return SchedulingPolicy.from_config(parse_config(text))


def on_loop_within(microseconds: int) -> str:
    return f'parameters {{ key: "inline_max_microseconds" value: {{ string_value: "{microseconds}" }} }}'


THREADS_ONLY = on_loop_within(0)


def run(coroutine: Coroutine[Any, Any, None], timeout: float = 10.0) -> None:
    asyncio.run(asyncio.wait_for(coroutine, timeout))


async def until(predicate: Callable[[], bool], timeout: float = 2.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what or predicate}")
        await asyncio.sleep(0.001)


def rows_of(tag: int, rows: int = 1, width: int = WIDTH, dtype: Any = np.float32) -> np.ndarray:
    """Values unique to `tag` (tag * 1000 + position), exact in fp32."""
    return (tag * 1000 + np.arange(rows * width)).reshape(rows, width).astype(dtype)


def tags_of(batch: dict[str, np.ndarray]) -> list[int]:
    """The tag of each row of a batch the model saw (rows_of layout)."""
    return [int(row[0]) // 1000 for row in batch["INPUT0"]]


class Harness:
    """One scheduler over fake instances. Its models run on their threads unless the config sets
    inline_max_microseconds: the fakes are fast enough for the event loop, and most of these tests
    are about queues and threads."""

    def __init__(self, config: str, instances: tuple[Echo, ...]) -> None:
        self.instances = instances
        self.statistics = ModelStatistics()
        self.in_flight = InFlight()
        if "inline_max_microseconds" not in config:
            config += " " + THREADS_ONLY
        self.scheduler = Scheduler("m:1", instances, policy_of(config), self.statistics, self.in_flight)

    async def call(self, tag: int, rows: int = 1, width: int = WIDTH, dtype: Any = np.float32,
                   **kwargs: Any) -> np.ndarray:
        x = rows_of(tag, rows, width, dtype)
        outputs = await self.scheduler.submit({"INPUT0": x}, ["OUTPUT0"], rows, **kwargs)
        assert set(outputs) == {"OUTPUT0"}
        np.testing.assert_array_equal(outputs["OUTPUT0"], x)  # exactly its own rows, nobody else's
        assert outputs["OUTPUT0"].dtype == x.dtype
        return outputs["OUTPUT0"]

    def spawn(self, tag: int, rows: int = 1, **kwargs: Any) -> asyncio.Task[np.ndarray]:
        return asyncio.create_task(self.call(tag, rows, **kwargs))

    async def queue(self, *tasks_or_tags: int, **kwargs: Any) -> list[asyncio.Task[np.ndarray]]:
        """Spawn one request per tag and wait until all are queued."""
        before = self.scheduler.queued()
        tasks = [self.spawn(tag, **kwargs) for tag in tasks_or_tags]
        await until(lambda: self.scheduler.queued() == before + len(tasks), what="requests to queue")
        return tasks

    async def hold(self, model: Slow, tag: int = 0) -> asyncio.Task[np.ndarray]:
        """Start a request that `model` (gated) runs and holds until its gate opens."""
        started = model.started
        task = self.spawn(tag)
        await until(lambda: model.started == started + 1, what="the blocker to start")
        return task


@contextlib.asynccontextmanager
async def serving(config: str, *instances: Echo) -> AsyncIterator[Harness]:
    harness = Harness(config, instances)
    try:
        yield harness
    finally:
        for instance in instances:
            if isinstance(instance, Slow):
                instance.open()
        await asyncio.wait_for(harness.scheduler.stop(), 5)


def gated() -> Slow:
    return Slow(gate=threading.Event())


async def rejected(awaitable: Any, kind: ErrorKind) -> ModelhostError:
    with pytest.raises(ModelhostError) as info:
        await awaitable
    assert info.value.kind is kind, info.value
    return info.value


BATCHING = "max_batch_size: 8 dynamic_batching { }"


# --------------------------------------------------------------------------- batch forming


def test_batches_form_while_the_instance_is_busy() -> None:
    async def scenario() -> None:
        model = gated()
        async with serving(BATCHING, model) as h:
            blocker = await h.hold(model)
            queued = await h.queue(1, 2, 3, 4, 5, 6)
            assert model.started == 1
            model.open()
            await asyncio.gather(blocker, *queued)
            stats = h.statistics
            assert model.sizes == [1, 6]
            assert tags_of(model.batches[1]) == [1, 2, 3, 4, 5, 6]  # arrival order within the batch
            assert stats.execution_count == 2 and stats.inference_count == 7
            assert sorted(stats.batches) == [1, 6]
            assert stats.queue.count == 7 and stats.compute_infer.count == 7
            assert h.scheduler.queued() == 0 and h.scheduler.inflight() == 0
            assert set(model.threads) == {"m:1#0"}

    run(scenario())


def test_every_caller_gets_its_own_rows_with_multi_row_requests() -> None:
    async def scenario() -> None:
        model = gated()
        async with serving("max_batch_size: 16 dynamic_batching { }", model) as h:
            blocker = await h.hold(model)
            sizes = [1, 2, 3, 1, 2, 4, 1]
            queued = [h.spawn(tag, rows) for tag, rows in enumerate(sizes, start=1)]
            await until(lambda: h.scheduler.queued() == len(sizes))
            model.open()
            await asyncio.gather(blocker, *queued)  # Harness.call checks each result is its own input
            assert model.sizes == [1, sum(sizes)]
            assert h.statistics.inference_count == 1 + sum(sizes) and h.statistics.execution_count == 2

    run(scenario())


def test_concurrent_callers_on_two_instances_all_get_their_rows() -> None:
    async def scenario() -> None:
        models = (Echo(), Echo())
        async with serving("max_batch_size: 8 dynamic_batching { }", *models) as h:
            rng = np.random.default_rng(7)
            sizes = [int(n) for n in rng.integers(1, 5, 120)]
            await asyncio.gather(*(h.call(tag, rows) for tag, rows in enumerate(sizes, start=1)))
            seen = sorted(tag for m in models for batch in m.batches for tag in set(tags_of(batch)))
            assert seen == list(range(1, len(sizes) + 1))  # each request ran exactly once
            assert all(size <= 8 for m in models for size in m.sizes)
            assert h.statistics.inference_count == sum(sizes)
            assert h.statistics.execution_count == sum(len(m.batches) for m in models)
            assert {t for m in models for t in m.threads} <= {"m:1#0", "m:1#1"}

    run(scenario())


def test_requests_with_different_shapes_dtypes_or_outputs_are_not_batched_together() -> None:
    async def scenario() -> None:
        model = gated()
        async with serving(BATCHING, model) as h:
            blocker = await h.hold(model)
            a = h.spawn(1, width=4)
            b = h.spawn(2, width=5)
            c = h.spawn(3, width=4)
            d = h.spawn(4, width=4, dtype=np.float64)
            e = h.spawn(5, width=5)
            await until(lambda: h.scheduler.queued() == 5)
            model.open()
            await asyncio.gather(blocker, a, b, c, d, e)
            assert [tags_of(batch) for batch in model.batches] == [[0], [1, 3], [2, 5], [4]]
            for batch in model.batches:
                assert len({row.dtype for row in batch.values()}) == 1

    run(scenario())


def test_requests_asking_for_different_outputs_are_not_batched_together() -> None:
    async def scenario() -> None:
        model = gated()
        async with serving(BATCHING, model) as h:
            blocker = await h.hold(model)

            async def call(tag: int, outputs: list[str]) -> None:
                inputs = {"INPUT0": rows_of(tag), "INPUT1": rows_of(tag + 50)}
                result = await h.scheduler.submit(inputs, outputs, 1)
                assert sorted(result) == sorted(outputs)
                for name in outputs:
                    np.testing.assert_array_equal(result[name], inputs[name.replace("OUTPUT", "INPUT")])

            tasks = [asyncio.create_task(call(1, ["OUTPUT0"])), asyncio.create_task(call(2, ["OUTPUT1"])),
                     asyncio.create_task(call(3, ["OUTPUT0"]))]
            await until(lambda: h.scheduler.queued() == 3)
            model.open()
            await asyncio.gather(blocker, *tasks)
            assert model.sizes == [1, 2, 1]
            assert tags_of(model.batches[1]) == [1, 3]

    run(scenario())


def test_max_batch_size_is_never_exceeded() -> None:
    async def scenario() -> None:
        model = gated()
        async with serving("max_batch_size: 4 dynamic_batching { }", model) as h:
            blocker = await h.hold(model)
            sizes = [1, 3, 2, 2, 1, 4, 1, 3]
            queued = [h.spawn(tag, rows) for tag, rows in enumerate(sizes, start=1)]
            await until(lambda: h.scheduler.queued() == len(sizes))
            model.open()
            await asyncio.gather(blocker, *queued)
            assert all(size <= 4 for size in model.sizes), model.sizes
            assert sum(model.sizes) == 1 + sum(sizes)
            assert model.sizes[1] == 4  # the oldest request and the next that fits make a full batch
            assert len(model.batches) < 1 + len(sizes)

    run(scenario())


def test_without_dynamic_batching_requests_run_one_by_one() -> None:
    async def scenario() -> None:
        model = gated()
        async with serving("max_batch_size: 8", model) as h:
            blocker = await h.hold(model)
            queued = await h.queue(1, 2, 3)
            model.open()
            await asyncio.gather(blocker, *queued)
            assert model.sizes == [1, 1, 1, 1]
            assert h.statistics.execution_count == 4

    run(scenario())


def test_preferred_batch_size_is_chosen_when_a_prefix_makes_it() -> None:
    async def scenario() -> None:
        model = gated()
        async with serving("max_batch_size: 8 dynamic_batching { preferred_batch_size: [ 2, 4 ] }", model) as h:
            blocker = await h.hold(model)
            queued = await h.queue(*range(1, 8))
            model.open()
            await asyncio.gather(blocker, *queued)
            # 7 queued: the largest preferred size a prefix makes is 4, then 2 of the 3 left, then the last.
            assert model.sizes == [1, 4, 2, 1]
            assert [tags_of(b) for b in model.batches[1:]] == [[1, 2, 3, 4], [5, 6], [7]]

    run(scenario())


def test_preferred_batch_size_counts_rows_not_requests() -> None:
    async def scenario() -> None:
        model = gated()
        async with serving("max_batch_size: 8 dynamic_batching { preferred_batch_size: 4 }", model) as h:
            blocker = await h.hold(model)
            queued = [h.spawn(1, 3), h.spawn(2, 1), h.spawn(3, 2)]
            await until(lambda: h.scheduler.queued() == 3)
            model.open()
            await asyncio.gather(blocker, *queued)
            assert model.sizes == [1, 4, 2]  # prefix sums 3, 4, 6: 4 is preferred

    run(scenario())


# --------------------------------------------------------------------------- queue delay


def test_max_queue_delay_waits_for_a_full_batch() -> None:
    async def scenario() -> None:
        model = Echo()
        async with serving("max_batch_size: 4 dynamic_batching { max_queue_delay_microseconds: 2000000 }",
                           model) as h:
            started = time.monotonic()
            first = h.spawn(1)
            await asyncio.sleep(0.05)
            assert not first.done() and model.started == 0  # waiting for more requests
            rest = [h.spawn(tag) for tag in (2, 3, 4)]
            await asyncio.gather(first, *rest)
            assert time.monotonic() - started < 1.5  # sent when full, not after the 2 s delay
            assert model.sizes == [4]

    run(scenario())


def test_max_queue_delay_sends_what_it_has_when_the_delay_ends() -> None:
    async def scenario() -> None:
        model = Echo()
        async with serving("max_batch_size: 4 dynamic_batching { max_queue_delay_microseconds: 80000 }",
                           model) as h:
            started = time.monotonic()
            await h.call(1)
            assert time.monotonic() - started >= 0.075
            assert model.sizes == [1]

    run(scenario())


def test_max_queue_delay_stops_at_a_preferred_size() -> None:
    async def scenario() -> None:
        model = Echo()
        config = "max_batch_size: 8 dynamic_batching { preferred_batch_size: 2 max_queue_delay_microseconds: 2000000 }"
        async with serving(config, model) as h:
            started = time.monotonic()
            await asyncio.gather(h.call(1), h.call(2))
            assert time.monotonic() - started < 1.5
            assert model.sizes == [2]

    run(scenario())


def test_without_queue_delay_nothing_waits() -> None:
    async def scenario() -> None:
        model = Echo()
        async with serving("max_batch_size: 8 dynamic_batching { }", model) as h:
            started = time.monotonic()
            await h.call(1)
            first = time.monotonic() - started
            await asyncio.sleep(0.02)
            await h.call(2)
            assert model.sizes == [1, 1]
            assert first < 0.5

    run(scenario())


# --------------------------------------------------------------------------- ordering


async def _two_instances_finishing_out_of_order(preserve: bool) -> None:
    a, b = gated(), gated()
    config = f"max_batch_size: 8 dynamic_batching {{ preserve_ordering: {str(preserve).lower()} }}"
    async with serving(config, a, b) as h:
        settled: list[int] = []
        first = h.spawn(1)
        first.add_done_callback(lambda _: settled.append(1))
        await until(lambda: a.started + b.started == 1)
        holder, other = (a, b) if a.started else (b, a)
        second = h.spawn(2)
        second.add_done_callback(lambda _: settled.append(2))
        await until(lambda: other.started == 1)
        other.open()  # the second request's instance finishes first
        await until(lambda: other.finished == 1)
        if preserve:
            await asyncio.sleep(0.05)  # time for its result to reach the loop
            assert not second.done(), "preserve_ordering settled a later request before an earlier one"
        else:
            await until(second.done)
            assert not first.done()
        holder.open()
        await asyncio.gather(first, second)
        assert settled == ([1, 2] if preserve else [2, 1])


def test_preserve_ordering_settles_responses_in_arrival_order() -> None:
    run(_two_instances_finishing_out_of_order(preserve=True))


def test_without_preserve_ordering_responses_settle_when_ready() -> None:
    run(_two_instances_finishing_out_of_order(preserve=False))


def test_preserve_ordering_skips_cancelled_and_rejected_requests() -> None:
    async def scenario() -> None:
        model = gated()
        config = """max_batch_size: 1
            dynamic_batching { preserve_ordering: true default_queue_policy { max_queue_size: 2 } }"""
        async with serving(config, model) as h:
            blocker = await h.hold(model)
            doomed, kept = await h.queue(1, 2)
            await rejected(h.call(3), ErrorKind.OVERLOADED)  # rejected: takes no place in the order
            doomed.cancel()
            with pytest.raises(asyncio.CancelledError):
                await doomed
            model.open()
            await asyncio.wait_for(asyncio.gather(blocker, kept), 2)  # not stuck behind the cancelled one
            assert [tags_of(b) for b in model.batches] == [[0], [2]]

    run(scenario())


# --------------------------------------------------------------------------- queue policy


def test_full_queue_rejects_at_once_with_overloaded_and_retry_after() -> None:
    async def scenario() -> None:
        model = gated()
        async with serving("max_batch_size: 1 dynamic_batching { default_queue_policy { max_queue_size: 2 } }",
                           model) as h:
            blocker = await h.hold(model)  # running, not queued
            queued = await h.queue(1, 2)
            started = time.monotonic()
            error = await rejected(h.call(3), ErrorKind.OVERLOADED)
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
            await rejected(h.call(2, priority=1), ErrorKind.OVERLOADED)
            low = await h.queue(3, 4, 5)  # level 2 is unbounded
            model.open()
            await asyncio.gather(blocker, *high, *low)

    run(scenario())


def test_default_timeout_expires_a_queued_request_before_it_runs() -> None:
    async def scenario() -> None:
        model = gated()
        config = "max_batch_size: 8 dynamic_batching { default_queue_policy { default_timeout_microseconds: 50000 } }"
        async with serving(config, model) as h:
            blocker = await h.hold(model)
            started = time.monotonic()
            error = await rejected(h.call(1), ErrorKind.TIMEOUT)
            assert 0.045 <= time.monotonic() - started < 1.0
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
        async with serving(config, model) as h:
            blocker = await h.hold(model)
            expired: list[int] = []
            tasks = {tag: h.spawn(tag, timeout_us=timeout) for tag, timeout in
                     ((1, 20_000), (2, 60_000_000), (3, None))}
            for tag, task in tasks.items():
                task.add_done_callback(functools.partial(lambda tag, _: expired.append(tag), tag))
            for task in tasks.values():
                await rejected(task, ErrorKind.TIMEOUT)
            assert expired[0] == 1  # its own 20 ms beat the 150 ms default; 60 s could not extend it
            assert not blocker.done()
            model.open()
            await blocker
            assert model.sizes == [1]

    run(scenario())


def test_request_timeout_is_ignored_without_allow_timeout_override() -> None:
    async def scenario() -> None:
        model = gated()
        async with serving("max_batch_size: 8 dynamic_batching { }", model) as h:
            blocker = await h.hold(model)
            task = h.spawn(1, timeout_us=10_000)
            await asyncio.sleep(0.06)
            assert not task.done()
            model.open()
            await asyncio.gather(blocker, task)

    run(scenario())


def test_request_timeout_alone_expires_with_allow_timeout_override() -> None:
    async def scenario() -> None:
        model = gated()
        config = "max_batch_size: 8 dynamic_batching { default_queue_policy { allow_timeout_override: true } }"
        async with serving(config, model) as h:
            blocker = await h.hold(model)
            await rejected(h.call(1, timeout_us=30_000), ErrorKind.TIMEOUT)
            model.open()
            await blocker
            assert model.sizes == [1]

    run(scenario())


def test_timeout_action_delay_runs_an_expired_request_after_the_others() -> None:
    async def scenario() -> None:
        model = gated()
        config = """max_batch_size: 1 dynamic_batching { default_queue_policy {
            timeout_action: DELAY allow_timeout_override: true } }"""
        async with serving(config, model) as h:
            blocker = await h.hold(model)
            late = h.spawn(1, timeout_us=20_000)
            await asyncio.sleep(0.06)  # request 1 is past its timeout
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
        async with serving(config, model) as h:
            blocker = await h.hold(model)
            late = h.spawn(1, priority=1, timeout_us=20_000)
            await asyncio.sleep(0.06)  # request 1 (level 1) is past its timeout: delayed
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
        async with serving(config, model) as h:
            blocker = await h.hold(model)
            late = h.spawn(1, timeout_us=20_000)
            await asyncio.sleep(0.06)  # delayed, still queued
            assert h.scheduler.queued() == 1
            try:
                await rejected(asyncio.wait_for(h.call(2), 0.3), ErrorKind.OVERLOADED)
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
            error = await rejected(h.call(1, priority=3), ErrorKind.INVALID_INPUT)
            assert "priority" in error.message
            await h.call(2, priority=2)
            await h.call(3, priority=0)  # 0: the default level
        async with serving("max_batch_size: 8 dynamic_batching { }", Echo()) as h:
            await rejected(h.call(1, priority=2), ErrorKind.INVALID_INPUT)
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
            first = await h.hold(a)
            second = h.spawn(1)
            await until(lambda: b.started == 1)
            queued = await h.queue(2, 3, 4, 5, 6)
            stopping = asyncio.create_task(h.scheduler.stop())
            await asyncio.sleep(0.01)
            error = await rejected(h.call(7), ErrorKind.UNAVAILABLE)
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


# --------------------------------------------------------------------------- policy from config


def test_policy_from_config_reads_dynamic_batching() -> None:
    policy = policy_of("""
        max_batch_size: 16
        dynamic_batching {
          preferred_batch_size: [ 4, 8, 4 ]
          max_queue_delay_microseconds: 1500
          preserve_ordering: true
          priority_levels: 3
          default_priority_level: 2
          default_queue_policy { max_queue_size: 5 default_timeout_microseconds: 250000 }
          priority_queue_policy { key: 1 value: { timeout_action: DELAY allow_timeout_override: true } }
        }""")
    assert policy.batching and policy.max_batch_size == 16
    assert policy.preferred_batch_sizes == (8, 4)
    assert policy.max_queue_delay_s == pytest.approx(0.0015)
    assert policy.preserve_ordering
    assert policy.default_level == 1
    assert policy.levels == (
        LevelPolicy(allow_timeout_override=True, delay_on_timeout=True),
        LevelPolicy(max_queue_size=5, default_timeout_s=0.25),
        LevelPolicy(max_queue_size=5, default_timeout_s=0.25),
    )


def test_policy_without_dynamic_batching_does_not_batch() -> None:
    policy = policy_of("max_batch_size: 8")
    assert not policy.batching and len(policy.levels) == 1


@pytest.mark.parametrize("config, match", [
    ("max_batch_size: 8 dynamic_batching { priority_levels: 2 default_priority_level: 3 }",
     "default_priority_level"),
    ("max_batch_size: 8 dynamic_batching { priority_levels: 2 }", "default_priority_level"),
    ("max_batch_size: 8 dynamic_batching { preferred_batch_size: [ 4, 16 ] }", "preferred_batch_size 16"),
    ("max_batch_size: 8 dynamic_batching { preferred_batch_size: 0 }", "preferred_batch_size 0"),
    ("max_batch_size: 8 dynamic_batching { priority_levels: 2 default_priority_level: 1 "
     "priority_queue_policy { key: 3 value: { max_queue_size: 1 } } }", "priority_queue_policy level 3"),
])
def test_policy_from_config_rejects_bad_configs(config: str, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        policy_of(config)


def test_default_priority_level_without_priority_levels_does_not_break_requests() -> None:
    """Triton checks default_priority_level only when priority_levels is set, and otherwise ignores it.
    Either it is ignored here too, or the config is rejected at load: never an error on every request."""
    config = "max_batch_size: 8 dynamic_batching { default_priority_level: 2 }"
    try:
        policy = policy_of(config)
    except ConfigError:
        return
    assert 0 <= policy.default_level < len(policy.levels), policy

    async def scenario() -> None:
        async with serving(config, Echo()) as h:
            await h.call(1)

    run(scenario())


# --------------------------------------------------------------------------- execution on the event loop

LOOP = on_loop_within(50_000)  # generous: a loaded CI machine must not push the fakes over budget
MAIN = threading.main_thread().name


def _threads_after_warmup(config: str, model: Echo, calls: int = 6) -> list[str]:
    """Run `calls` requests one after another; return the thread each ran on."""
    async def scenario() -> None:
        async with serving(config, model) as h:
            for tag in range(calls):
                await h.call(tag)

    run(scenario())
    return model.threads


def test_a_fast_model_runs_on_the_loop_once_measured() -> None:
    threads = _threads_after_warmup("max_batch_size: 8 " + LOOP, Echo())
    assert threads[0] == "m:1#0"  # not measured yet: its instance thread
    assert set(threads[1:]) == {MAIN}


def test_a_fast_model_with_dynamic_batching_runs_on_the_loop_too() -> None:
    threads = _threads_after_warmup("max_batch_size: 8 dynamic_batching { } " + LOOP, Echo())
    assert set(threads[1:]) == {MAIN}


def test_a_slow_model_never_runs_on_the_loop() -> None:
    threads = _threads_after_warmup("max_batch_size: 8 " + on_loop_within(200), Slow(seconds=0.002))
    assert set(threads) == {"m:1#0"}


def test_the_loop_is_on_by_default_with_a_20_microsecond_budget() -> None:
    assert policy_of("max_batch_size: 8").inline_max_ns == 20_000
    assert policy_of("max_batch_size: 8 " + THREADS_ONLY).inline_max_ns == 0
    assert set(_threads_after_warmup("max_batch_size: 8 " + THREADS_ONLY, Echo())) == {"m:1#0"}


def test_a_batching_delay_is_never_bypassed_on_the_loop() -> None:
    config = "max_batch_size: 8 dynamic_batching { max_queue_delay_microseconds: 100 } " + LOOP
    assert set(_threads_after_warmup(config, Echo())) == {"m:1#0"}


def test_requests_larger_than_the_learned_rows_run_on_threads() -> None:
    async def scenario() -> None:
        model = Echo()
        async with serving("max_batch_size: 64 " + LOOP, model) as h:
            await h.call(0)  # thread, measured: 1 row fits, so the loop may take up to 2
            await h.call(1, rows=2)  # loop: now up to 4
            await h.call(2, rows=9)
        assert model.threads == ["m:1#0", MAIN, "m:1#0"]

    run(scenario())


def test_loop_runs_are_counted_in_statistics() -> None:
    async def scenario() -> None:
        async with serving("max_batch_size: 8 " + LOOP, Echo()) as h:
            for tag in range(5):
                await h.call(tag, rows=2)
            assert h.statistics.execution_count == 5
            assert h.statistics.inference_count == 10

    run(scenario())


def test_a_busy_server_batches_on_threads_instead() -> None:
    """With more than LOOP_MAX_IN_PROGRESS requests in progress, even a cheap model's requests queue
    for its threads, where they batch; a quiet server brings them back to the loop."""
    async def scenario() -> None:
        model = Echo()
        async with serving("max_batch_size: 64 dynamic_batching { } " + LOOP, model) as h:
            await h.call(0)
            await h.call(1)
            h.in_flight.requests = LOOP_MAX_IN_PROGRESS + 1
            await asyncio.gather(*(h.call(tag) for tag in range(2, 34)))
            assert set(model.threads[2:]) == {"m:1#0"}
            assert len(model.batches) < 2 + 32  # they batched
            h.in_flight.requests = LOOP_MAX_IN_PROGRESS
            await h.call(34)
        assert model.threads[:2] == ["m:1#0", MAIN] and model.threads[-1] == MAIN

    run(scenario())


class FailsOnThirteen(Echo):
    def infer(self, inputs: dict[str, np.ndarray], outputs: Any) -> dict[str, np.ndarray]:
        if 13 in tags_of(inputs):
            raise RuntimeError("boom")
        return super().infer(inputs, outputs)


def test_a_failure_on_the_loop_reaches_only_its_request() -> None:
    async def scenario() -> None:
        model = FailsOnThirteen()
        async with serving("max_batch_size: 8 " + LOOP, model) as h:
            await h.call(1)
            await h.call(2)
            with pytest.raises(RuntimeError, match="boom"):
                await h.call(13)
            await h.call(3)
        assert model.threads == ["m:1#0", MAIN, MAIN]

    run(scenario())
