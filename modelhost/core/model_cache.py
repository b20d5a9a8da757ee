"""Multi-model endpoints: models load on first use and stay cached, least recently used unloaded first.

A cached model is one archive (or one directory given to the management API), which may hold
several models. Each is known by a key: the TargetModel (`X-Amzn-SageMaker-Target-Model`) or the
`model_name` of `POST /models`. Concurrency contract (everything runs on the event loop):
- concurrent first requests for a key share one load;
- a request holds its models while it runs (`use`, through ModelManager.hold), and a model a request holds,
  over any protocol, is never evicted; an unload waits for those requests;
- the budget is compared with what the models hold in memory as core/cache_memory.py counts it (real
  memory above a baseline); the backends a load needs are warmed up before it is measured;
- loads run one at a time. Before one starts, idle models are evicted until its expected peak fits
  (`CacheMemory.estimate`), so memory stays within the budget during the load too, not only after it;
  each model's own growth is kept as its `size`. Downloads and unpacking run concurrently in threads.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import re
import shutil
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

from modelhost.core.cache_memory import CacheMemory, Measured
from modelhost.core.manager import ModelManager
from modelhost.core.model_loading import warm_up_backend_of
from modelhost.core.served_model import ServedModel
from modelhost.core.statistics import Histogram
from modelhost.errors import ErrorKind, ModelhostError, invalid, not_found
from modelhost.store.archive_models import ArchiveModels, FetchedModels
from modelhost.store.archive_store import ArchiveStore, check_target
from modelhost.store.layout import ModelLayout
from modelhost.store.local import LocalStore, ModelSource
from modelhost.store.paths import check_model_name, within

log = logging.getLogger("modelhost.model_cache")

# Seconds; cold loads run from tens of milliseconds to minutes.
CACHE_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)


@dataclass(slots=True)
class CachedModel:
    key: str
    url: str  # where it came from, as the management API lists it
    root: Path  # the model's directory (the unpacked archive): what inference.py's model_fn gets
    layout: ModelLayout | None  # None: a model the manager loaded from its store (`admitting`)
    served: dict[str, str]  # model name inside the archive -> the manager's name for it
    size: int  # bytes of memory its load kept (never less than its files on disk)
    work_dir: Path | None  # the cache's own files for it (the unpacked archive, its layout's links), removed on unload
    last_used: float = field(default_factory=time.monotonic)


@dataclass(slots=True)
class CacheStatistics:
    """Named after SageMaker's multi-model endpoint metrics; updated and read on the event loop.

    loading_wait: what a request that missed waited for its model; download: fetching and unpacking
    the archive; load: the backend loading it; unload: draining and unloading it.
    """

    hits: int = 0
    misses: int = 0
    evictions: int = 0
    loading_wait: Histogram = field(default_factory=lambda: Histogram(CACHE_BUCKETS))
    download: Histogram = field(default_factory=lambda: Histogram(CACHE_BUCKETS))
    load: Histogram = field(default_factory=lambda: Histogram(CACHE_BUCKETS))
    unload: Histogram = field(default_factory=lambda: Histogram(CACHE_BUCKETS))


Hook = Callable[[CachedModel], Awaitable[None]]


class ModelCache:
    def __init__(
        self,
        manager: ModelManager,
        archives: ArchiveStore | None,
        work_dir: Path,
        budget_bytes: int,
        max_unpacked_bytes: int,
        single_model_name: str = "model",
        on_load: Hook | None = None,
        on_unload: Hook | None = None,
        load_roots: Sequence[Path] = (),
        max_archive_members: int = 10_000,
    ) -> None:
        self._manager = manager
        self._load_roots = tuple(load_roots)
        self._work_dir = work_dir
        self._fetch = ArchiveModels(archives, work_dir / "downloads", max_unpacked_bytes, max_archive_members,
                                    single_model_name)
        self.budget_bytes = budget_bytes
        self._on_load = on_load
        self._on_unload = on_unload
        self._memory = CacheMemory()
        self._models: dict[str, CachedModel] = {}
        self._loading: dict[str, asyncio.Task[CachedModel]] = {}
        self._measure = asyncio.Lock()
        self._slots = itertools.count()
        self._removals: set[asyncio.Task[None]] = set()
        self._evicting: dict[str, asyncio.Future[None]] = {}  # key -> done when its eviction is
        self.statistics = CacheStatistics()

    def set_hooks(self, on_load: Hook | None, on_unload: Hook | None) -> None:
        """What a front-end makes of each model as it loads (its inference.py), and undoes as it unloads."""
        self._on_load, self._on_unload = on_load, on_unload

    @property
    def used_bytes(self) -> int:
        """Memory the loaded models hold, as the budget counts it."""
        return self._memory.used_bytes

    def models(self) -> list[CachedModel]:
        return sorted(self._models.values(), key=lambda m: m.key)

    def get(self, key: str) -> CachedModel:
        model = self._models.get(key)
        if model is None:
            check_model_name(key)
            raise not_found(f"model '{key}' is not loaded")
        return model

    @asynccontextmanager
    async def use_target(self, target: str) -> AsyncIterator[CachedModel]:
        """Pin the model of a TargetModel archive for one request, loading it first on a miss."""
        key = target if target in self._models else check_target(target)  # a cached key was checked
        model = self._models.get(key)
        if model is not None:
            self.statistics.hits += 1
        else:
            self.statistics.misses += 1
            started = time.monotonic()
            model = await self._loaded(key)
            self.statistics.loading_wait.observe(time.monotonic() - started)
        async with self._pinned(model) as pinned:
            yield pinned

    @asynccontextmanager
    async def use(self, key: str) -> AsyncIterator[CachedModel]:
        """Pin a model the management API loaded, for one request (NOT_FOUND when it is not loaded)."""
        model = self.get(key)
        self.statistics.hits += 1
        async with self._pinned(model) as pinned:
            yield pinned

    @asynccontextmanager
    async def _pinned(self, model: CachedModel) -> AsyncIterator[CachedModel]:
        # Held in the manager, as a request over any protocol holds its model: no await since the lookup.
        held: list[ServedModel] = []
        try:
            for name in model.served.values():
                held.append(self._manager.hold(name))
            yield model
        finally:
            for served in held:
                served.pins.release()
            model.last_used = time.monotonic()

    def _in_use(self, model: CachedModel) -> bool:
        return any(self._manager.in_use(name) for name in model.served.values())

    async def _loaded(self, key: str) -> CachedModel:
        # A model loaded for us can be evicted by another load before this task resumes: load it again.
        while True:
            model = await self._load_once(key, key, partial(self._fetch.fetch, key))
            if self._models.get(key) is model:
                return model

    async def load(self, key: str, url: str) -> CachedModel:
        """The management API's load: `url` is a local directory holding the model (ALREADY_EXISTS if loaded).

        `key` must be a model name (store/paths.py), and `url`, resolved with its symlinks, must lie in one of
        the load roots (INVALID_INPUT otherwise, whether or not it exists: no probing outside them)."""
        check_model_name(key, "model_name")
        if key in self._models or key in self._loading:
            raise ModelhostError(ErrorKind.ALREADY_EXISTS, f"model '{key}' is already loaded")
        if "\x00" in url or not await asyncio.to_thread(within, url, self._load_roots):
            raise invalid(f"model '{key}': url {url!r} is outside the directories models may be loaded from "
                          "(the models directory under SAGEMAKER_BASE_DIR, and a local --model-repository); "
                          "the server's operator can allow another with --allow-model-load-from")
        path = Path(url)
        if not path.is_dir():
            raise not_found(f"model '{key}': url '{url}' is not a directory")
        return await self._load_once(key, url, partial(self._fetch.in_place, path))

    @asynccontextmanager
    async def admitting(self, name: str, source: ModelSource) -> AsyncIterator[None]:
        """The manager's load of a model of its store (the repository API in explicit mode, an ensemble's composing
        model): within the budget like an archive's, cached under its name, and evicted like one."""
        on_disk = await asyncio.to_thread(_disk_bytes, source.path)
        async with self._measured(name, on_disk, partial(warm_up_backend_of, source)) as measured:
            yield
        model = CachedModel(name, name, source.path, None, {name: name}, measured.size, None)
        self._models[name] = model
        self._memory.keep(model.size)
        try:
            await self._make_room(0, name)  # never its own victim: the manager unloads it, holding its lock
        except ModelhostError:
            del self._models[name]
            self._memory.forget(model.size)
            self._memory.release()
            raise self._no_memory(name, f"{model.size} bytes") from None
        log.info("cached model %s: %d bytes (%d of %d used)", name, model.size, self.used_bytes, self.budget_bytes)

    def removed(self, name: str) -> None:
        """The manager unloaded or evicted `name` by itself (the repository API): what it held is no longer charged."""
        model = next((m for m in self._models.values() if name in m.served.values()), None)
        if model is None:  # not cached, or its eviction already under way
            return
        if model.layout is None:
            del self._models[model.key]
            self._memory.forget(model.size)
            self._memory.release()
            self.statistics.evictions += 1
            return
        task = asyncio.get_running_loop().create_task(self._evict(model))  # the archive's other models and files
        self._removals.add(task)
        task.add_done_callback(self._removals.discard)

    async def unload(self, key: str) -> None:
        """Unload a model: no request starts on it from now, and this returns once those running on it finished."""
        await self._evict(self.get(key))

    async def stop(self) -> None:
        for task in list(self._loading.values()):
            task.cancel()
        await asyncio.gather(*(self._evict(m) for m in list(self._models.values())), return_exceptions=True)
        await asyncio.gather(*self._removals, return_exceptions=True)

    async def _load_once(self, key: str, url: str, fetch: Callable[[Path], FetchedModels]) -> CachedModel:
        task = self._loading.get(key)
        if task is None:
            task = asyncio.create_task(self._load(key, url, fetch))
            self._loading[key] = task
            task.add_done_callback(lambda _: self._loading.pop(key, None))
        # A waiter that goes away (client disconnect) must not cancel a load others wait on.
        return await asyncio.shield(task)

    async def _load(self, key: str, url: str, fetch: Callable[[Path], FetchedModels]) -> CachedModel:
        while (evicting := self._evicting.get(key)) is not None:
            await asyncio.shield(evicting)  # its models still hold their names in the manager
        # Each load gets its own directory: an evicted copy may still be being removed.
        work = self._work_dir / "models" / self._slot(key)
        try:
            fetched = await asyncio.to_thread(fetch, work)
            if fetched.fetch_seconds is not None:
                self.statistics.download.observe(fetched.fetch_seconds)
            on_disk = fetched.disk_bytes
            async with self._measured(key, on_disk, partial(_warm_up_backends, fetched.layout)) as measured:
                served = await self._add_models(key, fetched.layout)
            size = measured.size
        except BaseException:
            self._remove_files(work)
            raise
        model = CachedModel(key, url, fetched.root, fetched.layout, served, size, work)
        try:
            if self._on_load is not None:
                await self._on_load(model)
        except BaseException:
            await self._evict_parts(model)
            raise
        self._models[key] = model
        self._memory.keep(model.size)
        await self._fit(model)
        log.info("cached model %s: %d bytes (%d of %d used)", key, size, self.used_bytes, self.budget_bytes)
        return model

    @asynccontextmanager
    async def _measured(self, key: str, on_disk: int, warm: Callable[[], None]) -> AsyncIterator[Measured]:
        """One load at a time: its backends warmed up, room made for its expected peak, then its memory measured
        (`Measured.size` once the block succeeds)."""
        async with self._measure:
            await self._memory.warm_up(warm)
            await self._make_room(self._memory.estimate(key, on_disk), key)
            started = time.monotonic()
            async with self._memory.measuring(key, on_disk) as measured:
                yield measured
            self.statistics.load.observe(time.monotonic() - started)

    async def _add_models(self, key: str, layout: ModelLayout) -> dict[str, str]:
        store = LocalStore(layout.repository)
        served: dict[str, str] = {}
        try:
            for name in layout.models:
                served_name = key if len(layout.models) == 1 else f"{key}/{name}"
                source = await asyncio.to_thread(store.fetch, name)
                await self._manager.add(ModelSource(served_name, source.path, source.versions))
                served[name] = served_name
        except BaseException:
            await asyncio.gather(*(self._manager.evict(n) for n in served.values()), return_exceptions=True)
            raise
        return served

    async def _make_room(self, needed: int, key: str) -> None:
        """Evict idle models, least recently used first, until `needed` more bytes fit the budget."""
        if self.used_bytes + needed <= self.budget_bytes:
            return
        for victim in sorted(self._models.values(), key=lambda m: m.last_used):
            if self.used_bytes + needed <= self.budget_bytes:
                return
            if victim.key != key and not self._in_use(victim):
                await self._evict(victim)
        if self.used_bytes + needed > self.budget_bytes:
            raise self._no_memory(key, f"about {needed} bytes to load")

    async def _fit(self, model: CachedModel) -> None:
        """After a load: evict others until the measured size fits, or unload this one (NO_MEMORY)."""
        try:
            await self._make_room(0, model.key)  # never its own victim
        except ModelhostError:
            await self._evict(model)
            raise self._no_memory(model.key, f"{model.size} bytes") from None

    def _no_memory(self, key: str, needed: str) -> ModelhostError:
        held = sum(m.size for m in self._models.values() if m.key != key and self._in_use(m))
        return ModelhostError(
            ErrorKind.NO_MEMORY,
            f"model '{key}' needs {needed}: the model cache holds at most {self.budget_bytes} bytes "
            f"(--model-cache-bytes) and models in use hold {held}",
        )

    async def _evict(self, model: CachedModel) -> None:
        """No request finds the model through the cache from now; once the requests holding it are done (their
        own lookups included), its models unload. A load of the same key waits for that."""
        if self._models.get(model.key) is not model:
            return
        del self._models[model.key]
        self._memory.forget(model.size)
        self.statistics.evictions += 1
        started = time.monotonic()
        done = self._evicting[model.key] = asyncio.get_running_loop().create_future()
        try:
            await asyncio.gather(*(self._manager.idle(name) for name in model.served.values()))
            await self._evict_parts(model)
        finally:
            del self._evicting[model.key]
            done.set_result(None)
        self.statistics.unload.observe(time.monotonic() - started)
        log.info("unloaded model %s (%d bytes)", model.key, model.size)

    async def _evict_parts(self, model: CachedModel) -> None:
        try:
            await asyncio.gather(*(self._manager.evict(n) for n in model.served.values()), return_exceptions=True)
            if self._on_unload is not None and model.layout is not None:
                await self._on_unload(model)
        finally:
            self._memory.release()
            if model.work_dir is not None:
                self._remove_files(model.work_dir)

    def _remove_files(self, work: Path) -> None:
        """Delete a model's files in the background: its memory is what a waiting load needs, not its disk."""
        task = asyncio.create_task(asyncio.to_thread(shutil.rmtree, work, True))
        self._removals.add(task)
        task.add_done_callback(self._removals.discard)

    def _slot(self, key: str) -> str:
        """A directory name for one load of a key: readable, and never used twice."""
        return f"{next(self._slots)}-" + re.sub(r"[^A-Za-z0-9._-]", "_", key)[:100]


def _disk_bytes(directory: Path) -> int:
    return sum(path.stat().st_size for path in directory.resolve().rglob("*") if path.is_file())


def _warm_up_backends(layout: ModelLayout) -> None:
    store = LocalStore(layout.repository)
    for name in layout.models:
        try:
            source = store.fetch(name)
        except (ModelhostError, OSError):
            continue  # the load reports it
        warm_up_backend_of(source)
