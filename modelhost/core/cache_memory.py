"""What the multi-model cache's models hold in memory, as its budget (`--model-cache-bytes`) counts it.

- What the models hold is the sum of their charges: no memory reading is taken to compare with the budget. A
  reading (core/memory.py: malloc's bytes in use) walks malloc's free lists, 50-180 µs with the loop's thread
  blocked in a process that has loaded a few hundred models, and a miss took four; now a key's load is measured
  only until its charge is known, and a load of a known key reads nothing.
- A load is measured from its start until its first request ends (`finish`), not only while it loads: ONNX
  Runtime allocates most of a small model's memory at its first run (its arena: 1.09 MB of 1.21 MB for
  benchmarks/multi_model.py's models). Its peak is sampled while it loads. A load that no request follows at once
  (the management API's, a store model's) is charged no less than its expected peak, which covers what its first
  run will allocate, and is not remembered.
- A measurement is clean when no other load ran, no other loaded model's first request was yet to end (a session's
  first run allocates its arena) and no memory was released during it, nor was being released at its start or end
  (an eviction's memory is freed on the victim's threads before the loop hears of it): its growth is then the
  load's own, and the key's charge from then on. Otherwise it counts the others' growth too, less what their
  evictions freed, anywhere from 0 to several models (measured under Zipf traffic at concurrency 8: 1 KB to 9.6 MB
  for a 1.2 MB model), and is not used: the load is charged what is typical of its size (its first estimate,
  scaled by how clean measurements compared with theirs), and after MEASURED_LOADS such loads the key keeps that
  charge and is not measured again.
- A load is expected to peak at twice its files plus 1 MiB (`estimate`), or at what the same key's clean
  measurement peaked at; its charge is never less than its files on disk. A key's figures are kept while its
  files keep their size (an archive replaced by another of a different size is measured again).
- A framework's process-wide state (importing torch alone holds about 85 MB) is no model's: the cache warms a
  backend up before a load is measured (CacheLoads.measured).

Runs on the event loop only (the meter's sampler thread aside).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass

from modelhost.core.memory import PeakMeter

# A first load's expected peak: a backend reads the model's files and builds tensors from them, and holds
# both at once (measured: ONNX Runtime 2.0x its file, TorchScript 1.0x, a TF SavedModel 2.7x), plus a fixed
# part for sessions, configs and schedulers. A key loaded before is expected to take what it took then.
PEAK_PER_FILE_BYTE = 2
PEAK_OVERHEAD_BYTES = 1 << 20
MEASURED_LOADS = 3  # a key's loads measured at most, when none of them is clean
_REMEMBERED_KEYS = 10_000


@dataclass(slots=True)
class _Known:
    disk_bytes: int  # its files' size when measured
    measured: int  # its loads measured, none of them clean
    peak: int  # the most a load of it held at once (0: no clean measurement yet)
    size: int | None  # its charge once settled (its loads are not measured any more), else None


@dataclass(slots=True, eq=False)
class Measurement:
    """One load's memory, from its start (`CacheMemory.start`) to `CacheMemory.finish` or `abandon`."""

    key: str
    disk_bytes: int
    meter: PeakMeter
    events: int  # CacheMemory._events after this load started
    alone: bool  # no other load was under way when it started


