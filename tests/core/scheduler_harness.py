"""The scheduler tests' harness: a Scheduler over fake models (tests/fakes.py) with policies parsed from real
config.pbtxt text, driven on an asyncio loop; a gated instance holds the model busy so that requests queue
deterministically, and every wait is bounded.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator
from typing import Any

import numpy as np

from modelhost.config.pbtxt import parse_config
from modelhost.core.clock import MONOTONIC, Clock
from modelhost.core.in_flight import InFlight
from modelhost.core.latency_target import LatencyTarget
from modelhost.core.policy import SchedulingPolicy
from modelhost.core.scheduler import Scheduler
from modelhost.core.statistics import ModelStatistics
from tests.fakes import Echo, Slow
from tests.helpers import until

WIDTH = 4


def policy_of(text: str) -> SchedulingPolicy:
    return SchedulingPolicy.from_config(parse_config(text))


def on_loop_within(microseconds: int) -> str:
    return f'parameters {{ key: "inline_max_microseconds" value: {{ string_value: "{microseconds}" }} }}'


THREADS_ONLY = on_loop_within(0)


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

    def __init__(self, config: str, instances: tuple[Echo, ...], clock: Clock = MONOTONIC) -> None:
        self.instances = instances
        self.statistics = ModelStatistics()
        self.in_flight = InFlight()
        if "inline_max_microseconds" not in config:
            config += " " + THREADS_ONLY
        parsed = parse_config(config)
        target = LatencyTarget.from_config(parsed, len(instances), clock)
        self.scheduler = Scheduler("m:1", instances, SchedulingPolicy.from_config(parsed), self.statistics,
                                   self.in_flight, clock, target=target)

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
async def serving(config: str, *instances: Echo, clock: Clock = MONOTONIC) -> AsyncIterator[Harness]:
    harness = Harness(config, instances, clock)
    try:
        yield harness
    finally:
        for instance in instances:
            if isinstance(instance, Slow):
                instance.open()
        await asyncio.wait_for(harness.scheduler.stop(), 5)


def gated() -> Slow:
    return Slow(gate=threading.Event())


BATCHING = "max_batch_size: 8 dynamic_batching { }"
