"""Custom metrics of Triton Python models (pb_utils.MetricFamily, Metric), kept in this process's `REGISTRY`, which
the server's /metrics exports beside its own (metrics.py CustomMetricsCollector).

As in Triton: a family is a name, a description and a kind (COUNTER, GAUGE, HISTOGRAM); making one with a name in
use gives the same family (its first description stays), of another kind it is refused. A Metric is the family's
series of one label set (the same labels: the same series). A counter only goes up (`increment` >= 0), a gauge
is set or moved, a histogram observes into the buckets its first Metric gave. A family lives while a
MetricFamily object of it does; a Metric of a family gone refuses to work. A misuse raises TritonModelException.

Bounded, because a model may make labels from what clients send: at most MAX_FAMILIES families and MAX_SERIES
series in the process, MAX_LABELS labels of MAX_LABEL_CHARS characters, MAX_BUCKETS buckets (docs/security.md).

An isolated model's worker keeps its own registry, whose changes go to the server (triton_metrics_relay.py): each
series keeps what changed since they last went (its `pending` fields).
"""

from __future__ import annotations

import math
import re
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from modelhost.backends.python.triton_helpers import TritonModelException

COUNTER, GAUGE, HISTOGRAM = 0, 1, 2
KIND_NAMES = {COUNTER: "counter", GAUGE: "gauge", HISTOGRAM: "histogram"}
MAX_FAMILIES = 100
MAX_SERIES = 10_000
MAX_LABELS = 16
MAX_LABEL_CHARS = 256
MAX_BUCKETS = 64
RESERVED_PREFIXES = ("nv_", "modelhost_")  # the server's own families
_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*\Z")
_LABEL = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*\Z")
_GONE = "Invalid metric operation as the corresponding 'MetricFamily' has been deleted."
Labels = tuple[tuple[str, str], ...]


@dataclass
class Series:
    """One label set's value: `value` (counter, gauge) or the histogram's per-bucket counts, sum and count.
    `pending` is what changed since the last drain (a worker's), `was_set` whether a gauge was set since."""

    buckets: tuple[float, ...] = ()
    value: float = 0.0
    counts: list[int] = field(default_factory=list)
    total: float = 0.0
    count: int = 0
    pending: float = 0.0
    pending_counts: list[int] = field(default_factory=list)
    pending_total: float = 0.0
    was_set: bool = False
    dirty: bool = False


@dataclass
class Family:
    name: str
    description: str
    kind: int
    series: dict[Labels, Series] = field(default_factory=dict)
    handles: int = 0
    alive: bool = True


