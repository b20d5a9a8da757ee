"""A multi-model endpoint's target models in-process, within the model cache's budget: lazy loads, one load per
key, eviction by use (lfu) and by recency (lru), pins, NO_MEMORY."""

from __future__ import annotations

import asyncio
import gc
import os
import tarfile
import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest

from modelhost.backends.onnx import OnnxModel
from modelhost.core import loading_threads
from modelhost.core.cache_memory import PEAK_OVERHEAD_BYTES, PEAK_PER_FILE_BYTE
from modelhost.core.manager import ModelManager
from modelhost.core.memory import COUNTS_FREES, held_bytes
from modelhost.core.model_cache import ModelCache
from modelhost.errors import ErrorKind, ModelhostError
from modelhost.protocols.sagemaker.target_model import ArchiveLimits, TargetModel
from modelhost.protocols.sagemaker.target_models import TargetModels
from modelhost.store.archive_store import LocalArchiveStore
from modelhost.types import InferRequest
from tests.archives import WIDTH, write_archives
from tests.helpers import until


class Harness:
    def __init__(self, tmp_path: Path, count: int = 4, budget: int = 1 << 40,
                 on_load: Callable[[TargetModel], Awaitable[Any]] | None = None, width: int = WIDTH,
                 unpacked_cache_bytes: int = 0, policy: str = "lfu") -> None:
        write_archives(tmp_path / "archives", count, width)
        self.width = width
        self.manager = ModelManager(None, cpu_count=1, default_max_batch_size=4)
        self.cache = ModelCache(self.manager, budget, policy)
        self.models = TargetModels(self.cache, self.manager, LocalArchiveStore(tmp_path / "archives"),
                                   tmp_path / "work", ArchiveLimits(1 << 30, 10_000, unpacked_cache_bytes),
                                   load_roots=[tmp_path], on_load=on_load)
        self.work = tmp_path / "work"

    async def stop(self) -> None:
        await self.models.stop()
        await self.cache.stop()

    async def infer(self, target: str) -> float:
        async with self.models.use_target(target) as model:
            served = self.manager.get(model.served["model"])
            inputs = {"INPUT0": np.zeros((1, self.width), np.float32)}
            request = InferRequest(served.name, inputs)
            outputs = await served.scheduler.submit(request.inputs, ["OUTPUT0"], 1, 0, 0)
            return float(outputs["OUTPUT0"][0, 0])

    def loaded(self) -> list[str]:
        return [m.key for m in self.models.models()]

    async def model_dirs(self, expected: int) -> list[Path]:
        """The cache's model directories once unloaded ones are deleted (that happens in the background)."""
        for _ in range(200):
            found = list((self.work / "models").iterdir())
            if len(found) == expected:
                break
            await asyncio.sleep(0.01)
        return found


def test_first_use_loads_and_later_uses_hit(tmp_path: Path) -> None:
    async def scenario() -> None:
        h = Harness(tmp_path)
        assert await h.infer("model-2.tar.gz") == 2.0
        assert await h.infer("model-2.tar.gz") == 2.0
        assert await h.infer("model-3.tar.gz") == 3.0
        stats = h.cache.statistics
        assert (stats.hits, stats.misses) == (1, 2)
        assert sum(stats.download.counts) == 2 and sum(stats.load.counts) == 2
        assert h.loaded() == ["model-2.tar.gz", "model-3.tar.gz"]
        work_dir = h.models.get("model-2.tar.gz").work_dir
        assert work_dir is not None and sorted(os.listdir(work_dir)) == ["model.onnx"]  # read in place: no links
        # Each model's own size is at least its file; the budget counts all the memory models hold.
        assert all(m.size >= WIDTH * 4 for m in h.cache.entries())
        assert h.cache.used_bytes >= WIDTH * 4 * 2
        await h.stop()
        assert h.loaded() == [] and h.manager.served() == []

    asyncio.run(scenario())


