"""A model's p99 latency target: the service-time line, admission, lateness, batch size and delay under
feedback, and the scheduler acting on them."""

from __future__ import annotations

import asyncio
import threading

import pytest

from modelhost.config.pbtxt import ConfigError, parse_config
from modelhost.core.latency_target import ADJUST_EVERY_S, LatencyTarget, ServiceTimes
from modelhost.errors import ErrorKind, ModelhostError
from tests.core.scheduler_harness import serving, tags_of
from tests.fakes import ManualClock, Slow
from tests.helpers import rejected_async, run, until


def target_config(target_ms: float, extra: str = "", batch: int = 8) -> str:
    return (f'max_batch_size: {batch} {extra} '
            f'parameters {{ key: "target_p99_ms" value: {{ string_value: "{target_ms:g}" }} }}')


def test_service_times_fit_a_line() -> None:
    times = ServiceTimes()
    for rows in range(1, 65):
        times.add(rows, 0.001 + 0.0001 * rows)
    assert times.estimate(100) == pytest.approx(0.011, rel=1e-6)
    assert times.largest_within(0.005, 1024) == 40
    assert times.largest_within(1.0, 1024) == 1024


def test_one_batch_size_seen_scales_up_not_down() -> None:
    times = ServiceTimes()
    assert times.estimate(10) == 0.0 and not times.known
    for _ in range(5):
        times.add(10, 0.010)
    assert times.estimate(5) == pytest.approx(0.010)
    assert times.estimate(20) == pytest.approx(0.020)


def learned(target: LatencyTarget, rows: int, seconds: float, times: int = 10) -> LatencyTarget:
    for _ in range(times):
        target.executed(rows, seconds)
    return target


def test_admission_refuses_what_the_queue_ahead_would_make_late() -> None:
    target = learned(LatencyTarget(0.050, 8, 0.0, instances=1), 8, 0.010)
    assert target.admission(8, queued_rows=0, busy_instances=1) is None  # nothing ahead: always
    assert target.admission(1, queued_rows=8, busy_instances=1) is None  # 2 batches + half the running one
    miss = target.admission(1, queued_rows=40, busy_instances=1)  # 6 batches (60 ms) + 5 ms
    assert miss == pytest.approx(0.015) and target.refused == 1
    two = learned(LatencyTarget(0.050, 8, 0.0, instances=2), 8, 0.010)
    assert two.admission(1, queued_rows=40, busy_instances=0) is None  # two instances share the batches


def test_time_the_server_already_had_a_request_counts() -> None:
    target = learned(LatencyTarget(0.050, 8, 0.0, instances=1), 8, 0.010)
    assert target.admission(1, queued_rows=8, busy_instances=1) is None  # 25 ms
    assert target.admission(1, queued_rows=8, busy_instances=1, spent_s=0.030) == pytest.approx(0.005)
    assert target.late_after(spent_s=0.020) == pytest.approx(0.020)  # 50 - 20 - its 10 ms execution


def test_late_after_leaves_room_for_the_execution() -> None:
    target = learned(LatencyTarget(0.100, 8, 0.0, instances=1), 8, 0.030)
    assert target.late_after() == pytest.approx(0.070)
    slow = learned(LatencyTarget(0.100, 8, 0.0, instances=1), 8, 0.200)
    assert slow.late_after() == pytest.approx(0.010)  # never less than a tenth of the target


def rounds(target: LatencyTarget, clock: ManualClock, latency_s: float, count: int = 1) -> None:
    """`count` adjustments, each after 30 requests of `latency_s`."""
    for _ in range(count):
        for _ in range(30):
            target.completed(latency_s)
        clock.advance(ADJUST_EVERY_S)
        target.completed(latency_s)


def test_batches_shrink_when_p99_passes_the_target_and_grow_back() -> None:
    clock = ManualClock()
    target = LatencyTarget(0.050, 64, 0.0, instances=1, clock=clock)
    for rows in (1, 16, 64):
        learned(target, rows, 0.001 * rows)
    rounds(target, clock, 0.080)
    assert target.observed_p99_s == pytest.approx(0.080)
    assert target.limits.max_batch_size == 20  # 40 % of 50 ms at 1 ms a row
    rounds(target, clock, 0.010, count=3)
    assert target.limits.max_batch_size == 27  # 55 % of 50 ms


def test_the_queue_delay_halves_over_the_target_and_returns_to_the_configs() -> None:
    clock = ManualClock()
    target = learned(LatencyTarget(0.050, 16, 0.004, instances=1, clock=clock), 16, 0.008)
    rounds(target, clock, 0.080)
    assert target.limits.max_queue_delay_s == pytest.approx(0.002)
    rounds(target, clock, 0.010, count=3)
    assert target.limits.max_queue_delay_s == pytest.approx(0.004)  # the config's, never above
    slow = learned(LatencyTarget(0.050, 16, 0.004, instances=1, clock=clock), 16, 0.030)
    rounds(slow, clock, 0.010)
    assert slow.limits.max_queue_delay_s == 0.0  # a batch ahead and its own take all of the target


