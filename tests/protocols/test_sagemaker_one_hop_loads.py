"""A reload of a multi-model endpoint's key in one loading-thread job (fetch, plan, load), room made for it first;
what falls back to the two-step load; and the manager taking in versions loaded in a caller's thread."""

from __future__ import annotations

import asyncio
import tarfile
import threading
from pathlib import Path

import numpy as np
import onnx
import pytest

from modelhost.core.manager import ModelManager
from modelhost.core.model_cache import ModelCache
from modelhost.errors import ErrorKind, ModelhostError
from modelhost.protocols.sagemaker.target_model import ArchiveLimits
from modelhost.protocols.sagemaker.target_models import TargetModels
from modelhost.store.archive_models import FetchedModels
from modelhost.store.archive_store import LocalArchiveStore
from modelhost.store.local import ModelSource
from modelhost.store.unpacked_copies import UnpackedCopies
from tests.archives import WIDTH, weighted_model
from tests.helpers import until
from tests.protocols.test_sagemaker_target_models import Harness

LOADING_THREAD = "modelhost-load"


class ReadsSeen(LocalArchiveStore):
    """A local archive store that notes, as each archive is read, the thread and whether `loaded` was cached."""

    def __init__(self, root: Path, cache: ModelCache, loaded: str) -> None:
        super().__init__(root)
        self.reads: list[tuple[str, bool]] = []
        self._cache, self._loaded = cache, loaded

    def local_path(self, target: str) -> Path:
        self.reads.append((threading.current_thread().name, self._cache.entry(self._loaded) is not None))
        return super().local_path(target)


class CopiesSeen(UnpackedCopies[FetchedModels]):
    """Unpacked copies that note the thread each copy was kept on."""

    def __init__(self, budget_bytes: int) -> None:
        super().__init__(budget_bytes)
        self.threads: list[str] = []

    def keep(self, target: str, copy: FetchedModels) -> None:
        self.threads.append(threading.current_thread().name)
        super().keep(target, copy)


def watched(h: Harness, tmp_path: Path) -> ReadsSeen:
    store = ReadsSeen(tmp_path / "archives", h.cache, "model-0.tar.gz")
    h.models = TargetModels(h.cache, h.manager, store, h.work, ArchiveLimits(1 << 30, 10_000), load_roots=[tmp_path])
    return store


def test_concurrent_misses_of_a_reloaded_model_fetch_and_load_it_once_on_a_loading_thread(tmp_path: Path) -> None:
    async def scenario() -> None:
        h = Harness(tmp_path)
        store = watched(h, tmp_path)
        await h.infer("model-1.tar.gz")
        first = len(store.reads)  # its stamp, and its file
        await h.models.unload("model-1.tar.gz")
        answers = await asyncio.gather(*(h.infer("model-1.tar.gz") for _ in range(6)))
        assert answers == [1.0] * 6
        assert len(store.reads) == 2 * first
        assert all(thread.startswith(LOADING_THREAD) for thread, _ in store.reads[first:])
        statistics = h.cache.statistics
        assert sum(statistics.load.counts) == 2 and sum(statistics.download.counts) == 2
        await h.stop()

    asyncio.run(scenario())


def test_room_is_made_before_a_reload_reads_its_archive_and_after_a_first_load_does(tmp_path: Path) -> None:
    async def scenario() -> None:
        h = Harness(tmp_path)
        store = watched(h, tmp_path)  # notes whether model-0 is cached at each read
        await h.infer("model-1.tar.gz")
        await h.infer("model-0.tar.gz")
        await h.models.unload("model-1.tar.gz")  # loaded before: its next load is a reload
        h.cache.budget_bytes = h.cache.used_bytes * 3 // 2  # one model, and not two
        await h.infer("model-2.tar.gz")  # a first load: read first, then room made
        assert store.reads[-1][1] and h.cache.entry("model-0.tar.gz") is None
        await h.models.unload("model-2.tar.gz")
        await h.infer("model-0.tar.gz")
        await h.infer("model-1.tar.gz")  # a reload: model-0 evicted, then model-1's archive read
        assert not store.reads[-1][1] and h.cache.entry("model-0.tar.gz") is None
        assert await h.infer("model-1.tar.gz") == 1.0
        await h.stop()

    asyncio.run(scenario())


def test_an_archive_replaced_by_one_of_another_size_loads_its_new_files(tmp_path: Path) -> None:
    async def scenario() -> None:
        h = Harness(tmp_path)
        assert await h.infer("model-0.tar.gz") == 0.0
        await h.models.unload("model-0.tar.gz")
        source = tmp_path / "bigger.onnx"
        onnx.save_model(weighted_model(7.0, WIDTH * 2), str(source))
        with tarfile.open(tmp_path / "archives" / "model-0.tar.gz", "w:gz") as archive:
            archive.add(source, arcname="model.onnx")
        h.width = WIDTH * 2
        assert await h.infer("model-0.tar.gz") == 7.0  # the files were not what room was made for: loaded apart
        assert h.cache.entry("model-0.tar.gz") is not None
        assert sum(h.cache.statistics.load.counts) == 2  # the load that found other files counts no load
        h.width = WIDTH
        await h.models.unload("model-0.tar.gz")
        await h.stop()

    asyncio.run(scenario())