def test_a_target_spelled_another_way_finds_the_model_loaded(tmp_path: Path) -> None:
    async def scenario() -> None:
        h = Harness(tmp_path)
        assert await h.infer("model-1.tar.gz") == 1.0
        assert await h.infer("./model-1.tar.gz") == 1.0
        assert h.loaded() == ["model-1.tar.gz"]
        assert (h.cache.statistics.hits, h.cache.statistics.misses) == (1, 1)
        await h.stop()

    asyncio.run(scenario())


def test_concurrent_cold_requests_load_once(tmp_path: Path) -> None:
    async def scenario() -> None:
        h = Harness(tmp_path)
        answers = await asyncio.gather(*(h.infer("model-1.tar.gz") for _ in range(12)))
        assert answers == [1.0] * 12
        assert sum(h.cache.statistics.load.counts) == 1
        assert sum(h.cache.statistics.download.counts) == 1
        assert sum(h.cache.statistics.loading_wait.counts) == 12
        await h.stop()

    asyncio.run(scenario())


@pytest.mark.parametrize("policy", ["lfu", "lru"])
def test_the_policy_picks_the_victim(tmp_path: Path, policy: str) -> None:
    """model-1 is used most but not lately: `lfu` keeps it and evicts model-2 (used once); `lru` evicts it."""
    async def scenario() -> None:
        h = Harness(tmp_path, count=4, policy=policy)
        await h.infer("model-0.tar.gz")
        one = h.cache.used_bytes
        for _ in range(5):
            await h.infer("model-1.tar.gz")
        await h.infer("model-2.tar.gz")
        per_model = (h.cache.used_bytes - one) // 2
        h.cache.budget_bytes = h.cache.used_bytes + per_model // 2  # room for three models and half a fourth
        await h.infer("model-0.tar.gz")  # recency: 1, 2, 0; uses: 1 five, 0 two, 2 one
        await h.infer("model-3.tar.gz")
        gone = {"lfu": "model-2.tar.gz", "lru": "model-1.tar.gz"}[policy]
        assert h.loaded() == sorted({"model-0.tar.gz", "model-1.tar.gz", "model-2.tar.gz", "model-3.tar.gz"} - {gone})
        assert h.cache.statistics.evictions == 1
        await h.stop()

    asyncio.run(scenario())


def test_an_evicted_models_uses_are_remembered(tmp_path: Path) -> None:
    """Under `lfu` a model evicted while busy elsewhere keeps its count: back in, it outlasts a newer one used
    once."""
    async def scenario() -> None:
        h = Harness(tmp_path, count=4)
        await h.infer("model-0.tar.gz")
        one = h.cache.used_bytes
        for _ in range(4):
            await h.infer("model-1.tar.gz")
        per_model = h.cache.used_bytes - one
        h.cache.budget_bytes = h.cache.used_bytes + per_model // 2  # room for two models and half a third
        async with h.models.use_target("model-0.tar.gz"):  # held: model-1, the only idle one, goes
            await h.infer("model-2.tar.gz")
        assert h.loaded() == ["model-0.tar.gz", "model-2.tar.gz"]
        await h.infer("model-1.tar.gz")  # back: model-2 (one use) goes before model-0 (two)
        assert h.loaded() == ["model-0.tar.gz", "model-1.tar.gz"]
        await h.infer("model-0.tar.gz")  # the most recent now, with three uses
        await h.infer("model-3.tar.gz")  # model-0 goes, not model-1 (five uses, the least recent)
        assert h.loaded() == ["model-1.tar.gz", "model-3.tar.gz"]
        await h.stop()

    asyncio.run(scenario())


