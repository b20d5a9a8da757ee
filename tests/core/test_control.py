"""Repository control's rules that no single server shows: several servers' indexes as one (Ray Serve's
replicas), each version in the most a server says of it; loads and unloads refused to clients whatever mode the
manager runs in; of two workers' changes to one model (--workers), the later wins everywhere."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from modelhost.core.control import Control, ControlChange, merged_index
from modelhost.core.load_request import LoadRequest
from modelhost.core.manager import ModelManager
from modelhost.core.model_record import IndexEntry
from modelhost.core.worker_control import WorkerControl, encode
from modelhost.core.worker_statistics import WorkerStatistics
from modelhost.errors import ErrorKind, ModelhostError
from modelhost.store.local import LocalStore
from tests.onnx_models import scale_model, write_model


def test_a_version_takes_the_state_of_the_server_that_says_most_of_it() -> None:
    first = [IndexEntry("a", "1", "READY", ""), IndexEntry("b", "1", "UNAVAILABLE", "unloaded"),
             IndexEntry("c", "", "", ""), IndexEntry("d", "", "", "")]
    second = [IndexEntry("a", "1", "UNAVAILABLE", "unloaded"), IndexEntry("a", "2", "LOADING", ""),
              IndexEntry("b", "", "", ""), IndexEntry("c", "10", "READY", ""), IndexEntry("c", "9", "READY", ""),
              IndexEntry("d", "", "", "")]
    assert merged_index([first, second]) == [
        IndexEntry("a", "1", "READY", ""), IndexEntry("a", "2", "LOADING", ""),
        IndexEntry("b", "1", "UNAVAILABLE", "unloaded"),  # a version known anywhere hides the name-only entry
        IndexEntry("c", "9", "READY", ""), IndexEntry("c", "10", "READY", ""),
        IndexEntry("d", "", "", "")]
    assert merged_index([second, first]) == merged_index([first, second])
    assert merged_index([[], first]) == sorted(first, key=lambda e: e.name)


def test_an_operator_may_refuse_clients_loads_and_unloads_in_explicit_mode(tmp_path: Path) -> None:
    write_model(tmp_path, "m", scale_model(2.0), None)
    control = Control(ModelManager(LocalStore(tmp_path), 1, 4), "explicit", LocalStore(tmp_path))

    async def attempt() -> None:
        await control.load("m")  # explicit: allowed
        control.refuse_changes("none", "models load when a request first names them")
        for change in (control.load("m"), control.unload("m")):
            with pytest.raises(ModelhostError) as refused:
                await change
            assert refused.value.kind is ErrorKind.UNAVAILABLE
            assert "model control mode is 'none' (models load when a request first names them)" in \
                refused.value.message
        assert [entry.state for entry in await control.index() if entry.name == "m"] == ["READY"]

    asyncio.run(attempt())


def test_a_workers_change_older_than_its_own_is_not_made(tmp_path: Path) -> None:
    write_model(tmp_path / "repo", "m", scale_model(2.0), None)
    store = LocalStore(tmp_path / "repo")
    manager = ModelManager(store, 1, 4)
    control = Control(manager, "explicit", store)
    workers = WorkerControl(control, WorkerStatistics(tmp_path, 0, 1), index=0)  # no other worker to tell
    control.on_change(workers.announced)

    def sized(size: int) -> LoadRequest:
        return LoadRequest(f'{{"max_batch_size": {size}, "platform": "onnxruntime_onnx"}}')

    async def changes() -> list[int]:
        sizes = []
        await control.load("m", sized(2))  # this worker's, stamped now
        sizes.append(manager.get("m").config.max_batch_size)
        older = ControlChange("m", sized(3))
        assert await workers.adopt(encode(older, (1, 1))) == ""  # made by worker 1 long ago: not made here
        sizes.append(manager.get("m").config.max_batch_size)
        assert await workers.adopt(encode(older, (2**62, 1))) == ""  # made later than this worker's: made
        sizes.append(manager.get("m").config.max_batch_size)
        assert "does not decode" in await workers.adopt(b"{}")
        for served in manager.served():
            await served.scheduler.stop()
        return sizes

    assert asyncio.run(changes()) == [2, 2, 3]
