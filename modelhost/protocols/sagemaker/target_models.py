"""A multi-model endpoint's models as SageMaker names them: `X-Amzn-SageMaker-Target-Model` archives, loaded
on first use, and the directories `POST /models` loads, each with its own `inference.py`.

Each is one archive (or one directory) fetched into a directory of its own (store/archive_models.py), whose
models the manager loads under the key (`<key>/<name>` when it holds several) in one measured load of the
core's model cache (core/model_cache.py), which then charges them to its budget and evicts them when it needs
room. Everything runs on the event loop: concurrent first requests for a key share one load; downloads and
unpacking run in threads; an evicted archive's files are kept on disk for its next load while it is unchanged
(store/unpacked_copies.py), or removed, in the background.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import re
import shutil
import time
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from modelhost.backends import backend_is_warm
from modelhost.core import loading_threads
from modelhost.core.cache_entry import CacheEntry
from modelhost.core.manager import ModelManager
from modelhost.core.model_cache import ModelCache
from modelhost.core.model_loader import Loaded, discard_loaded
from modelhost.core.model_loading import LoadPlan, warm_up_backend_of
from modelhost.errors import ErrorKind, ModelhostError, invalid, not_found
from modelhost.protocols.sagemaker.file_releases import FileReleases
from modelhost.protocols.sagemaker.planned_copies import PlannedCopies
from modelhost.protocols.sagemaker.target_model import ArchiveLimits, Hook, TargetModel
from modelhost.store.archive_models import ArchiveModels, FetchedModels
from modelhost.store.archive_store import ArchiveStore, check_target
from modelhost.store.layout import TOOLKIT_PROGRAM
from modelhost.store.local import LocalStore, ModelSource
from modelhost.store.paths import check_model_name, within
from modelhost.store.unpacked_copies import UnpackedCopies

REMEMBERED_KEYS = 10_000  # keys whose files' size is kept, for loading them in one hop
PLANNED_KEYS = 1_000  # keys whose kept copy's plans are kept, for a reload without planning (about 1-2 KB each)


class TargetModels:
    def __init__(self, cache: ModelCache, manager: ModelManager, archives: ArchiveStore | None, work_dir: Path,
                 limits: ArchiveLimits, single_model_name: str = "model", load_roots: Sequence[Path] = (),
                 on_load: Hook | None = None, on_unload: Hook | None = None, program: str = TOOLKIT_PROGRAM) -> None:
        self._cache = cache
        self._manager = manager
        self._work_dir = work_dir
        self.copies: UnpackedCopies[FetchedModels] = UnpackedCopies(limits.unpacked_cache_bytes)
        self._fetch = ArchiveModels(archives, work_dir / "downloads", limits.max_unpacked_bytes,
                                    limits.max_archive_members, single_model_name, self.copies, program, in_place=True)
        self._load_roots = tuple(load_roots)
        self._on_load = on_load
        self._on_unload = on_unload
        self._models: dict[str, TargetModel] = {}  # what this loaded; the cache's entries say what is loaded
        self._loading: dict[str, asyncio.Task[TargetModel]] = {}
        self._disk_bytes: dict[str, int] = {}  # key -> its files' size at its last load (first used), oldest first
        self._slots = itertools.count()
        self._removals: set[asyncio.Task[None]] = set()
        self._releases = FileReleases(self._fetch.release)
        self._plans: PlannedCopies[list[_Prepared]] = PlannedCopies(PLANNED_KEYS)

    def set_hooks(self, on_load: Hook | None, on_unload: Hook | None) -> None:
        """What the front-end makes of each model as it loads (its inference.py), and undoes as it unloads."""
        self._on_load, self._on_unload = on_load, on_unload

    def models(self) -> list[TargetModel]:
        """Every model the cache holds: this endpoint's, and those the repository API loaded."""
        return [self._model(entry) for entry in self._cache.entries()]

    def get(self, key: str) -> TargetModel:
        entry = self._cache.entry(key)
        if entry is None:
            check_model_name(key)
            raise not_found(f"model '{key}' is not loaded")
        return self._model(entry)

    def _model(self, entry: CacheEntry) -> TargetModel:
        model = self._models.get(entry.key)
        if model is not None and model.entry is entry:
            return model
        return TargetModel(entry.key, entry.key, {n: n for n in entry.names}, entry, None)

    @asynccontextmanager
    async def use_target(self, target: str) -> AsyncIterator[TargetModel]:
        """Hold the model of a TargetModel archive for one request, loading it first on a miss."""
        entry = self._cache.entry(target)
        if entry is None:
            target = check_target(target)  # normalized ("./a.tar.gz" is "a.tar.gz"), which may be cached
            entry = self._cache.entry(target)
        statistics = self._cache.statistics
        if entry is not None:
            statistics.hits += 1
            model = self._model(entry)
        else:
            statistics.misses += 1
            started = time.monotonic()
            with loading_threads.waited_for():
                model = await self._loaded(target)
            statistics.loading_wait.observe(time.monotonic() - started)
        async with self._cache.pinned(model.entry):
            yield model

    @asynccontextmanager
    async def use(self, key: str) -> AsyncIterator[TargetModel]:
        """Hold a model the management API loaded, for one request (NOT_FOUND when it is not loaded)."""
        model = self.get(key)
        self._cache.statistics.hits += 1
        async with self._cache.pinned(model.entry):
            yield model

    async def _loaded(self, key: str) -> TargetModel:
        # A model loaded for us can be evicted by another load before this task resumes: load it again.
        while True:
            model = await self._load_once(key, key, partial(self._fetch.fetch, key), first_use=True)
            if self._cache.holds(model.entry):
                return model

    async def load(self, key: str, url: str) -> TargetModel:
        """The management API's load: `url` is a local directory holding the model (ALREADY_EXISTS if loaded).

        `key` must be a model name (store/paths.py), and `url`, resolved with its symlinks, must lie in one of
        the load roots (INVALID_INPUT otherwise, whether or not it exists: no probing outside them)."""
        check_model_name(key, "model_name")
        if self._cache.entry(key) is not None or key in self._loading:
            raise ModelhostError(ErrorKind.ALREADY_EXISTS, f"model '{key}' is already loaded")
        if "\x00" in url or not await asyncio.to_thread(within, url, self._load_roots):
            raise invalid(f"model '{key}': url {url!r} is outside the directories models may be loaded from "
                          "(the models directory under SAGEMAKER_BASE_DIR, and a local --model-repository); "
                          "the server's operator can allow another with --allow-model-load-from")
        path = Path(url)
        if not path.is_dir():
            raise not_found(f"model '{key}': url '{url}' is not a directory")
        return await self._load_once(key, url, partial(self._fetch.in_place, path))

    async def unload(self, key: str) -> None:
        """Unload a model: no request starts on it from now, and this returns once those running on it finished."""
        await self._cache.evict(self.get(key).entry)

    async def stop(self) -> None:
        """Loads under way stop; the models this loaded unload, their files removed."""
        for task in list(self._loading.values()):
            task.cancel()
        await asyncio.gather(*self._loading.values(), return_exceptions=True)
        await asyncio.gather(*(self._cache.evict(m.entry) for m in list(self._models.values())),
                             return_exceptions=True)
        await asyncio.gather(*self._removals, return_exceptions=True)
        await self._releases.stop()

    async def _load_once(self, key: str, url: str, fetch: Callable[[Path], FetchedModels],
                         first_use: bool = False) -> TargetModel:
        """`first_use`: a request for the model follows the load at once (its end completes the load's measurement:
        ModelCache.keep)."""
        task = self._loading.get(key)
        if task is None:
            task = asyncio.create_task(self._load(key, url, fetch, first_use))
            self._loading[key] = task
            task.add_done_callback(lambda _: self._loading.pop(key, None))
        # A waiter that goes away (client disconnect) must not cancel a load others wait on.
        return await asyncio.shield(task)

    async def _load(self, key: str, url: str, fetch: Callable[[Path], FetchedModels], first_use: bool) -> TargetModel:
        try:
            return await self._load_and_keep(key, url, fetch, first_use)
        finally:
            self._releases.load_ended()  # files of models this load evicted, left by its job

    async def _load_and_keep(self, key: str, url: str, fetch: Callable[[Path], FetchedModels],
                             first_use: bool) -> TargetModel:
        expected = self._disk_bytes.get(key) if first_use and self._fetch.local else None
        try:
            if expected is not None:
                fetched, entry = await self._fetch_and_load(key, fetch, expected)
            else:
                fetched, entry = await self._fetch_then_load(key, fetch, first_use)
        except BaseException:
            self._disk_bytes.pop(key, None)  # its next load fetches before it makes room
            raise
        if first_use:
            self._remember(key, fetched.disk_bytes)
        served = dict(zip(fetched.layout.models, entry.names, strict=True))
        model = TargetModel(key, url, served, entry, fetched)
        entry.release = partial(self._release, model)
        try:
            if self._on_load is not None:
                await self._on_load(model)
        except BaseException:
            try:
                await self._cache.discard(entry)
            finally:
                self._remove_files(fetched.directory)
            raise
        self._models[key] = model
        await self._cache.keep(entry, first_use)
        return model

    async def _fetch_then_load(self, key: str, fetch: Callable[[Path], FetchedModels],
                               first_use: bool) -> tuple[FetchedModels, CacheEntry]:
        """The archive fetched and planned in a thread (the default executor's, at normal priority: a download may take
        long, and must not hold a loading thread); then room made for it, and its models loaded."""
        fetched, prepared, _ = await self._in_thread(partial(self._fetch_prepare_load, key, fetch, None), loading=False)
        self._observe_download(fetched)
        return fetched, await self._load_prepared(key, fetched, prepared, first_use)

    async def _fetch_and_load(self, key: str, fetch: Callable[[Path], FetchedModels],
                              expected: int) -> tuple[FetchedModels, CacheEntry]:
        """A key loaded before from a local archive, whose files took `expected` bytes: room made for it first, then
        fetched, planned and loaded in one job of a loading thread (one hop off the loop, not two). Files found
        otherwise, or a backend not warmed up, are loaded as `_fetch_then_load` loads them."""
        found: list[tuple[FetchedModels, list[_Prepared]]] = []

        async def add() -> list[str] | None:
            fetched, prepared, loaded = await self._in_thread(
                partial(self._fetch_prepare_load, key, fetch, expected), loading=True)
            found.append((fetched, prepared))
            self._observe_download(fetched)
            return None if loaded is None else await self._add_models(prepared, loaded)

        try:
            entry = await self._cache.load_expected(key, expected, add)
        except BaseException:
            if found:  # (a job that failed removed its files)
                self._remove_files(found[0][0].directory)
            raise
        fetched, prepared = found[0]
        if entry is None:
            entry = await self._load_prepared(key, fetched, prepared, first_use=True)
        return fetched, entry

    async def _load_prepared(self, key: str, fetched: FetchedModels, prepared: list[_Prepared],
                             first_use: bool) -> CacheEntry:
        cold = [p.source for p in prepared
                if p.plan is None or p.plan.backend is None or not backend_is_warm(p.plan.backend.name)]
        try:
            return await self._cache.load(key, fetched.disk_bytes, partial(_warm_up_backends, cold) if cold else None,
                                          partial(self._add_models, prepared), first_use)
        except BaseException:
            self._remove_files(fetched.directory)
            raise

    async def _in_thread(self, job: Callable[[], _Job], loading: bool) -> _Job:
        """`job` on a loading thread (`loading`: it loads models, core/loading_threads.py) or the default executor's;
        a cancelled caller waits for it to end and undoes what it fetched and loaded."""
        done = loading_threads.start_loading(job) if loading else asyncio.get_running_loop().run_in_executor(None, job)
        try:
            return await asyncio.shield(done)
        except asyncio.CancelledError:
            with contextlib.suppress(Exception):
                fetched, _, loaded = await done
                self._remove_files(fetched.directory)
                for versions in loaded or ():
                    await discard_loaded(versions)
            raise

    def _fetch_prepare_load(self, key: str, fetch: Callable[[Path], FetchedModels], expected: int | None) -> _Job:
        """Blocking: `_fetch_and_prepare`, then each model's versions loaded, when the files take `expected` bytes
        (what room was made for) and every backend is warm (a warm-up is measured apart); else (or with `expected`
        None) nothing loaded."""
        fetched, prepared = self._fetch_and_prepare(key, fetch)
        if expected is None or fetched.disk_bytes != expected or not all(_loads_now(p) for p in prepared):
            return fetched, prepared, None
        return fetched, prepared, [self._manager.load_now(p.source, p.plan) for p in prepared if p.plan]

    def _observe_download(self, fetched: FetchedModels) -> None:
        if fetched.fetch_seconds is not None:
            self._cache.statistics.download.observe(fetched.fetch_seconds)

    def _remember(self, key: str, disk_bytes: int) -> None:
        self._disk_bytes.pop(key, None)
        self._disk_bytes[key] = disk_bytes
        if len(self._disk_bytes) > REMEMBERED_KEYS:
            del self._disk_bytes[next(iter(self._disk_bytes))]

    def _fetch_and_prepare(self, key: str,
                           fetch: Callable[[Path], FetchedModels]) -> tuple[FetchedModels, list[_Prepared]]:
        """In one thread: the archive fetched, and each of its models found and planned as the manager will load it
        (a model that cannot be planned is left for the manager's load to report); a kept copy's plans are those of its
        last load (planned_copies.py). Files released meanwhile go first."""
        self._releases.run()
        # Each load gets its own directory: an evicted copy may still be being removed.
        work = self._work_dir / "models" / self._slot(key)
        try:
            fetched = fetch(work)
        except BaseException:
            shutil.rmtree(work, ignore_errors=True)
            raise
        if fetched.fetch_seconds is None and (recalled := self._plans.recall(key, fetched)) is not None:
            return fetched, recalled  # a kept copy, planned at its last load
        try:
            store = LocalStore(fetched.layout.repository)
            prepared = []
            for name in fetched.layout.models:
                served_as = key if len(fetched.layout.models) == 1 else f"{key}/{name}"
                if fetched.layout.in_place is not None:
                    source = ModelSource(served_as, fetched.layout.in_place, (1,), fetched.layout.in_place)
                else:
                    found = store.fetch(name)
                    source = ModelSource(served_as, found.path, found.versions)
                try:
                    plan: LoadPlan | None = self._manager.plan(source)
                except Exception:  # noqa: BLE001 - ModelManager.add reports it, as for any load
                    plan = None
                prepared.append(_Prepared(source, plan))
        except BaseException:
            shutil.rmtree(fetched.directory, ignore_errors=True)
            raise
        if all(model.plan is not None for model in prepared):
            self._plans.remember(key, fetched, prepared)
        return fetched, prepared

    async def _add_models(self, prepared: list[_Prepared], loaded: list[Loaded] | None = None) -> list[str]:
        """The manager loads each model (or takes in what `loaded` has of it, in `prepared`'s order)."""
        served: list[str] = []
        try:
            for index, model in enumerate(prepared):
                await self._manager.add(model.source, model.plan, loaded[index] if loaded else None)
                served.append(model.source.name)
        except BaseException:
            for versions in loaded or ():  # those `add` never reached
                await discard_loaded(versions)
            await asyncio.gather(*(self._manager.evict(n) for n in served), return_exceptions=True)
            raise
        return served

    async def _release(self, model: TargetModel) -> None:
        """After the cache unloaded the model's models: its inference.py, then its files (kept for a reload of
        the archive, or removed)."""
        if self._models.get(model.key) is model:
            del self._models[model.key]
        try:
            if self._on_unload is not None:
                await self._on_unload(model)
        finally:
            assert model.fetched is not None
            self._releases.add(model.key, model.fetched, load_follows=bool(self._loading))

    def _remove_files(self, directory: Path) -> None:
        self._in_background(partial(shutil.rmtree, directory, True))

    def _in_background(self, work: Callable[[], None]) -> None:
        """Delete or keep a model's files in a thread: its memory is what a waiting load needs, not its disk."""
        task = asyncio.create_task(asyncio.to_thread(work))
        self._removals.add(task)
        task.add_done_callback(self._removals.discard)

    def _slot(self, key: str) -> str:
        """A directory name for one load of a key: readable, and never used twice."""
        return f"{next(self._slots)}-" + re.sub(r"[^A-Za-z0-9._-]", "_", key)[:100]


@dataclass(frozen=True, slots=True)
class _Prepared:
    source: ModelSource  # under the name the manager serves it by
    plan: LoadPlan | None  # None: planning failed, and the manager's load reports why


def _loads_now(prepared: _Prepared) -> bool:
    plan = prepared.plan
    return plan is not None and plan.backend is not None and backend_is_warm(plan.backend.name)


_Job = tuple[FetchedModels, list[_Prepared], list[Loaded] | None]


def _warm_up_backends(sources: list[ModelSource]) -> bool:
    return any([warm_up_backend_of(source) for source in sources])  # (every one of them, not the first)