def test_least_recently_used_idle_model_is_evicted_first(tmp_path: Path) -> None:
    async def scenario() -> None:
        h = Harness(tmp_path, count=6)
        await h.infer("model-0.tar.gz")
        one = h.cache.used_bytes
        await h.infer("model-1.tar.gz")
        await h.infer("model-2.tar.gz")
        per_model = (h.cache.used_bytes - one) // 2  # what a loaded, used model holds
        # Room for three models and half a fourth.
        h.cache.budget_bytes = h.cache.used_bytes + per_model // 2
        await h.infer("model-0.tar.gz")  # model-1 is now the least recently used
        await h.infer("model-3.tar.gz")  # its load's expected peak does not fit: the least recently used goes
        await h.infer("model-4.tar.gz")
        assert "model-1.tar.gz" not in h.loaded()
        assert {"model-0.tar.gz", "model-4.tar.gz"} <= set(h.loaded())
        assert h.cache.statistics.evictions >= 1
        # The evicted model's files are gone; it loads again on its next use.
        assert len(await h.model_dirs(len(h.loaded()))) == len(h.loaded())
        assert await h.infer("model-1.tar.gz") == 1.0
        await h.stop()

    asyncio.run(scenario())


def test_a_model_in_use_is_never_evicted_and_no_room_is_no_memory(tmp_path: Path) -> None:
    async def scenario() -> None:
        h = Harness(tmp_path)
        await h.infer("model-0.tar.gz")
        h.cache.budget_bytes = h.cache.used_bytes + WIDTH  # no room for a second model
        async with h.models.use_target("model-0.tar.gz"):
            with pytest.raises(ModelhostError) as caught:
                await h.infer("model-1.tar.gz")
        assert caught.value.kind is ErrorKind.NO_MEMORY
        assert "--model-cache-bytes" in caught.value.message and "model-1.tar.gz" in caught.value.message
        assert h.loaded() == ["model-0.tar.gz"]
        assert await h.model_dirs(1) == [h.models.get("model-0.tar.gz").work_dir]
        await h.stop()

    asyncio.run(scenario())


def test_a_model_a_request_holds_over_another_protocol_is_not_evicted(tmp_path: Path) -> None:
    """The cache's models are the manager's: a KServe request to one holds it as the data plane does, and the cache
    sees that hold."""
    async def scenario() -> None:
        h = Harness(tmp_path)
        await h.infer("model-0.tar.gz")
        # Room for one model, not two: the larger of the first's measured memory and the second's expected peak
        # (its files are the first's size), whichever the process's memory noise made larger, plus a slack far
        # below either (both are over 1 MiB) for what the process holds once the first is evicted.
        fetched = h.models.get("model-0.tar.gz").fetched
        assert fetched is not None
        expected = fetched.disk_bytes * PEAK_PER_FILE_BYTE + PEAK_OVERHEAD_BYTES
        h.cache.budget_bytes = max(h.cache.used_bytes, expected) + (256 << 10)
        served = h.manager.hold(h.models.get("model-0.tar.gz").served["model"])
        with pytest.raises(ModelhostError) as caught:
            await h.infer("model-1.tar.gz")
        assert caught.value.kind is ErrorKind.NO_MEMORY
        served.pins.release()
        assert await h.infer("model-1.tar.gz") == 1.0  # idle now: evicted to make room
        assert h.loaded() == ["model-1.tar.gz"]
        await h.stop()

    asyncio.run(scenario())


def test_unload_waits_for_the_requests_holding_the_model(tmp_path: Path) -> None:
    async def scenario() -> None:
        h = Harness(tmp_path)
        await h.infer("model-0.tar.gz")
        async with h.models.use_target("model-0.tar.gz") as model:
            unloading = asyncio.create_task(h.models.unload("model-0.tar.gz"))
            await asyncio.sleep(0.05)
            assert not unloading.done()
            served = h.manager.get(model.served["model"])  # the request can still run on it
            outputs = await served.scheduler.submit({"INPUT0": np.zeros((1, WIDTH), np.float32)}, ["OUTPUT0"], 1)
            assert float(outputs["OUTPUT0"][0, 0]) == 0.0
        await asyncio.wait_for(unloading, 10)
        assert h.loaded() == [] and h.manager.served() == []
        await h.stop()

    asyncio.run(scenario())


