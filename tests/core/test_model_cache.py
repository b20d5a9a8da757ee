"""The model cache alone, over a manager: measured loads, charging, LRU eviction of store models, entries of
several models, NO_MEMORY. (A multi-model endpoint's archives through it: test_sagemaker_target_models.py.)"""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import onnx
import pytest

from modelhost.core.manager import ModelManager
from modelhost.core.model_cache import ModelCache
from modelhost.errors import ErrorKind, ModelhostError
from modelhost.store.local import LocalStore
from tests.archives import WIDTH, weighted_model


def write_repository(root: Path, count: int, width: int = WIDTH) -> LocalStore:
    """m0..m<count-1>, Triton layout, m<i> answering INPUT0 + i."""
    for i in range(count):
        version = root / f"m{i}" / "1"
        version.mkdir(parents=True)
        onnx.save_model(weighted_model(float(i), width), str(version / "model.onnx"))
    return LocalStore(root)


class Harness:
    def __init__(self, tmp_path: Path, count: int = 3, budget: int = 1 << 40, width: int = WIDTH) -> None:
        self.store = write_repository(tmp_path / "repository", count, width)
        self.width = width
        self.manager = ModelManager(self.store, cpu_count=1, default_max_batch_size=4)
        self.cache = ModelCache(self.manager, budget)
        self.manager.set_budget(self.cache)
        self.released: list[str] = []

    async def add(self, *names: str) -> list[str]:
        """Load the store's models under other names, as an archive's models load."""
        added = []
        for name in names:
            source = self.store.fetch(name)
            await self.manager.add(type(source)(f"entry/{name}", source.path, source.versions))
            added.append(f"entry/{name}")
        return added

    async def load_entry(self, key: str, *names: str) -> None:
        entry = await self.cache.load(key, 0, lambda: None, lambda: self.add(*names))

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
            await h.cache.load("broken", 0, lambda: None, failing)
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


def test_store_models_the_manager_loads_are_charged_and_evicted_least_recently_used_first(tmp_path: Path) -> None:
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
        await h.manager.unload("m0")  # the repository API's unload: no longer charged
        assert h.keys() == ["m2"]
        await h.cache.stop()
        await h.manager.stop()
        assert h.cache.used_bytes == 0

    asyncio.run(scenario())
