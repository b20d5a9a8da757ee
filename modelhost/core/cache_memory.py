"""What the multi-model cache's models hold in memory, as its budget (`--model-cache-bytes`) counts it.

- Held bytes are compared with a baseline (core/memory.py: malloc's bytes in use, which drop as soon as an
  unloaded model is freed), so the count bounds real memory whatever each load's share of it; where that
  count is not available, it is the sum of each model's growth at its load.
- An empty cache holds 0 bytes by definition: the baseline is taken again whenever a load starts with no
  model held, so memory the process kept since (a refused load's imports) never counts against later models.
- A framework's process-wide state (importing torch alone holds about 85 MB) is no model's: what warming up a
  backend holds joins the baseline.
- A load is expected to peak at twice its files plus 1 MiB (`estimate`), or at what the same key's last load
  peaked at when it ran alone; its own size is what it still holds when done, never less than its files on
  disk. Loads may overlap: each is then charged what the process grew by during it, others' growth included
  (more than its own share, never less), and its peak is not remembered.

Runs on the event loop only; the cache never warms a backend up while a load is measured.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass

from modelhost.core.memory import COUNTS_FREES, PeakMeter, held_bytes

# A first load's expected peak: a backend reads the model's files and builds tensors from them, and holds
# both at once (measured: ONNX Runtime 2.0x its file, TorchScript 1.0x, a TF SavedModel 2.7x), plus a fixed
# part for sessions, configs and schedulers. A key loaded before is expected to take what it took then.
PEAK_PER_FILE_BYTE = 2
PEAK_OVERHEAD_BYTES = 1 << 20
_REMEMBERED_PEAKS = 10_000


@dataclass(slots=True)
class Measured:
    size: int = 0  # what the load still holds, set when it succeeds


@dataclass(frozen=True, slots=True)
class Reading:
    used: int  # what the models hold, as the budget counts it
    held: int | None  # the process's held bytes it was counted from; None when nothing was read


class CacheMemory:
    def __init__(self) -> None:
        self._baseline: int | None = None  # held bytes when the cache last held nothing, plus warm-ups since
        self._holding = 0  # loads whose memory is held: measured or measuring, not yet released
        self._measuring = 0  # loads being measured now
        self._started = 0  # loads that started being measured, ever
        self._peaks: dict[str, int] = {}  # key -> the most its last load held at once
        self._sizes = 0  # the models' own sizes, added up

    @property
    def used_bytes(self) -> int:
        return self.read().used

    def read(self) -> Reading:
        """What the models hold now, and the reading it came from: a load that starts before anything else runs
        on the loop counts from that reading (`measuring`) instead of taking another, as a reading walks malloc's
        free lists (50-100 µs on the loop of a process that has loaded a few hundred models)."""
        if not COUNTS_FREES:
            return Reading(self._sizes, None)
        if self._holding == 0 or self._baseline is None:
            return Reading(0, None)  # whatever the process holds, no model holds it
        held = held_bytes()
        return Reading(max(0, held - self._baseline), held)

    def estimate(self, key: str, disk_bytes: int) -> int:
        """The most a load of `key` is expected to hold at once."""
        return max(disk_bytes * PEAK_PER_FILE_BYTE + PEAK_OVERHEAD_BYTES, self._peaks.get(key, 0))

    async def warm_up(self, warm: Callable[[], bool] | None) -> None:
        """Run `warm` (a backend warm-up, blocking) in a thread; what it holds is the process's, not a model's.
        `warm` returns whether it warmed anything up (only then is the baseline moved: what the process did
        meanwhile is not the framework's). None: the backends are warm already."""
        if warm is None:
            return
        before = held_bytes()
        if await asyncio.to_thread(warm) and self._baseline is not None:
            self._baseline += max(0, held_bytes() - before)

    @asynccontextmanager
    async def measuring(self, key: str, disk_bytes: int, held: int | None = None) -> AsyncIterator[Measured]:
        """Around one load: its memory is held from here until `release`, unless the load fails. `held`: a
        `Reading.held` taken with nothing run on the loop since."""
        if held is None:
            held = held_bytes()
        if self._holding == 0:
            self._baseline = held
        self._holding += 1
        alone = self._measuring == 0
        self._measuring += 1
        self._started += 1
        started = self._started
        measured = Measured()
        try:
            with PeakMeter(start=held) as meter:
                yield measured
        except BaseException:
            self._holding -= 1
            raise
        finally:
            self._measuring -= 1
        if alone and self._started == started:  # no other load ran meanwhile: the peak is this one's
            self._peaks.pop(key, None)
            self._peaks[key] = meter.peak_growth
            if len(self._peaks) > _REMEMBERED_PEAKS:
                del self._peaks[next(iter(self._peaks))]
        measured.size = max(meter.growth, disk_bytes)

    def keep(self, size: int) -> None:
        """A measured load became a cached model of `size` bytes."""
        self._sizes += size

    def forget(self, size: int) -> None:
        """A cached model of `size` bytes left the cache (its memory is released with `release`)."""
        self._sizes -= size

    def release(self) -> None:
        """A measured load's memory is gone: its models unloaded."""
        self._holding -= 1