def test_a_model_larger_than_the_whole_budget_is_no_memory_and_leaves_nothing(tmp_path: Path) -> None:
    async def scenario() -> None:
        h = Harness(tmp_path, budget=WIDTH)
        with pytest.raises(ModelhostError) as caught:
            await h.infer("model-0.tar.gz")
        assert caught.value.kind is ErrorKind.NO_MEMORY
        assert h.loaded() == [] and h.manager.served() == []
        assert await h.model_dirs(0) == []

    asyncio.run(scenario())


def test_unknown_target_is_not_found_and_bad_target_is_invalid(tmp_path: Path) -> None:
    async def scenario() -> None:
        h = Harness(tmp_path)
        with pytest.raises(ModelhostError) as missing:
            await h.infer("model-9.tar.gz")
        assert missing.value.kind is ErrorKind.NOT_FOUND and "model-9.tar.gz" in missing.value.message
        with pytest.raises(ModelhostError) as escaping:
            await h.infer("../model-0.tar.gz")
        assert escaping.value.kind is ErrorKind.INVALID_INPUT
        assert h.loaded() == []

    asyncio.run(scenario())


def test_management_load_unload_and_conflicts(tmp_path: Path) -> None:
    async def scenario() -> None:
        h = Harness(tmp_path)
        model_dir = tmp_path / "extracted"
        with tarfile.open(tmp_path / "archives" / "model-2.tar.gz") as archive:
            archive.extractall(model_dir)
        loaded = await h.models.load("abc123", str(model_dir))
        assert loaded.url == str(model_dir) and h.loaded() == ["abc123"]
        with pytest.raises(ModelhostError) as again:
            await h.models.load("abc123", str(model_dir))
        assert again.value.kind is ErrorKind.ALREADY_EXISTS
        async with h.models.use("abc123") as model:
            assert model.key == "abc123"
        await h.models.unload("abc123")
        assert model_dir.is_dir(), "a directory the cache did not create is not deleted"
        for call in (h.models.unload("abc123"), h.models.load("x", str(tmp_path / "nowhere"))):
            with pytest.raises(ModelhostError) as missing:
                await call
            assert missing.value.kind is ErrorKind.NOT_FOUND

    asyncio.run(scenario())


def test_management_load_refuses_names_and_urls_outside_the_load_roots(tmp_path: Path) -> None:
    outside = tmp_path.parent / f"{tmp_path.name}-outside"
    outside.mkdir()
    (tmp_path / "link").symlink_to(outside, target_is_directory=True)

    async def scenario() -> None:
        h = Harness(tmp_path)
        for name, url in [("m", str(outside)), ("m", str(tmp_path / "link")), ("m", f"{tmp_path}/../{outside.name}"),
                          ("m", "/"), ("m", "relative/dir"), ("m", "a\x00b"), ("../m", str(tmp_path)),
                          ("a/b", str(tmp_path)), ("", str(tmp_path)), ("m\x00", str(tmp_path))]:
            with pytest.raises(ModelhostError) as refused:
                await h.models.load(name, url)
            assert refused.value.kind is ErrorKind.INVALID_INPUT, (name, url)
            assert ("--allow-model-load-from" if name == "m" else "model_name") in refused.value.message
            assert str(outside) not in refused.value.message or str(outside) in url  # only what the client sent
        assert h.loaded() == []
        with pytest.raises(ModelhostError) as bad_name:
            h.models.get("..")
        assert bad_name.value.kind is ErrorKind.INVALID_INPUT

    asyncio.run(scenario())


def test_a_failing_load_hook_unloads_the_model(tmp_path: Path) -> None:
    async def broken(model: TargetModel) -> None:
        raise ModelhostError(ErrorKind.UNAVAILABLE, "model_fn failed: boom")

    async def scenario() -> None:
        h = Harness(tmp_path, on_load=broken)
        with pytest.raises(ModelhostError, match="boom"):
            await h.infer("model-0.tar.gz")
        assert h.loaded() == [] and h.manager.served() == []
        assert await h.model_dirs(0) == []

    asyncio.run(scenario())


