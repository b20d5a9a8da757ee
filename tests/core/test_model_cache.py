"""The model cache alone, over a manager: measured loads, charging, LRU eviction of store models, entries of
several models, NO_MEMORY. (A multi-model endpoint's archives through it: test_sagemaker_target_models.py.)"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import numpy as np
import onnx
import pytest

from modelhost.core import model_cache
from modelhost.core.cache_loads import CONCURRENT_LOADS
from modelhost.core.manager import ModelManager
from modelhost.core.model_cache import ModelCache
from modelhost.errors import ErrorKind, ModelhostError
from modelhost.store.local import LocalStore, ModelSource
from tests.archives import WIDTH, weighted_model
from tests.helpers import until


def write_repository(root: Path, count: int, width: int = WIDTH) -> LocalStore:
    """m0..m<count-1>, Triton layout, m<i> answering INPUT0 + i."""
    for i in range(count):
        version = root / f"m{i}" / "1"
        version.mkdir(parents=True)
        onnx.save_model(weighted_model(float(i), width), str(version / "model.onnx"))
    return LocalStore(root)


class Harness:
    def __init__(self, tmp_path: Path, count: int = 3, budget: int = 1 << 40, width: int = WIDTH,
                 cpu_count: int = 1) -> None:
        self.store = write_repository(tmp_path / "repository", count, width)
        self.width = width
        self.manager = ModelManager(self.store, cpu_count=cpu_count, default_max_batch_size=4)
        self.cache = ModelCache(self.manager, budget)
        self.manager.set_budget(self.cache)
        self.released: list[str] = []

    async def add(self, *names: str) -> list[str]:
        """Load the store's models under other names, as an archive's models load."""
        added = []
        for name in names:
            source = self.store.fetch(name)
            await self.manager.add(ModelSource(f"entry/{name}", source.path, source.versions))
            added.append(f"entry/{name}")
        return added

    async def load_entry(self, key: str, *names: str) -> None:
        entry = await self.cache.load(key, 0, None, lambda: self.add(*names))

        async def release() -> None:
            self.released.append(key)
        entry.release = release
        await self.cache.keep(entry)

    async def infer(self, name: str) -> float:
        async with self.manager.acquire(name) as served:
            outputs = await served.scheduler.submit({"INPUT0": np.zeros((1, self.width), np.float32)}, ["OUTPUT0"], 1)
            return float(outputs["OUTPUT0"][0, 0])

    def keys(self) -> list[str]:
        return [e.key for e in self.cache.entries()]


def test_a_load_whose_models_fail_is_not_charged_and_the_next_one_fits(tmp_path: Path) -> None:
    async def failing() -> list[str]:
        raise ModelhostError(ErrorKind.UNAVAILABLE, "model.onnx is broken")

    async def scenario() -> None:
        h = Harness(tmp_path)
        with pytest.raises(ModelhostError, match="broken"):
            await h.cache.load("broken", 0, None, failing)
        assert h.keys() == [] and h.cache.used_bytes == 0
        await h.load_entry("archive", "m1")
        assert h.keys() == ["archive"] and await h.infer("entry/m1") == 1.0
        assert h.cache.used_bytes >= WIDTH * 4
        await h.cache.stop()
        assert h.keys() == [] and h.released == ["archive"] and h.manager.served() == []

    asyncio.run(scenario())


def test_an_entry_that_does_not_fit_once_loaded_is_unloaded_and_released(tmp_path: Path) -> None:
    async def scenario() -> None:
        # The expected peak of a load that declares no files (1 MiB) fits; the 4 MiB it then holds does not.
        h = Harness(tmp_path, count=1, budget=2 << 20, width=1 << 20)
        with pytest.raises(ModelhostError) as refused:
            await h.load_entry("archive", "m0")
        assert refused.value.kind is ErrorKind.NO_MEMORY and "--model-cache-bytes" in refused.value.message
        assert h.keys() == [] and h.released == ["archive"] and h.manager.served() == []
        assert h.cache.used_bytes == 0 and h.cache.statistics.evictions == 1

    asyncio.run(scenario())


def test_removing_one_model_of_an_entry_unloads_the_rest(tmp_path: Path) -> None:
    async def scenario() -> None:
        h = Harness(tmp_path)
        await h.load_entry("archive", "m0", "m1")
        assert sorted(s.name for s in h.manager.served()) == ["entry/m0", "entry/m1"]
        await h.manager.evict("entry/m0")  # the repository API's unload of one of them
        await h.cache.stop()  # waits for the eviction it started
        assert h.keys() == [] and h.released == ["archive"] and h.manager.served() == []
        assert h.cache.used_bytes == 0

    asyncio.run(scenario())


def test_store_models_the_manager_loads_are_charged_and_evicted_by_their_requests(tmp_path: Path) -> None:
    """Store models' requests count through ModelManager.hold: under `lfu` the one used least lately goes (m0 more
    recently used than m2, but less), except one loaded for a request that has not reached it yet."""
    async def scenario() -> None:
        h = Harness(tmp_path)
        await h.manager.load("m0")
        await h.manager.load("m1")
        assert h.keys() == ["m0", "m1"] and await h.infer("m1") == 1.0
        per_model = h.cache.used_bytes // 2
        h.cache.budget_bytes = h.cache.used_bytes + per_model // 2  # room for two and a half
        async with h.manager.acquire("m0"):  # m0 is in use, so m1, idle, goes
            await h.manager.load("m2")
        assert h.keys() == ["m0", "m2"] and h.cache.statistics.evictions == 1
        with pytest.raises(ModelhostError) as gone:
            h.manager.get("m1")
        assert gone.value.kind is ErrorKind.NOT_FOUND
        for _ in range(3):
            await h.infer("m2")
        await h.infer("m0")  # m0: two uses (the acquire's and this), the most recent; m2: three
        await h.manager.load("m1")
        assert h.keys() == ["m1", "m2"]
        await h.manager.load("m0")  # m1 waits for its first request (UNUSED_GRACE_S): m2 goes, used more as it was
        assert h.keys() == ["m0", "m1"] and h.cache.statistics.evictions == 3
        await h.manager.unload("m0")  # the repository API's unload: no longer charged
        assert h.keys() == ["m1"]
        await h.cache.stop()
        await h.manager.stop()
        assert h.cache.used_bytes == 0

    asyncio.run(scenario())


def test_models_loaded_on_demand_start_no_onnx_runtime_pools(tmp_path: Path) -> None:
    """With a budget, an ONNX instance computes on one thread: a model holds no ONNX Runtime pool (which its load
    would start and its eviction join, holding the GIL); without one, each instance has its share of the cores, here
    two, and its session a pool thread. Counted as the threads that end when the models unload (instance threads
    wait for the next instance, core/instance_threads.py)."""
    def threads() -> int:
        return len(os.listdir("/proc/self/task"))

    async def ended(manager: ModelManager, names: list[str]) -> int:
        for name in names:
            await manager.load(name)
        loaded = threads()
        for name in names:
            await manager.unload(name)
        await asyncio.sleep(0.2)
        return loaded - threads()

    async def scenario() -> tuple[int, int]:
        h = Harness(tmp_path, count=6, cpu_count=2)
        await h.manager.load("m0")
        assert await h.infer("m0") == 0.0
        on_demand = await ended(h.manager, ["m1", "m2", "m3"])
        everyday = ModelManager(h.store, cpu_count=2, default_max_batch_size=4)
        always = await ended(everyday, ["m3", "m4", "m5"])
        await everyday.stop()
        await h.cache.stop()
        return on_demand, always

    assert asyncio.run(scenario()) == (0, 3)


def test_a_store_model_never_used_goes_first_once_its_grace_is_over(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(model_cache, "UNUSED_GRACE_S", 0.0)

    async def scenario() -> None:
        h = Harness(tmp_path)
        await h.manager.load("m0")
        for _ in range(2):
            await h.infer("m0")
        await h.manager.load("m1")  # loaded, never used
        await asyncio.sleep(0.01)  # its grace is over
        h.cache.budget_bytes = h.cache.used_bytes + h.cache.used_bytes // 4  # room for two and a half
        await h.manager.load("m2")  # m1, the most recently loaded but never used, goes
        assert h.keys() == ["m0", "m2"]
        await h.cache.stop()
        await h.manager.stop()

    asyncio.run(scenario())


def test_loads_run_side_by_side_up_to_the_limit(tmp_path: Path) -> None:
    async def scenario() -> None:
        h = Harness(tmp_path)
        inside, release = 0, asyncio.Event()

        async def blocked() -> list[str]:
            nonlocal inside
            inside += 1
            await release.wait()
            return []

        loads = [asyncio.create_task(h.cache.load(f"k{i}", 0, None, blocked)) for i in range(CONCURRENT_LOADS + 1)]
        await until(lambda: inside == CONCURRENT_LOADS, "loads side by side")
        await asyncio.sleep(0.05)
        assert inside == CONCURRENT_LOADS  # the one more waits for a place
        release.set()
        entries = await asyncio.gather(*loads)
        assert inside == CONCURRENT_LOADS + 1 and sum(h.cache.statistics.load.counts) == CONCURRENT_LOADS + 1
        for entry in entries:
            await h.cache.keep(entry)
        await h.cache.stop()

    asyncio.run(scenario())


def test_a_load_that_fits_only_alone_waits_for_the_loads_under_way(tmp_path: Path) -> None:
    async def scenario() -> None:
        # Each load is expected to peak at 2 x 1 MiB + 1 MiB: one fits the 4 MiB budget, two do not.
        h = Harness(tmp_path, budget=4 << 20)
        order: list[str] = []
        first_may_end = asyncio.Event()

        async def first() -> list[str]:
            order.append("first")
            await first_may_end.wait()
            return []

        async def second() -> list[str]:
            order.append("second")
            return []

        one = asyncio.create_task(h.cache.load("one", 1 << 20, None, first))
        await until(lambda: order == ["first"])
        two = asyncio.create_task(h.cache.load("two", 1 << 20, None, second))
        await asyncio.sleep(0.05)
        assert order == ["first"]  # waiting for room, not refused
        first_may_end.set()
        await h.cache.keep(await one)
        await h.cache.keep(await two)
        # Loads no request follows are charged their expected peak (their first run's memory unseen): 3 MiB each,
        # so keeping the second evicts the first.
        assert order == ["first", "second"] and h.keys() == ["two"]
        await h.cache.stop()

    asyncio.run(scenario())


def test_a_backend_warms_up_with_no_load_under_way(tmp_path: Path) -> None:
    async def scenario() -> None:
        h = Harness(tmp_path)
        events: list[str] = []
        may_end = asyncio.Event()

        async def slow() -> list[str]:
            events.append("load started")
            await may_end.wait()
            events.append("load ended")
            return []

        def warm() -> bool:
            events.append("warm-up")
            return True

        async def quick() -> list[str]:
            events.append("warmed load")
            return []

        running = asyncio.create_task(h.cache.load("running", 0, None, slow))
        await until(lambda: events == ["load started"])
        warming = asyncio.create_task(h.cache.load("warming", 0, warm, quick))
        later = asyncio.create_task(h.cache.load("later", 0, None, quick))
        await asyncio.sleep(0.05)
        assert events == ["load started"]  # the warm-up waits, and no load starts before it
        may_end.set()
        for task in (running, warming, later):
            await h.cache.keep(await task)
        assert events == ["load started", "load ended", "warm-up", "warmed load", "warmed load"]
        await h.cache.stop()

    asyncio.run(scenario())


def test_a_store_model_of_a_warm_backend_loads_beside_other_loads(tmp_path: Path) -> None:
    async def scenario() -> None:
        h = Harness(tmp_path)
        await h.manager.load("m0")  # onnxruntime is warm from here on
        may_end = asyncio.Event()

        async def slow() -> list[str]:
            await may_end.wait()
            return []

        running = asyncio.create_task(h.cache.load("running", 0, None, slow))
        await asyncio.sleep(0.01)
        await asyncio.wait_for(h.manager.load("m1"), 10)  # no warm-up to run alone: it does not wait
        assert await h.infer("m1") == 1.0
        may_end.set()
        await h.cache.keep(await running)
        await h.cache.stop()
        await h.manager.stop()

    asyncio.run(scenario())