def test_a_removed_archive_makes_room_at_most_once(tmp_path: Path) -> None:
    async def scenario() -> None:
        h = Harness(tmp_path, count=4)
        await h.infer("model-0.tar.gz")
        await h.infer("model-1.tar.gz")
        h.cache.budget_bytes = h.cache.used_bytes  # these two, and not a third
        await h.infer("model-2.tar.gz")  # model-0, the least recently used, goes
        assert h.cache.entry("model-0.tar.gz") is None
        (tmp_path / "archives" / "model-0.tar.gz").unlink()
        for _ in range(2):
            with pytest.raises(ModelhostError) as raised:
                await h.infer("model-0.tar.gz")
            assert raised.value.kind is ErrorKind.NOT_FOUND
        evictions = h.cache.statistics.evictions
        for _ in range(3):  # its size is forgotten: the archive is looked for before any room is made
            with pytest.raises(ModelhostError):
                await h.infer("model-0.tar.gz")
        assert h.cache.statistics.evictions == evictions
        await h.stop()

    asyncio.run(scenario())


def _source(tmp_path: Path, name: str, offset: float) -> ModelSource:
    directory = tmp_path / name
    (directory / "1").mkdir(parents=True)
    onnx.save_model(weighted_model(offset, 4), str(directory / "1" / "model.onnx"))
    return ModelSource(name, directory, (1,))


def test_the_manager_takes_in_versions_loaded_in_the_callers_thread(tmp_path: Path) -> None:
    async def scenario() -> None:
        manager = ModelManager(None, cpu_count=1, default_max_batch_size=4)
        source = _source(tmp_path, "m", 5.0)
        plan = await asyncio.to_thread(manager.plan, source)
        loaded = await asyncio.to_thread(manager.load_now, source, plan)
        await manager.add(source, plan, loaded)
        assert loaded == {}  # taken in
        served = manager.get("m")
        outputs = await served.scheduler.submit({"INPUT0": np.zeros((1, 4), np.float32)}, ["OUTPUT0"], 1)
        assert float(outputs["OUTPUT0"][0, 0]) == 5.0
        # A second load under the name in use: ALREADY_EXISTS, and the versions loaded for it stop.
        again = await asyncio.to_thread(manager.load_now, source, plan)
        extra = again[1]
        with pytest.raises(ModelhostError) as raised:
            await manager.add(source, plan, again)
        assert raised.value.kind is ErrorKind.ALREADY_EXISTS and again == {}
        assert not isinstance(extra, Exception)
        with pytest.raises(ModelhostError):
            await extra.scheduler.submit({"INPUT0": np.zeros((1, 4), np.float32)}, ["OUTPUT0"], 1)
        await manager.stop()

    asyncio.run(scenario())


def test_a_version_that_failed_in_the_callers_thread_fails_the_load(tmp_path: Path) -> None:
    async def scenario() -> None:
        manager = ModelManager(None, cpu_count=1, default_max_batch_size=4)
        source = _source(tmp_path, "m", 1.0)
        plan = await asyncio.to_thread(manager.plan, source)
        (source.path / "1" / "model.onnx").write_bytes(b"not a model")
        loaded = await asyncio.to_thread(manager.load_now, source, plan)
        assert isinstance(loaded[1], Exception)
        with pytest.raises(ModelhostError) as raised:
            await manager.add(source, plan, loaded)
        assert raised.value.kind is ErrorKind.UNAVAILABLE and "failed to load 'm'" in raised.value.message
        assert not manager.knows("m")
        await manager.stop()

    asyncio.run(scenario())


def test_the_load_that_evicts_a_model_releases_its_files_in_its_own_job(tmp_path: Path) -> None:
    async def scenario() -> None:
        h = Harness(tmp_path, count=3, unpacked_cache_bytes=1 << 30)
        copies = h.models.copies = h.models._fetch._copies = CopiesSeen(1 << 30)  # noqa: SLF001 - to see threads
        await h.infer("model-0.tar.gz")
        await h.infer("model-1.tar.gz")
        h.cache.budget_bytes = h.cache.used_bytes  # these two, and not a third
        await h.infer("model-2.tar.gz")  # model-0 goes (a first load evicts after its job: kept in a thread)
        await until(lambda: len(copies.threads) == h.cache.statistics.evictions, "the evicted models' files kept")
        assert not copies.threads[0].startswith(LOADING_THREAD)
        kept = len(copies.threads)
        # Half a model's room: the next load evicts one.
        h.cache.budget_bytes = h.cache.used_bytes + h.cache.used_bytes // (2 * len(h.loaded()))
        assert await h.infer("model-0.tar.gz") == 0.0  # from its kept copy: room made first, in one job
        assert len(copies.threads) > kept  # what it evicted was kept before it answered, by its own job
        assert all(thread.startswith(LOADING_THREAD) for thread in copies.threads[kept:])
        assert sum(h.cache.statistics.download.counts) == 3
        await h.stop()

    asyncio.run(scenario())