def test_an_archive_holding_a_named_model_directory_serves_it_under_the_target(tmp_path: Path) -> None:
    from tests.archives import weighted_model, write_archive

    model = tmp_path / "m.onnx"
    onnx.save_model(weighted_model(5.0), str(model))
    config = b'name: "ranker"\nplatform: "onnxruntime_onnx"\nmax_batch_size: 8\n'
    members = {"ranker/config.pbtxt": config, "ranker/1/model.onnx": model.read_bytes()}

    async def scenario() -> None:
        h = Harness(tmp_path, count=0)
        write_archive(tmp_path / "archives" / "ranker.tar.gz", members)
        async with h.models.use_target("ranker.tar.gz") as cached:
            assert cached.served == {"ranker": "ranker.tar.gz"}
            served = h.manager.get("ranker.tar.gz")
            assert served.config.max_batch_size == 8
        await h.stop()

    asyncio.run(scenario())


_PROCESS_STATE: list[bytearray] = []  # what a load's hook leaves behind for the whole process


def test_a_load_over_the_whole_budget_does_not_poison_later_loads(tmp_path: Path) -> None:
    """A load that leaves process-wide state (a framework import in user code) is charged it when its first request
    ends, more than the whole budget: it is evicted, and its key's figure forgotten, so the cache is then empty,
    uses 0 bytes, and the next loads, measured again, fit (the key used to stay charged and refuse every later load)."""
    async def import_a_framework_once(model: TargetModel) -> None:
        if not _PROCESS_STATE:
            _PROCESS_STATE.append(bytearray(8 << 20))

    async def scenario() -> None:
        _PROCESS_STATE.clear()
        h = Harness(tmp_path, budget=4 << 20, on_load=import_a_framework_once)
        assert await h.infer("model-0.tar.gz") == 0.0
        await until(lambda: h.loaded() == [], "the model over the budget evicted")
        assert h.cache.used_bytes == 0 and h.cache.statistics.evictions == 1
        assert await h.infer("model-0.tar.gz") == 0.0
        assert await h.infer("model-1.tar.gz") == 1.0
        assert h.loaded() == ["model-0.tar.gz", "model-1.tar.gz"]
        assert 0 < h.cache.used_bytes <= h.cache.budget_bytes
        await h.stop()
        assert h.cache.used_bytes == 0

    try:
        asyncio.run(scenario())
    finally:
        _PROCESS_STATE.clear()


@pytest.mark.skipif(not COUNTS_FREES, reason="needs glibc's mallinfo2 (freed memory counted)")
async def _known_then_two_loaded(h: Harness) -> None:
    """Models 2 and 3 loaded once and unloaded (so their sizes are known, and their loads may run at once), then
    models 0 and 1 loaded."""
    for i in (2, 3):
        await h.infer(f"model-{i}.tar.gz")
        await h.models.unload(f"model-{i}.tar.gz")
    for i in (0, 1):
        await h.infer(f"model-{i}.tar.gz")


