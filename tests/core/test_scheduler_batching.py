"""Scheduler: how batches form (shapes, outputs, sizes, preferred sizes), the queue delay and response ordering."""

from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest

from modelhost.config.pbtxt import ConfigError
from modelhost.errors import ErrorKind
from tests.core.scheduler_harness import (
    BATCHING,
    gated,
    policy_of,
    rows_of,
    serving,
    tags_of,
)
from tests.fakes import Echo, ManualClock
from tests.helpers import rejected_async, run, until

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


def test_requests_asking_for_different_outputs_batch_together_and_the_model_computes_them_all() -> None:
    """As Triton's batcher (qa/L0_batcher test_multi_different_outputs, _output_order): the outputs asked for do not
    split a batch; the model is asked for every output any of its requests wants, in first-asked order."""
    async def scenario() -> None:
        model = gated()
        async with serving(BATCHING, model) as h:
            blocker = await h.hold(model)

            async def call(tag: int, outputs: list[str]) -> None:
                inputs = {"INPUT0": rows_of(tag), "INPUT1": rows_of(tag + 50)}
                result = await h.scheduler.submit(inputs, outputs, 1)
                for name in outputs:
                    np.testing.assert_array_equal(result[name], inputs[name.replace("OUTPUT", "INPUT")])

            tasks = [asyncio.create_task(call(1, ["OUTPUT0"])), asyncio.create_task(call(2, ["OUTPUT1"])),
                     asyncio.create_task(call(3, ["OUTPUT1", "OUTPUT0"]))]
            await until(lambda: h.scheduler.queued() == 3)
            model.open()
            await asyncio.gather(blocker, *tasks)
            assert model.sizes == [1, 3]
            assert tags_of(model.batches[1]) == [1, 2, 3]
            assert model.asked[1] == ["OUTPUT0", "OUTPUT1"]

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


PADDED = ('max_batch_size: 8 dynamic_batching { preferred_batch_size: [ 2, 4, 8 ] } '
          'parameters { key: "pad_to_preferred_batch_size" value: { string_value: "true" } }')


def test_batches_are_padded_up_to_the_next_allowed_size_and_the_padding_dropped() -> None:
    async def scenario() -> None:
        model = gated()
        async with serving(PADDED, model) as h:
            blocker = await h.hold(model)
            queued = await h.queue(1, 2, 3)
            model.open()
            await asyncio.gather(blocker, *queued)
            await h.call(9, rows=5)  # `call` checks each caller gets exactly its own rows back
            # Batches form up to max_batch_size as usual, then pad: the blocker's 1 row to 2, the 3 queued rows
            # to 4 with a copy of the last row, the 5-row request to 8.
            assert model.sizes[:2] == [2, 4]
            assert tags_of(model.batches[1]) == [1, 2, 3, 3]
            assert model.sizes[2] == 8
            assert h.statistics.inference_count == 9  # real rows only

    run(scenario())


@pytest.mark.parametrize("config, message", [
    ('max_batch_size: 8 dynamic_batching { preferred_batch_size: [ 2, 4 ] } '
     'parameters { key: "pad_to_preferred_batch_size" value: { string_value: "true" } }', "whose largest is"),
    ('max_batch_size: 8 dynamic_batching { } '
     'parameters { key: "pad_to_preferred_batch_size" value: { string_value: "yes" } }', "must be true or false"),
])
def test_padding_needs_preferred_sizes_up_to_max_batch_size(config: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        policy_of(config)


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
        clock = ManualClock()  # never moved: the 2 s delay never ends
        async with serving("max_batch_size: 4 dynamic_batching { max_queue_delay_microseconds: 2000000 }",
                           model, clock=clock) as h:
            first = h.spawn(1)
            await asyncio.sleep(0.05)
            assert not first.done() and model.started == 0  # waiting for more requests
            rest = [h.spawn(tag) for tag in (2, 3, 4)]
            await asyncio.gather(first, *rest)  # sent when full
            assert model.sizes == [4]

    run(scenario())


def test_max_queue_delay_sends_what_it_has_when_the_delay_ends() -> None:
    async def scenario() -> None:
        model = Echo()
        clock = ManualClock()
        async with serving("max_batch_size: 4 dynamic_batching { max_queue_delay_microseconds: 80000 }",
                           model, clock=clock) as h:
            call = await h.queue(1)
            clock.advance(0.079)
            await asyncio.sleep(0.05)
            assert model.started == 0  # 1 ms of the delay left
            clock.advance(0.001)
            await asyncio.gather(*call)
            assert model.sizes == [1]

    run(scenario())


def test_max_queue_delay_stops_at_a_preferred_size() -> None:
    async def scenario() -> None:
        model = Echo()
        config = "max_batch_size: 8 dynamic_batching { preferred_batch_size: 2 max_queue_delay_microseconds: 2000000 }"
        async with serving(config, model, clock=ManualClock()) as h:  # the 2 s delay never ends
            await asyncio.gather(h.call(1), h.call(2))
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
            await rejected_async(h.call(3), ErrorKind.OVERLOADED)  # rejected: takes no place in the order
            doomed.cancel()
            with pytest.raises(asyncio.CancelledError):
                await doomed
            model.open()
            await asyncio.wait_for(asyncio.gather(blocker, kept), 2)  # not stuck behind the cancelled one
            assert [tags_of(b) for b in model.batches] == [[0], [2]]

    run(scenario())