class Registry:
    """This process's families; thread-safe (models update from any thread)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.families: dict[str, Family] = {}
        self.series_count = 0

    def family(self, name: str, description: str, kind: int) -> Family:
        if kind not in KIND_NAMES:
            raise TritonModelException(f"metric family '{name}': kind must be MetricFamily.COUNTER, GAUGE or "
                                       f"HISTOGRAM, got {kind!r}")
        if not isinstance(name, str) or not _NAME.match(name) or name.startswith(RESERVED_PREFIXES):
            raise TritonModelException(f"metric family name {name!r} is not a Prometheus metric name, or is one of "
                                       f"the server's own (prefixes {', '.join(RESERVED_PREFIXES)})")
        with self.lock:
            family = self.families.get(name)
            if family is None:
                if len(self.families) >= MAX_FAMILIES:
                    raise TritonModelException(f"metric family '{name}': this server holds {MAX_FAMILIES} custom "
                                               "metric families, its limit")
                family = self.families[name] = Family(name, str(description), kind)
            elif family.kind != kind:
                raise TritonModelException(f"metric family '{name}' exists as a {KIND_NAMES[family.kind]}: it "
                                           f"cannot be made a {KIND_NAMES[kind]}")
            family.handles += 1
            return family

    def release(self, family: Family) -> None:
        with self.lock:
            family.handles -= 1
            if family.handles <= 0 and self.families.get(family.name) is family:
                del self.families[family.name]
                family.alive = False
                self.series_count -= len(family.series)

    def series(self, family: Family, labels: Labels, buckets: tuple[float, ...] | None) -> Series:
        with self.lock:
            found = family.series.get(labels)
            if found is not None:
                return found
            if self.series_count >= MAX_SERIES:
                raise TritonModelException(f"metric family '{family.name}': this server holds {MAX_SERIES} custom "
                                           "metric series (label sets), its limit")
            bounds = buckets or ()
            made = family.series[labels] = Series(bounds, counts=[0] * (len(bounds) + 1),
                                                  pending_counts=[0] * (len(bounds) + 1))
            self.series_count += 1
            return made

    def snapshot(self) -> list[tuple[Family, list[tuple[Labels, Series]]]]:
        """The families and their series now (copies of the series, taken under the lock)."""
        with self.lock:
            return [(family, [(labels, Series(s.buckets, s.value, list(s.counts), s.total, s.count))
                              for labels, s in family.series.items()]) for family in self.families.values()]


REGISTRY = Registry()


def check_labels(family: str, labels: Mapping[str, str] | None) -> Labels:
    items = dict(labels or {})
    if len(items) > MAX_LABELS:
        raise TritonModelException(f"metric family '{family}': a metric has at most {MAX_LABELS} labels, got "
                                   f"{len(items)}")
    for key, value in items.items():
        if not isinstance(key, str) or not _LABEL.match(key) or key.startswith("__"):
            raise TritonModelException(f"metric family '{family}': label name {key!r} is not a Prometheus label name")
        if not isinstance(value, str) or len(value) > MAX_LABEL_CHARS or len(key) > MAX_LABEL_CHARS:
            raise TritonModelException(f"metric family '{family}': label '{key}' must be a string of at most "
                                       f"{MAX_LABEL_CHARS} characters")
    return tuple(sorted(items.items()))


def check_buckets(family: str, buckets: Sequence[float] | None) -> tuple[float, ...]:
    if buckets is None:
        raise TritonModelException(f"metric family '{family}' is a histogram: its Metric needs buckets")
    bounds = tuple(float(b) for b in buckets)
    if len(bounds) > MAX_BUCKETS:
        raise TritonModelException(f"metric family '{family}': at most {MAX_BUCKETS} buckets, got {len(bounds)}")
    if any(not math.isfinite(b) for b in bounds) or any(a >= b for a, b in zip(bounds, bounds[1:])):
        raise TritonModelException(f"metric family '{family}': buckets must be finite and strictly ascending, "
                                   f"got {list(bounds)}")
    return bounds


class MetricFamily:
    """pb_utils.MetricFamily(name, description, kind)."""

    COUNTER, GAUGE, HISTOGRAM = COUNTER, GAUGE, HISTOGRAM

    def __init__(self, name: str, description: str, kind: int) -> None:
        self._family = REGISTRY.family(name, description, kind)

    def Metric(self, labels: Mapping[str, str] | None = None,  # noqa: N802 - Triton's name
               buckets: Sequence[float] | None = None) -> Metric:
        family = self._family
        checked = check_labels(family.name, labels)
        bounds = check_buckets(family.name, buckets) if family.kind == HISTOGRAM else None
        return Metric(family, REGISTRY.series(family, checked, bounds))

    def __del__(self) -> None:
        family = getattr(self, "_family", None)
        registry = globals().get("REGISTRY")  # None while the interpreter shuts down
        if family is not None and registry is not None:
            registry.release(family)


class Metric:
    """One series of a family: increment, set, observe, value as its kind allows."""

    def __init__(self, family: Family, series: Series) -> None:
        self._family = family
        self._series = series

    def increment(self, value: float) -> None:
        self._check("increment", (COUNTER, GAUGE))
        value = float(value)
        if self._family.kind == COUNTER and not value >= 0:
            raise TritonModelException(f"metric family '{self._family.name}' is a counter: it cannot be "
                                       f"incremented by {value}")
        with REGISTRY.lock:
            series = self._series
            series.value += value
            series.pending += value
            series.dirty = True

    def set(self, value: float) -> None:
        self._check("set", (GAUGE,))
        with REGISTRY.lock:
            series = self._series
            series.value = series.pending = float(value)
            series.was_set = series.dirty = True

    def observe(self, value: float) -> None:
        self._check("observe", (HISTOGRAM,))
        value = float(value)
        with REGISTRY.lock:
            series = self._series
            index = next((i for i, bound in enumerate(series.buckets) if value <= bound), len(series.buckets))
            series.counts[index] += 1
            series.pending_counts[index] += 1
            series.total += value
            series.pending_total += value
            series.count += 1
            series.dirty = True

    def value(self) -> float:
        self._check("value", (COUNTER, GAUGE))
        return self._series.value

    def _check(self, operation: str, kinds: tuple[int, ...]) -> None:
        if not self._family.alive:
            raise TritonModelException(_GONE)
        if self._family.kind not in kinds:
            raise TritonModelException(f"metric family '{self._family.name}' is a {KIND_NAMES[self._family.kind]}: "
                                       f"it has no {operation}")
