"""PeakMeter and CacheMemory: what a block of code held at its peak and kept, as the multi-model cache charges
loads."""

from __future__ import annotations

import gc
import threading
import time

import pytest

from modelhost.core.cache_memory import MEASURED_LOADS, CacheMemory
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


_KEPT: list[bytearray] = []


@pytest.fixture
def kept() -> object:
    yield _KEPT
    _KEPT.clear()


@needs_malloc_counts
def test_a_key_measured_alone_to_its_first_use_is_charged_that_and_not_measured_again(kept: list[bytearray]) -> None:
    memory = CacheMemory()
    measurement = memory.start("k", 1000)
    assert measurement is not None
    kept.append(bytearray(4 << 20))  # what the load holds
    memory.ended(measurement)
    kept.append(bytearray(2 << 20))  # what its first request allocates (a session's arena) counts too
    size = memory.finish(measurement, first_use=True)
    assert (6 << 20) <= size < (7 << 20)
    assert memory.known_size("k", 1000) == size and memory.estimate("k", 1000) >= size
    assert memory.start("k", 1000) is None  # known: no reading
    memory.ended(None)
    assert memory.known_size("k", 2000) is None  # its files changed size: measured again
    assert memory.used == 0  # charges are the cache's to keep


@needs_malloc_counts
def test_loads_beside_evictions_are_charged_what_is_typical_of_their_size(kept: list[bytearray]) -> None:
    memory = CacheMemory()
    kept.append(bytearray(4 << 20))  # an evicted model's memory, freed while the next load is measured
    expected = memory.estimate("k", 0)
    for measured in range(1, MEASURED_LOADS + 1):
        measurement = memory.start("k", 0)
        assert measurement is not None
        kept.pop()
        memory.released()
        kept.append(bytearray(4 << 20))  # the load's own
        memory.ended(measurement)
        assert memory.finish(measurement, first_use=True) == expected  # its growth (about 0) is not its own
        assert (memory.known_size("k", 0) is None) == (measured < MEASURED_LOADS)  # not clean: measured again
    assert memory.known_size("k", 0) == expected and memory.start("k", 0) is None  # then no more readings
    memory.ended(None)
    clean = memory.start("other", 1 << 20)  # a key of 1 MiB measured alone at 2 MiB, 2/3 of its first estimate
    assert clean is not None
    kept.append(bytearray(2 << 20))
    memory.ended(clean)
    assert (2 << 20) <= memory.finish(clean, first_use=True) < (2 << 20) + (256 << 10)
    measurement = memory.start("k2", 0)  # beside another load: typical of its size, scaled as the clean one was
    beside = memory.start("k3", 0)
    assert measurement is not None and beside is not None
    memory.ended(beside)
    memory.abandon(beside)
    memory.ended(measurement)
    assert abs(memory.finish(measurement, first_use=True) - expected * 2 // 3) < (128 << 10)


@needs_malloc_counts
def test_a_load_no_request_follows_is_charged_at_least_its_expected_peak() -> None:
    memory = CacheMemory()
    measurement = memory.start("k", 1 << 20)
    assert measurement is not None
    memory.ended(measurement)
    assert memory.finish(measurement, first_use=False) == memory.estimate("k", 1 << 20) == 3 << 20
    assert memory.known_size("k", 1 << 20) is None  # its first run was not seen: nothing remembered