class CacheMemory:
    def __init__(self) -> None:
        self._charged = 0  # the cached models' charges, added up
        self._known: dict[str, _Known] = {}
        self._loads = 0  # loads under way (measured or not)
        self._first_runs = 0  # loaded models whose first request is yet to end
        self._events = 0  # loads started and memory released, ever: a measurement spanning one is not clean
        self._unloading = 0  # evictions under way: their memory may be freed at any moment
        self._freeing = 0  # the charges of their models, uncharged (`forget`) when they started
        # Clean measurements' sizes and the first estimates of their peaks, added up: how the two compare.
        self._clean_sizes = 0
        self._clean_estimates = 0

    @property
    def used(self) -> int:
        """What the cached models hold, as the budget counts it."""
        return self._charged

    def estimate(self, key: str, disk_bytes: int) -> int:
        """The most a load of `key` is expected to hold at once."""
        known = self._known_with(key, disk_bytes)
        return max(_first_estimate(disk_bytes), known.peak if known else 0)

    def known_size(self, key: str, disk_bytes: int) -> int | None:
        """The charge of a key whose loads are no longer measured; None while they are."""
        known = self._known_with(key, disk_bytes)
        return known.size if known is not None else None

    async def warm_up(self, warm: Callable[[], bool] | None) -> None:
        """Run `warm` (a backend warm-up, blocking; None: nothing to warm up) in a thread, before any load that it
        concerns is measured."""
        if warm is not None:
            await asyncio.to_thread(warm)

    def start(self, key: str, disk_bytes: int) -> Measurement | None:
        """A load of `key` starts (call `ended` once it ends, whatever happens): its measurement, or None when
        the key's charge is known (`known_size`)."""
        alone = self._loads == 0 and self._first_runs == 0 and self._unloading == 0
        self._loads += 1
        self._events += 1
        if self.known_size(key, disk_bytes) is not None:
            return None
        meter = PeakMeter().__enter__()
        return Measurement(key, disk_bytes, meter, self._events, alone)

    def awaiting_first_run(self) -> None:
        """A loaded model's first request is yet to end (its arena is yet to be allocated): a measurement that starts
        now is not alone."""
        self._first_runs += 1

    def first_run_ended(self) -> None:
        self._first_runs -= 1
        self._events += 1

    def ended(self, measurement: Measurement | None) -> None:
        """A load that `start` counted has ended (loaded or failed). Its peak is known; its growth is read when its
        measurement finishes."""
        self._loads -= 1
        if measurement is not None:
            measurement.meter.stop_sampling()

    def finish(self, measurement: Measurement, first_use: bool) -> int:
        """The size to charge a load measured by `measurement`, now closed. `first_use`: it ran from the load's
        start to the end of its first request (only then does it count for the key's later loads)."""
        meter = measurement.meter
        meter.__exit__(None, None, None)
        key, disk_bytes = measurement.key, measurement.disk_bytes
        size = max(meter.growth, disk_bytes)
        expected = self.estimate(key, disk_bytes)
        if not first_use:
            return max(size, expected)
        known = self._known_with(key, disk_bytes)
        if known is None:
            known = _Known(disk_bytes, 0, 0, None)
            self._remember(key, known)
        elif known.size is not None:  # settled by a load of the key that ran beside this one
            return known.size
        if measurement.alone and self._events == measurement.events and not self._unloading:  # clean: its own growth
            known.size, known.peak = size, max(meter.peak_growth, size)
            self._clean_sizes += size
            self._clean_estimates += _first_estimate(disk_bytes)
            return size
        known.measured += 1
        typical = self._typical(disk_bytes)
        if known.measured >= MEASURED_LOADS:
            known.size = typical
        return typical

    def abandon(self, measurement: Measurement) -> None:
        """A measurement no load will finish (the load failed, or its model left before any request ended)."""
        measurement.meter.__exit__(None, None, None)

    def keep(self, size: int) -> None:
        """A load became a cached model charged `size` bytes (or a cached model's charge changed by `size`)."""
        self._charged += size

    def forget(self, size: int) -> None:
        """A cached model charged `size` bytes left the cache (its memory is freed with `released`)."""
        self._charged -= size

    def unloading(self, size: int) -> None:
        """An eviction starts unloading models charged `size` (call `unloaded` with it once they have)."""
        self._unloading += 1
        self._freeing += size

    def unloaded(self, size: int) -> None:
        self._unloading -= 1
        self._freeing -= size

    @property
    def freeing(self) -> int:
        """What the evictions under way will have freed once they are done (not counted in `used`)."""
        return self._freeing

    def released(self) -> None:
        """A load's models unloaded (their memory freed)."""
        self._events += 1

    def _typical(self, disk_bytes: int) -> int:
        """The charge of a load that was never measured alone: its first estimate, scaled as the clean measurements
        compared with theirs (unscaled before any)."""
        estimate = _first_estimate(disk_bytes)
        if self._clean_estimates:
            estimate = estimate * self._clean_sizes // self._clean_estimates
        return max(estimate, disk_bytes)

    def forget_key(self, key: str) -> None:
        """Measure `key`'s next load again (its last one held more than the whole budget: process-wide state, such as
        a framework its code imported, counted as its own)."""
        known = self._known.pop(key, None)
        if known is not None and known.peak:  # measured clean: out of the typical sizes too
            assert known.size is not None
            self._clean_sizes -= known.size
            self._clean_estimates -= _first_estimate(known.disk_bytes)

    def _known_with(self, key: str, disk_bytes: int) -> _Known | None:
        known = self._known.get(key)
        return known if known is not None and known.disk_bytes == disk_bytes else None

    def _remember(self, key: str, known: _Known) -> None:
        self._known.pop(key, None)
        self._known[key] = known
        if len(self._known) > _REMEMBERED_KEYS:
            del self._known[next(iter(self._known))]


def _first_estimate(disk_bytes: int) -> int:
    return disk_bytes * PEAK_PER_FILE_BYTE + PEAK_OVERHEAD_BYTES