def test_a_busy_windows_p99_is_of_all_of_it() -> None:
    clock = ManualClock()
    target = LatencyTarget(0.050, 64, 0.0, instances=1, clock=clock)
    for _ in range(20_000):  # more than the window keeps: its later half is slow
        target.completed(0.001)
    for _ in range(20_000):
        target.completed(0.100)
    clock.advance(ADJUST_EVERY_S)
    target.completed(0.100)
    assert target.observed_p99_s == pytest.approx(0.100)


def test_a_frozen_target_keeps_the_configs_batch_size_and_delay() -> None:
    clock = ManualClock()
    target = learned(LatencyTarget(0.050, 64, 0.004, instances=1, adapt=False, clock=clock), 64, 0.064)
    rounds(target, clock, 0.200)
    assert target.observed_p99_s == pytest.approx(0.200)
    assert (target.limits.max_batch_size, target.limits.max_queue_delay_s) == (64, 0.004)


@pytest.mark.parametrize(("parameters", "message"), [
    ('key: "target_p99_ms" value: { string_value: "fast" }', "milliseconds above 0"),
    ('key: "target_p99_ms" value: { string_value: "-5" }', "milliseconds above 0"),
    ('key: "target_p99_ms" value: { string_value: "50" } } parameters { key: "target_p99_adapt" '
     'value: { string_value: "maybe" }', "true or false"),
])
def test_bad_target_parameters(parameters: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        LatencyTarget.from_config(parse_config(f"max_batch_size: 8 parameters {{ {parameters} }}"), 1)


def test_no_target_without_the_parameter() -> None:
    assert LatencyTarget.from_config(parse_config("max_batch_size: 8"), 1) is None


# --------------------------------------------------------------------------- in the scheduler


def test_a_request_that_would_finish_late_is_refused_on_arrival() -> None:
    async def scenario() -> None:
        model = Slow(seconds=0.03, gate=threading.Event())
        model.open()
        # The scheduler's clock stands still: queued requests never grow late while the test holds the model.
        async with serving(target_config(100, batch=1), model, clock=ManualClock()) as h:
            await h.call(0)  # the target learns: 30 ms an execution
            model.gate.clear()  # type: ignore[union-attr]
            blocker = await h.hold(model, tag=1)
            queued = await h.queue(2, 3)  # the last with one ahead: 2 x 30 + 15 ms, in time
            with pytest.raises(ModelhostError) as before_reading:  # what a front-end asks before reading a body
                h.scheduler.check_room()
            assert before_reading.value.kind == ErrorKind.OVERLOADED
            error = await rejected_async(h.call(4), ErrorKind.OVERLOADED)  # 3 x 30 + 15 ms: late
            assert "p99 target of 100 ms" in error.message and error.retry_after is not None
            assert h.scheduler.target is not None and h.scheduler.target.refused == 2
            model.open()
            await asyncio.gather(blocker, *queued)
            assert [tags_of(b) for b in model.batches] == [[0], [1], [2], [3]]  # 4 never ran

    run(scenario())


def test_a_request_received_long_ago_is_refused_sooner() -> None:
    async def scenario() -> None:
        model = Slow(seconds=0.03, gate=threading.Event())
        model.open()
        async with serving(target_config(100, batch=1), model, clock=ManualClock()) as h:
            await h.call(0)
            model.gate.clear()  # type: ignore[union-attr]
            blocker = await h.hold(model, tag=1)
            queued = await h.queue(2)  # one ahead of the next: 2 x 30 + 15 ms, in time when just received
            error = await rejected_async(h.call(3, spent_s=0.030), ErrorKind.OVERLOADED)  # 30 ms more: late
            assert "p99 target of 100 ms" in error.message
            model.open()
            await asyncio.gather(blocker, *queued)

    run(scenario())


def test_a_queued_request_that_can_no_longer_make_it_is_refused_not_run() -> None:
    async def scenario() -> None:
        model = Slow(seconds=0.03, gate=threading.Event())
        model.open()
        clock = ManualClock()
        async with serving(target_config(100, batch=1), model, clock=clock) as h:
            await h.call(0)
            model.gate.clear()  # type: ignore[union-attr]
            blocker = await h.hold(model, tag=1)
            late = h.spawn(2)
            await until(lambda: h.scheduler.queued() == 1)
            assert h.scheduler.target is not None
            wait = h.scheduler.target.late_after()  # 100 ms less its execution (30 ms, as measured here)
            assert 0.05 < wait <= 0.070
            clock.advance(wait - 0.001)
            await asyncio.sleep(0.01)
            assert not late.done()
            clock.advance(0.002)
            error = await rejected_async(late, ErrorKind.OVERLOADED)
            assert "too long for it to be answered within" in error.message
            model.open()
            await blocker
            assert [tags_of(b) for b in model.batches] == [[0], [1]]

    run(scenario())


def test_batches_form_at_the_targets_size_and_a_larger_request_runs_alone() -> None:
    async def scenario() -> None:
        model = Slow(gate=threading.Event())
        async with serving(target_config(10_000), model) as h:
            assert h.scheduler.target is not None
            h.scheduler.target.limits.max_batch_size = 2
            blocker = await h.hold(model)
            queued = await h.queue(1, 2, 3)
            big = h.spawn(4, rows=4)
            await until(lambda: h.scheduler.queued() == 4)
            model.open()
            await asyncio.gather(blocker, *queued, big)
            assert model.sizes == [1, 2, 1, 4]

    run(scenario())
