"""The request queue's batches (core/request_queue.py): the first queued requests that fit, in queue order, those of
another batch key, another instance or too many rows passed over; no more rows than the largest preferred size and
cut at the largest reached; run at once, not after the queue delay, when full, preferred, or once a request of this
instance's could not join (Triton's rules).
Checked against a pass over the whole queue on random queues, and the queue's shortcut (it stops looking once no
queued request could fit the room left) shown to take the same batches."""

from __future__ import annotations

import asyncio
import random

import pytest

from modelhost.config.pbtxt import parse_config
from modelhost.core.policy import SchedulingPolicy
from modelhost.core.request_queue import Pending, RequestQueue

CONFIG = """
name: "q"
max_batch_size: %d
input [ { name: "x" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "y" data_type: TYPE_FP32 dims: [ 4 ] } ]
dynamic_batching { %s max_queue_delay_microseconds: 0 }
"""


def reference_batch(queued: list[Pending], instance: int, max_batch_size: int,
                    preferred: tuple[int, ...]) -> tuple[list[Pending], bool]:
    """(batch, whether it runs now)."""
    head = next(p for p in queued if p.instance in (-1, instance))
    max_rows = max(min([max_batch_size, *preferred[:1]]), head.rows)  # preferred sizes: no more than the largest
    batch: list[Pending] = []
    sizes: list[int] = []
    rows = 0
    blocked = False
    for pending in queued:
        if pending.instance not in (-1, instance):
            continue
        if pending.key != head.key or rows + pending.rows > max_rows:
            blocked = True
            continue
        batch.append(pending)
        rows += pending.rows
        sizes.append(rows)
        if rows == max_rows:
            break
    for size in preferred:  # descending
        if size in sizes:
            return batch[: sizes.index(size) + 1], True
    return batch, blocked or rows == max_rows


@pytest.mark.parametrize("seed", range(8))
def test_batches_are_those_a_pass_over_the_whole_queue_takes(seed: int) -> None:
    rng = random.Random(seed)
    max_batch_size = rng.choice((8, 64, 1024))
    preferred = sorted(rng.sample(range(1, max_batch_size + 1), rng.choice((0, 1, 2))), reverse=True)
    settings = f"preferred_batch_size: [ {', '.join(map(str, preferred))} ]" if preferred else ""
    policy = SchedulingPolicy.from_config(parse_config(CONFIG % (max_batch_size, settings)))
    queue = RequestQueue(policy)
    loop = asyncio.new_event_loop()
    queued: list[Pending] = []
    pinned = seed % 2 == 1  # half the runs with requests pinned to one of two instances (sequences)
    try:
        for _ in range(400):
            for _ in range(rng.randint(0, 12)):
                rows = rng.choice((1, rng.randint(1, max_batch_size), max_batch_size // 2, max_batch_size + 3))
                pending = Pending({}, ("y",), rows, rng.choice(("a", "a", "a", "b")), 0, loop.create_future(),
                                  instance=rng.choice((-1, 0, 1)) if pinned else -1)
                queue.put(pending, "q")
                queued.append(pending)
            takers = [i for i in ((0, 1) if pinned else (-1,)) if any(p.instance in (-1, i) for p in queued)]
            if not takers:
                continue
            instance = rng.choice(takers)
            expected, now = reference_batch(queued, instance, max_batch_size, tuple(preferred))
            head = next(p for p in queued if p.instance in (-1, instance))
            assert queue._form(head, instance) == (expected, now)
            assert queue.take(instance) == expected
            queued = [p for p in queued if all(p is not taken for taken in expected)]
            assert queue.rows == sum(p.rows for p in queued)
    finally:
        loop.close()


def test_a_full_room_stops_the_look_down_a_deep_queue() -> None:
    """Two 500-row requests fill 1,000 of 1,024 rows; with a thousand more of 500 behind them, forming the batch
    looks at the third, sees that nothing queued is as small as the 24 rows left, and stops."""
    policy = SchedulingPolicy.from_config(parse_config(CONFIG % (1024, "")))
    queue = RequestQueue(policy)
    loop = asyncio.new_event_loop()
    looked_at = 0

    class Counted(str):
        def __ne__(self, other: object) -> bool:
            nonlocal looked_at
            looked_at += 1
            return str.__ne__(self, other)

    try:
        for _ in range(1_002):
            queue.put(Pending({}, ("y",), 500, Counted("k"), 0, loop.create_future()), "q")
        assert [p.rows for p in queue.take()] == [500, 500]
        assert looked_at == 3
    finally:
        loop.close()


def test_a_request_that_cannot_join_sends_the_batch_before_its_delay() -> None:
    """Triton's batcher (qa/L0_optional_input, L0_batcher test_multi_batch_different_shape): with a delay that never
    ends, a batch waits for more rows until a queued request could not join it (another key, too many rows), then
    runs at once with the requests that can, further down included; a request only another instance may run does
    not count."""
    policy = SchedulingPolicy.from_config(parse_config(CONFIG.replace("max_queue_delay_microseconds: 0",
                                                                      "max_queue_delay_microseconds: 9000000000")
                                                       % (8, "")))
    queue = RequestQueue(policy)
    loop = asyncio.new_event_loop()

    def put(rows: int, key: str, instance: int = -1) -> Pending:
        pending = Pending({}, ("y",), rows, key, 0, loop.create_future(), instance=instance)
        queue.put(pending, "q")
        return pending

    try:
        a1, a2 = put(1, "a"), put(2, "a")
        assert queue._form(a1, -1) == ([a1, a2], False)  # waits for more
        put(1, "b", instance=1)
        assert queue._form(a1, 0) == ([a1, a2], False)  # instance 1's own request does not stop instance 0's batch
        b = put(1, "b")
        a3 = put(3, "a")
        assert queue.take() == [a1, a2, a3]  # b cannot join: run now, with a3 from behind it
        put(8, "b")
        assert queue._form(b, 0) == ([b], True)  # 1 + 8 rows > 8: b runs now
    finally:
        loop.close()


def test_preferred_sizes_cap_a_batch_until_its_delay_expires() -> None:
    """Triton's batcher (qa/L0_batcher test_static_batch_gt_max_preferred, test_multi_batch_sum_gt_max_preferred):
    with preferred sizes [2, 6] of 8, a batch holds at most 6 rows and runs at once when the next request would take
    it past them, or when one request alone has them; once the delay has expired it takes up to 8."""
    policy = SchedulingPolicy.from_config(parse_config(CONFIG.replace("max_queue_delay_microseconds: 0",
                                                                      "max_queue_delay_microseconds: 9000000000")
                                                       % (8, "preferred_batch_size: [ 2, 6 ]")))
    queue = RequestQueue(policy)
    loop = asyncio.new_event_loop()

    def put(rows: int) -> Pending:
        pending = Pending({}, ("y",), rows, "a", 0, loop.create_future())
        queue.put(pending, "q")
        return pending

    try:
        three = put(3)
        assert queue._form(three, -1) == ([three], False)
        four = put(4)
        assert queue._form(three, -1) == ([three], True)  # 3 + 4 > 6
        assert queue._form(three, -1, expired=True) == ([three, four], False)  # up to 8 once the delay is out
        assert queue.take() == [three]
        assert queue._form(four, -1) == ([four], False)  # 4 < 6: waits
        seven = put(7)
        assert queue.take() == [four]
        assert queue._form(seven, -1) == ([seven], True)  # 7 alone is past the largest preferred size
    finally:
        loop.close()
