"""A reload of a kept, unchanged copy takes the plans of its last load; any other load plans anew."""

from __future__ import annotations

import asyncio
import tarfile
from pathlib import Path

import onnx

from modelhost.core.model_loading import LoadPlan
from modelhost.store.local import ModelSource
from tests.archives import WIDTH, weighted_model
from tests.helpers import until
from tests.protocols.test_sagemaker_target_models import Harness

KEY = "model-0.tar.gz"


def counting(h: Harness) -> list[str]:
    """The names the manager plans, as it plans them."""
    planned: list[str] = []
    plan = h.manager.plan

    def noted(source: ModelSource) -> LoadPlan:
        planned.append(source.name)
        return plan(source)

    h.manager.plan = noted  # type: ignore[method-assign]
    return planned


async def unload_and_keep(h: Harness) -> None:
    """Unload KEY and wait for its files to be kept (that happens in the background)."""
    await h.models.unload(KEY)
    await until(lambda: h.models.copies.kept_bytes > 0, "the unloaded model's files kept")


def test_a_reload_of_a_kept_copy_is_not_planned_again(tmp_path: Path) -> None:
    async def scenario() -> None:
        h = Harness(tmp_path, unpacked_cache_bytes=1 << 30)
        planned = counting(h)
        for _ in range(3):
            assert await h.infer(KEY) == 0.0
            await unload_and_keep(h)
        assert planned == [KEY]
        await h.stop()

    asyncio.run(scenario())


def test_a_changed_archive_is_planned_and_served_anew(tmp_path: Path) -> None:
    async def scenario() -> None:
        h = Harness(tmp_path, unpacked_cache_bytes=1 << 30)
        planned = counting(h)
        assert await h.infer(KEY) == 0.0
        await unload_and_keep(h)
        source = tmp_path / "changed.onnx"
        onnx.save_model(weighted_model(7.0, WIDTH), str(source))
        with tarfile.open(tmp_path / "archives" / KEY, "w:gz") as archive:
            archive.add(source, arcname="model.onnx")
        assert await h.infer(KEY) == 7.0
        assert planned == [KEY, KEY]
        await unload_and_keep(h)
        assert await h.infer(KEY) == 7.0  # and that copy, kept, is not planned again
        assert planned == [KEY, KEY]
        await h.stop()

    asyncio.run(scenario())


def test_copies_not_kept_are_planned_at_every_load(tmp_path: Path) -> None:
    async def scenario() -> None:
        h = Harness(tmp_path)  # no unpacked copies kept: each load unpacks the archive again
        planned = counting(h)
        for _ in range(2):
            assert await h.infer(KEY) == 0.0
            await h.models.unload(KEY)
        assert planned == [KEY, KEY]
        await h.stop()

    asyncio.run(scenario())


def test_plans_are_recalled_only_for_the_very_copy_they_were_made_from(tmp_path: Path) -> None:
    from dataclasses import replace

    from modelhost.protocols.sagemaker.planned_copies import PlannedCopies
    from modelhost.store.archive_models import FetchedModels
    from modelhost.store.layout import ModelLayout

    directory = tmp_path / "0-model"
    directory.mkdir()
    copy = FetchedModels(directory, ModelLayout(directory, ("model",), None), 1, None, directory, "stamp-1")
    plans: PlannedCopies[str] = PlannedCopies(capacity=2)
    plans.remember(KEY, copy, "plans")
    assert plans.recall(KEY, replace(copy)) == "plans"
    assert plans.recall(KEY, replace(copy, stamp="stamp-2")) is None  # the archive changed
    assert plans.recall("other", copy) is None
    made_again = tmp_path / "again"
    made_again.mkdir()  # (while the first exists: another inode)
    directory.rmdir()
    made_again.rename(directory)  # the copy deleted, and a directory made again at its path
    assert plans.recall(KEY, copy) is None
    plans.remember(KEY, replace(copy, stamp=None), "plans")  # a directory used in place: nothing kept
    plans.remember("a", copy, "a")
    plans.remember("b", copy, "b")  # beyond the capacity: the oldest goes
    assert plans.recall(KEY, copy) is None and plans.recall("b", copy) == "b"