def test_misses_making_room_at_once_evict_together(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two misses that each need a victim evict both at once, not one after the other (each reserves its room
    when it chooses), and neither loads before the memory of both victims is free."""
    gate = threading.Event()
    unloading: list[str] = []
    unload = OnnxModel.unload

    def held_unload(self: OnnxModel) -> None:
        unloading.append(threading.current_thread().name)
        gate.wait(10)
        unload(self)

    async def scenario() -> None:
        h = Harness(tmp_path, count=4)
        await _known_then_two_loaded(h)
        # Room for the two and a megabyte: each miss's expected peak (more than a model holds once run) needs a
        # victim, and both fit once both victims are gone.
        h.cache.budget_bytes = h.cache.used_bytes + (1 << 20)
        monkeypatch.setattr(OnnxModel, "unload", held_unload)
        misses = [asyncio.create_task(h.infer(f"model-{i}.tar.gz")) for i in (2, 3)]
        try:
            await until(lambda: len(unloading) == 2, "both victims to unload at once")
            await asyncio.sleep(0.05)
            assert not any(miss.done() for miss in misses)
            assert loading_threads.requests_wait()  # (others' requests yield to these: Scheduler._may_run_now)
        finally:
            gate.set()
        assert await asyncio.gather(*misses) == [2.0, 3.0]
        assert not loading_threads.requests_wait()
        assert h.loaded() == ["model-2.tar.gz", "model-3.tar.gz"]
        await h.stop()

    asyncio.run(scenario())


def test_misses_whose_peaks_do_not_fit_together_both_finish(tmp_path: Path) -> None:
    """A budget that holds two models but not two loads' expected peaks: two misses at once both finish, one
    after the other, instead of each evicting the other's new model before its request has run it (and so on)."""
    async def scenario() -> None:
        h = Harness(tmp_path, count=4)
        await _known_then_two_loaded(h)
        h.cache.budget_bytes = h.cache.used_bytes
        evictions = h.cache.statistics.evictions
        misses = asyncio.gather(h.infer("model-2.tar.gz"), h.infer("model-3.tar.gz"))
        assert await asyncio.wait_for(misses, 10) == [2.0, 3.0]
        assert h.cache.statistics.evictions - evictions <= 3  # models 0 and 1, then one of the two
        await h.stop()

    asyncio.run(scenario())


def test_memory_stays_within_the_budget_during_loads(tmp_path: Path) -> None:
    """Models of 4 MiB files (8 MiB held once run, about 9 MiB at a load's peak) through a 20 MiB budget, more than
    the budget in total: the cache makes room for a load's peak before it starts, and charges each model what it
    holds after its first request, so the process's own count of bytes in use, less what it held besides the
    models, never passes the budget."""
    width = 1 << 20
    budget = 20 << 20
    highest = charged = 0
    sampling = True

    def sample(cache: ModelCache, besides: int) -> None:
        nonlocal highest, charged
        while sampling:
            highest = max(highest, held_bytes() - besides)
            charged = max(charged, cache.used_bytes)
            time.sleep(0.0005)

    async def scenario() -> None:
        nonlocal sampling
        h = Harness(tmp_path, count=6, budget=budget, width=width)
        await h.infer("model-5.tar.gz")  # onnxruntime's own state, held from here on, is not a model's
        sampler = threading.Thread(target=sample, args=(h.cache, held_bytes() - h.cache.used_bytes))
        sampler.start()
        try:
            for i in (0, 1, 2, 3, 4, 0, 1, 5, 2):
                assert await h.infer(f"model-{i}.tar.gz") == float(i)
        finally:
            sampling = False
            sampler.join()
        assert h.cache.statistics.evictions >= 5
        await h.stop()

    gc.collect()
    asyncio.run(scenario())
    assert 0 < charged <= budget
    assert 0 < highest <= budget, f"held {highest / 2**20:.2f} MiB with a {budget / 2**20:.0f} MiB budget"


def test_an_evicted_archive_reloads_from_its_kept_copy_until_it_changes(tmp_path: Path) -> None:
    async def scenario() -> None:
        h = Harness(tmp_path, unpacked_cache_bytes=1 << 30)
        await h.infer("model-0.tar.gz")
        first = h.models.get("model-0.tar.gz").work_dir
        await h.models.unload("model-0.tar.gz")
        await until(lambda: h.models.copies.kept_bytes >= WIDTH * 4, "the unloaded model's files kept")
        assert await h.infer("model-0.tar.gz") == 0.0
        assert h.models.get("model-0.tar.gz").work_dir == first  # the same files, not unpacked again
        assert sum(h.cache.statistics.download.counts) == 1 and sum(h.cache.statistics.load.counts) == 2
        await h.models.unload("model-0.tar.gz")
        archive = tmp_path / "archives" / "model-0.tar.gz"
        (tmp_path / "archives" / "model-3.tar.gz").replace(archive)  # a new archive under the same name
        assert await h.infer("model-0.tar.gz") == 3.0
        assert sum(h.cache.statistics.download.counts) == 2
        await h.stop()

    asyncio.run(scenario())
