"""Coordinate descent over the knobs: from the model's own configuration, try each dimension's alternatives
with the rest held, keep the best if it beats the incumbent by more than the noise, and go round again while
anything improves and time is left. Each trial loads its configuration through the repository extension
(nothing restarts) and measures its capacity under the budget."""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any, TextIO

import numpy as np

from modelhost.client import Client, ClientError
from modelhost.perf.sweep import Loader, Sweep
from modelhost.tune.capacity import MAX_CONCURRENCY, Capacity, capacity
from modelhost.tune.knobs import DIMENSIONS, Knobs, Space, configured

MIN_GAIN = 0.03  # throughput gains smaller than this are noise on a shared machine
MAX_PASSES = 3


@dataclass(frozen=True, slots=True)
class Trial:
    index: int
    dimension: str  # "baseline", a dimension's name, or "final" (the winner measured again, longer)
    knobs: Knobs
    result: Capacity | None  # None: the server refused the configuration
    error: str = ""
    seconds: float = 0.0


@dataclass(slots=True)
class Search:
    model: str
    base_config: dict[str, Any]
    space: Space
    sweep: Sweep  # the measurement: url, window, warm-up (its loads are unused)
    time_limit_s: float
    out: TextIO | None = sys.stderr
    max_concurrency: int = MAX_CONCURRENCY
    trials: list[Trial] = field(default_factory=list)

    def run(self, requests: Sequence[dict[str, np.ndarray]], start: Knobs) -> Trial:
        """The best trial found (the baseline when nothing beat it)."""
        deadline = time.monotonic() + self.time_limit_s
        with Client(self.sweep.url) as client, Loader(self.sweep, requests, self.out) as loader:
            best = self._trial(client, loader, "baseline", start, 1)
            if best.result is None:
                raise ClientError(0, f"the model's own configuration did not load: {best.error}")
            for _ in range(MAX_PASSES):
                improved = False
                for dimension in DIMENSIONS:
                    for knobs in dimension.values(best.knobs, self.space):
                        if knobs == best.knobs or any(t.knobs == knobs for t in self.trials):
                            continue
                        if time.monotonic() > deadline:
                            return best
                        trial = self._trial(client, loader, dimension.name, knobs, best.result.concurrency // 2)
                        if trial.result and trial.result.throughput > best.result.throughput * (1 + MIN_GAIN):
                            best, improved = trial, True
                if not improved:
                    break
            return best

    def confirm(self, requests: Sequence[dict[str, np.ndarray]], best: Trial, baseline: Trial) -> tuple[Trial, Trial]:
        """The baseline and the winner measured again with windows three times as long; the winner stays loaded."""
        longer = replace(self.sweep, duration_s=self.sweep.duration_s * 3)
        assert baseline.result is not None and best.result is not None
        with Client(self.sweep.url) as client, Loader(longer, requests, self.out) as loader:
            again = self._trial(client, loader, "baseline, again", baseline.knobs, baseline.result.concurrency // 2)
            final = self._trial(client, loader, "final", best.knobs, best.result.concurrency // 2)
        return again, final

    def _trial(self, client: Client, loader: Loader, dimension: str, knobs: Knobs, start: int) -> Trial:
        started = time.monotonic()
        index = len(self.trials)
        self._say(f"trial {index}: {dimension}: {knobs.describe()}")
        try:
            client.load_model(self.model, config=configured(self.base_config, knobs))
        except ClientError as exc:
            trial = Trial(index, dimension, knobs, None, exc.message, time.monotonic() - started)
        else:
            loader.split = knobs.client_split
            result = capacity(loader, self.space.budget_ms, start, f"trial {index}", self.max_concurrency)
            trial = Trial(index, dimension, knobs, result, "", time.monotonic() - started)
        self.trials.append(trial)
        self._say(f"trial {index}: " + (f"{trial.result.throughput:.1f} req/s at p99 {trial.result.p99_ms:.1f} ms "
                                         f"(concurrency {trial.result.concurrency})" if trial.result
                                         else f"not loaded: {trial.error}"))
        return trial

    def _say(self, line: str) -> None:
        if self.out is not None:
            self.out.write(line + "\n")
            self.out.flush()
