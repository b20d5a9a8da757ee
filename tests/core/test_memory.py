"""PeakMeter and CacheMemory: what a block of code held at its peak and kept, as the multi-model cache charges
loads."""

from __future__ import annotations

import asyncio
import gc
import threading
import time

import pytest

from modelhost.core.cache_memory import CacheMemory
from modelhost.core.memory import COUNTS_FREES, PeakMeter

SIZE = 64 * 1024 * 1024

needs_malloc_counts = pytest.mark.skipif(not COUNTS_FREES, reason="needs glibc's mallinfo2 (freed memory counted)")


@pytest.fixture(autouse=True)
def _no_collection_meanwhile() -> object:
    """A reading counts the whole process: garbage of earlier tests collected during a test would show as its own
    memory going down. Collected before, and not during."""
    gc.collect()
    gc.disable()
    yield
    gc.enable()


@needs_malloc_counts
def test_a_freed_spike_shows_in_the_peak_and_not_in_the_growth() -> None:
    with PeakMeter() as meter:
        spike = bytearray(SIZE)
        time.sleep(0.05)  # many sampling intervals
        del spike
    assert meter.peak_growth >= SIZE
    assert meter.growth < SIZE // 4


@needs_malloc_counts
def test_meters_open_at_once_each_see_the_spike_and_share_one_thread() -> None:
    def samplers() -> int:
        return sum(thread.name == "modelhost-peak-meter" for thread in threading.enumerate())

    with PeakMeter() as outer:
        with PeakMeter() as inner:
            assert samplers() == 1  # one thread samples for every open meter
            kept = bytearray(SIZE)
            time.sleep(0.05)
    assert outer.peak_growth >= SIZE and inner.peak_growth >= SIZE
    assert outer.growth >= SIZE
    del kept
    with PeakMeter() as after:  # a closed meter is no longer sampled; a new one starts from now
        time.sleep(0.01)
    assert after.peak_growth < SIZE // 4


_HELD_DURING_WARM_UPS: list[bytearray] = []


@needs_malloc_counts
def test_only_a_warm_up_that_warmed_something_moves_the_baseline() -> None:
    """What the process allocates while a backend that is warm already is checked (requests in flight) is not
    the framework's: counting it into the baseline would let the cache hold more than its budget."""
    async def scenario() -> None:
        memory = CacheMemory()
        async with memory.measuring("m", 0):
            pass
        before = memory.used_bytes

        def busy_process(warmed: bool) -> bool:
            _HELD_DURING_WARM_UPS.append(bytearray(4 << 20))
            return warmed

        await memory.warm_up(lambda: busy_process(False))
        assert memory.used_bytes >= before + (4 << 20)  # charged: nothing was warmed up
        held = memory.used_bytes
        await memory.warm_up(lambda: busy_process(True))
        assert memory.used_bytes < held + (1 << 20)  # a framework's state joins the baseline
        memory.release()

    try:
        asyncio.run(scenario())
    finally:
        _HELD_DURING_WARM_UPS.clear()
