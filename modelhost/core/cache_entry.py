"""What the multi-model cache charges (an entry: the models that loaded together) and what it counts, shared with
the front-ends that look models up by key (protocols/sagemaker/target_models.py) and the metrics."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from modelhost.core.cache_memory import Measurement
from modelhost.core.statistics import Histogram

# Seconds; cold loads run from tens of milliseconds to minutes.
CACHE_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)


@dataclass(slots=True, eq=False)
class CacheEntry:
    key: str
    names: tuple[str, ...]  # the manager's models it charges for
    size: int  # bytes of memory it is charged (never less than its files on disk)
    # What its owner undoes once its models are unloaded (an archive's files and inference.py); run once.
    release: Callable[[], Awaitable[None]] | None = None
    last_used: float = field(default_factory=time.monotonic)
    # Its load's measurement while open: until its first request ends (`keep(first_use=True)`), or None.
    measuring: Measurement | None = None
    first_run: bool = False  # kept for a request that follows at once, which has not ended yet
    store: bool = False  # one model of the store (`ModelCache.admitting`): its requests count through `used`
    # A store model loaded for a request that has not reached it yet (until its first use, or UNUSED_GRACE_S).
    unused: bool = False


@dataclass(slots=True)
class CacheStatistics:
    """Named after SageMaker's multi-model endpoint metrics; updated and read on the event loop.

    hits, misses and loading_wait (what a request that missed waited for its model) and download (fetching and
    unpacking an archive) are counted by the front-end that looks models up by key; load (the backend loading
    an entry) and unload (draining and unloading one) by the cache.
    """

    hits: int = 0
    misses: int = 0
    evictions: int = 0
    loading_wait: Histogram = field(default_factory=lambda: Histogram(CACHE_BUCKETS))
    download: Histogram = field(default_factory=lambda: Histogram(CACHE_BUCKETS))
    load: Histogram = field(default_factory=lambda: Histogram(CACHE_BUCKETS))
    unload: Histogram = field(default_factory=lambda: Histogram(CACHE_BUCKETS))
