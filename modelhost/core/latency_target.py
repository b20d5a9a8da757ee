"""A model's p99 latency target, kept under live traffic: `parameters { key: "target_p99_ms" ... }`.

The scheduler asks it three things: may a request join the queue (`admission`: refused early, with
Retry-After, when the work queued ahead means it would finish past the target), how long may a request wait
there before it can no longer make the target (`late_after`: such a request is refused, not run late), and
what batch size and queue delay to form batches with (`limits`). It learns the model's execution time per
batch size from the executions themselves, a least-squares line s(b) = a + c b over recent batches, and
every ADJUST_EVERY_S it compares the p99 of the latencies it saw with the target: a batch may take a larger
share of the target while p99 stays under 80 % of it, a smaller one when p99 passed it, and the queue delay
(never above the config's) halves or doubles with it. With `target_p99_adapt: "false"` the batch size and
delay stay the config's, and only admission and lateness act.

Latency here is the server's: from the first byte of a request the front-end parsed (V2 HTTP says when; other
front-ends count from the model's queue) to its answer leaving the model.
Thread contract: every method runs on the event loop; instance threads only read `limits`' two fields.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from modelhost.config.model_config_pb2 import ModelConfig
from modelhost.config.parameters import string_parameters
from modelhost.config.pbtxt import ConfigError
from modelhost.core.clock import MONOTONIC, Clock

TARGET_PARAMETER = "target_p99_ms"
ADAPT_PARAMETER = "target_p99_adapt"
ADJUST_EVERY_S = 0.5
MIN_SAMPLES = 20  # latencies needed before a p99 means anything
MAX_SAMPLES = 4096  # latencies kept per window, a uniform sample of them all
CALM = 0.8  # p99 under this share of the target lets batches grow
SHARE_RANGE = (0.1, 0.9)  # of the target a full batch's execution may take


@dataclass(slots=True)
class BatchLimits:
    """What the request queue forms batches with; written on the loop, read by instance threads (each field
    is one atomic assignment)."""

    max_batch_size: int
    max_queue_delay_s: float


class ServiceTimes:
    """Execution seconds against batch rows: a least-squares line over recent batches (older ones decay)."""

    def __init__(self, decay: float = 0.98) -> None:
        self._decay = decay
        self._w = self._b = self._t = self._bb = self._bt = 0.0

    def add(self, rows: int, seconds: float) -> None:
        d = self._decay
        self._w = self._w * d + 1.0
        self._b = self._b * d + rows
        self._t = self._t * d + seconds
        self._bb = self._bb * d + rows * rows
        self._bt = self._bt * d + rows * seconds

    @property
    def known(self) -> bool:
        return self._w > 0

    def estimate(self, rows: int) -> float:
        """Seconds a batch of `rows` takes; 0 until something ran. With one batch size seen so far, time
        grows in proportion above it and stays flat below it (the safe side of an unknown line)."""
        if not self._w:
            return 0.0
        mean_b, mean_t = self._b / self._w, self._t / self._w
        spread = self._bb / self._w - mean_b * mean_b
        if spread <= 1e-9 * max(mean_b * mean_b, 1.0):
            return mean_t * max(1.0, rows / mean_b) if mean_b > 0 else mean_t
        slope = max((self._bt / self._w - mean_b * mean_t) / spread, 0.0)
        return max(mean_t + slope * (rows - mean_b), mean_t * 0.1)

    def largest_within(self, budget_s: float, ceiling: int) -> int:
        """The largest batch up to `ceiling` rows expected to run within `budget_s` (at least 1)."""
        if not self._w or self.estimate(ceiling) <= budget_s:
            return ceiling
        low, high = 1, ceiling
        while low < high:
            middle = (low + high + 1) // 2
            if self.estimate(middle) <= budget_s:
                low = middle
            else:
                high = middle - 1
        return low


class LatencyTarget:
    def __init__(self, target_s: float, max_batch_size: int, queue_delay_s: float, instances: int,
                 adapt: bool = True, clock: Clock = MONOTONIC) -> None:
        self.target_s = target_s
        self.adapt = adapt
        self.limits = BatchLimits(max_batch_size, queue_delay_s)
        self._max_batch_size = max_batch_size
        self._max_delay_s = queue_delay_s
        self._instances = max(instances, 1)
        self._clock = clock
        self.service = ServiceTimes()
        self._share = 0.5
        self._latencies: list[float] = []  # a uniform sample of the window's latencies (reservoir)
        self._seen = 0
        self._random = random.Random(0)
        self._adjusted = clock.now()
        self.observed_p99_s = 0.0
        self.refused = 0  # at admission
        self.late = 0  # in the queue, past the point of making the target

    @classmethod
    def from_config(cls, config: ModelConfig, instances: int, clock: Clock = MONOTONIC) -> LatencyTarget | None:
        parameters = string_parameters(config)
        text = parameters.get(TARGET_PARAMETER)
        if text is None:
            return None
        try:
            target_ms = float(text)
        except ValueError:
            target_ms = math.nan
        if not 0 < target_ms < 3_600_000:
            raise ConfigError(f"parameter {TARGET_PARAMETER} must be milliseconds above 0, got '{text}'")
        adapt = parameters.get(ADAPT_PARAMETER, "true").strip().lower()
        if adapt not in ("true", "false"):
            raise ConfigError(f"parameter {ADAPT_PARAMETER} must be true or false, got '{adapt}'")
        delay_s = config.dynamic_batching.max_queue_delay_microseconds / 1e6
        return cls(target_ms / 1000.0, config.max_batch_size, delay_s, instances, adapt == "true", clock)

    def admission(self, rows: int, queued_rows: int, busy_instances: int, spent_s: float = 0.0) -> float | None:
        """None to admit a request of `rows` rows behind `queued_rows`, the server having had it `spent_s`
        already; else the seconds by which it would miss the target (its Retry-After). A request with nothing
        queued ahead is always admitted."""
        if not queued_rows or not self.service.known:
            return None
        batch = max(self.limits.max_batch_size, 1)
        per_batch = self.service.estimate(batch)
        batches = math.ceil((queued_rows + rows) / batch)
        predicted = spent_s + math.ceil(batches / self._instances) * per_batch
        if busy_instances >= self._instances:
            predicted += per_batch / 2  # what is running now: half done, on average
        if predicted <= self.target_s:
            return None
        self.refused += 1
        return predicted - self.target_s

    def late_after(self, spent_s: float = 0.0) -> float:
        """Seconds a request the server has had `spent_s` may wait in the queue and still make the target (at
        least a tenth of the target: what cannot be known is not refused at once)."""
        left = self.target_s - spent_s - self.service.estimate(max(self.limits.max_batch_size, 1))
        return max(left, 0.1 * self.target_s)

    def executed(self, rows: int, seconds: float) -> None:
        self.service.add(rows, seconds)

    def completed(self, latency_s: float) -> None:
        self._seen += 1
        if len(self._latencies) < MAX_SAMPLES:
            self._latencies.append(latency_s)
        else:
            slot = self._random.randrange(self._seen)
            if slot < MAX_SAMPLES:
                self._latencies[slot] = latency_s
        now = self._clock.now()
        if now - self._adjusted >= ADJUST_EVERY_S and len(self._latencies) >= MIN_SAMPLES:
            self._adjust(now)

    def _adjust(self, now: float) -> None:
        latencies = sorted(self._latencies)
        self.observed_p99_s = latencies[min(len(latencies) - 1, math.ceil(0.99 * len(latencies)) - 1)]
        self._latencies.clear()
        self._seen = 0
        self._adjusted = now
        if not self.adapt:
            return
        delay = self.limits.max_queue_delay_s
        if self.observed_p99_s > self.target_s:
            self._share = max(SHARE_RANGE[0], self._share * 0.8)
            delay /= 2
        elif self.observed_p99_s < CALM * self.target_s:
            self._share = min(SHARE_RANGE[1], self._share + 0.05)
            delay = min(self._max_delay_s, delay * 2 if delay else self._max_delay_s / 8)
        batch = self.service.largest_within(self._share * self.target_s, self._max_batch_size)
        room = self.target_s - 2 * self.service.estimate(batch)  # one batch ahead, its own, and the wait
        self.limits.max_batch_size = batch
        self.limits.max_queue_delay_s = min(delay, max(room, 0.0))
