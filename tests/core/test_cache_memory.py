"""The cache's memory count alone: when a load's measurement is clean (its growth becomes the key's charge) and
when it is not (the load is charged what is typical of its size)."""

from __future__ import annotations

from modelhost.core.cache_memory import CacheMemory

DISK = 1000  # bytes of files; first estimate 2 x DISK + 1 MiB
KEPT = 4 << 20  # what the "load" keeps: a bytearray, counted as malloc's bytes in use


def measured_charge(memory: CacheMemory, key: str, during: list[object] | None = None) -> int:
    """Start a load of `key`, allocate KEPT bytes, end it: the charge `finish` gives."""
    measurement = memory.start(key, DISK)
    assert measurement is not None
    kept = bytearray(KEPT)
    if during is not None:
        during.clear()  # memory freed while the load was measured
    memory.ended(measurement)
    size = memory.finish(measurement, first_use=True)
    del kept
    return size


def test_a_load_measured_alone_is_charged_its_growth_and_remembered() -> None:
    memory = CacheMemory()
    size = measured_charge(memory, "a")
    assert 0.9 * KEPT <= size < 2 * KEPT  # malloc's count moves by a few KB with the interpreter's own work
    assert memory.known_size("a", DISK) == size


def test_an_eviction_under_way_at_the_start_makes_the_measurement_unclean() -> None:
    """The victim's memory is freed on its own threads, before the loop hears that it unloaded: a load measured
    meanwhile would look smaller than it is. It is charged what is typical of its size, and measured again."""
    memory = CacheMemory()
    victim: list[object] = [bytearray(3 * KEPT)]
    memory.unloading(3 * KEPT)
    size = measured_charge(memory, "a", during=victim)
    memory.unloaded(3 * KEPT)
    memory.released()
    assert size == 2 * DISK + (1 << 20)  # typical: no clean measurement yet, the first estimate
    assert memory.known_size("a", DISK) is None


def test_an_eviction_finishing_during_the_measurement_makes_it_unclean() -> None:
    memory = CacheMemory()
    measurement = memory.start("a", DISK)
    assert measurement is not None
    memory.unloading(KEPT)
    memory.unloaded(KEPT)
    memory.released()
    memory.ended(measurement)
    memory.finish(measurement, first_use=True)
    assert memory.known_size("a", DISK) is None
