"""The model manager on a real repository of ONNX models: version policies, loads, zero-downtime reloads,
unloads and repository changes (the manager directly, no server)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest

from modelhost.config.pbtxt import config_to_json, parse_config
from modelhost.core.dataplane import DataPlane
from modelhost.core.load_request import LoadRequest, check_load_request
from modelhost.core.manager import ModelManager
from modelhost.core.model_hold import Pins
from modelhost.core.repository_poll import RepositoryPoller
from modelhost.core.served_model import ServedModel
from modelhost.errors import ErrorKind, ModelhostError
from modelhost.store.local import LocalStore
from modelhost.types import InferRequest
from tests.helpers import run
from tests.onnx_models import scale_model, write_model

CONFIG = """
platform: "onnxruntime_onnx"
max_batch_size: 8
{extra}
input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] }} ]
"""


def write_versions(repo: Path, name: str, versions: dict[int, float], extra: str = "") -> Path:
    """repo/name/<v>/model.onnx multiplying by versions[v]."""
    for version, factor in versions.items():
        model_dir = write_model(repo, name, scale_model(factor), CONFIG.format(extra=extra), version=version)
    return model_dir


def manager_for(repo: Path, tmp_path: Path) -> ModelManager:
    return ModelManager(LocalStore(repo), 2, 4, work_dir=tmp_path / "work")


@contextlib.asynccontextmanager
async def serving(repo: Path, tmp_path: Path, load: bool = True) -> AsyncIterator[tuple[ModelManager, DataPlane]]:
    """A manager (every model loaded, unless `load` is false) and its data plane; stopped at exit."""
    manager = manager_for(repo, tmp_path)
    if load:
        await manager.load_all()
    try:
        yield manager, DataPlane(manager, "test", True)
    finally:
        await manager.stop()


async def factor_of(dataplane: DataPlane, name: str, version: str = "") -> float:
    x = np.ones((1, 4), np.float32)
    response = await dataplane.infer(InferRequest(name, {"INPUT0": x}, model_version=version))
    return float(response.outputs["OUTPUT0"][0, 0])


def touch(path: Path) -> None:
    """Change the modification time as a rewrite would, even on a file system with coarse timestamps."""
    stat = path.stat()
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))


# --------------------------------------------------------------------------- version policies


@pytest.mark.parametrize(("policy", "served"), [
    ("", [3]),
    ("version_policy: { latest { num_versions: 2 } }", [2, 3]),
    ("version_policy: { all { } }", [1, 2, 3]),
    ("version_policy: { specific { versions: [ 1, 3 ] } }", [1, 3]),
])
def test_version_policy_selects_versions(tmp_path: Path, policy: str, served: list[int]) -> None:
    repo = tmp_path / "repo"
    write_versions(repo, "m", {1: 1.0, 2: 2.0, 3: 3.0}, policy)

    async def body() -> None:
        async with serving(repo, tmp_path) as (manager, dataplane):
            assert manager.versions("m") == served
            # A request without a version goes to the highest loaded one.
            assert await factor_of(dataplane, "m") == float(served[-1])
            for version in served:
                assert await factor_of(dataplane, "m", str(version)) == float(version)
            for version in {1, 2, 3} - set(served):
                with pytest.raises(ModelhostError) as error:
                    await factor_of(dataplane, "m", str(version))
                assert error.value.kind is ErrorKind.NOT_FOUND

    run(body())


def test_specific_version_without_directory_fails_alone(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    write_versions(repo, "m", {1: 1.0}, "version_policy: { specific { versions: [ 1, 4 ] } }")
    write_versions(repo, "other", {1: 5.0})

    async def body() -> None:
        async with serving(repo, tmp_path) as (manager, dataplane):
            entries = {e.name: e for e in manager.index()}
            assert entries["m"].state == "UNAVAILABLE"
            assert "version(s) [4]" in entries["m"].reason
            assert manager.versions("other") == [1]

    run(body())


# --------------------------------------------------------------------------- load, reload, unload


def test_reload_swaps_in_the_new_files(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    model_dir = write_versions(repo, "m", {1: 2.0})

    async def body() -> None:
        async with serving(repo, tmp_path) as (manager, dataplane):
            old = manager.get("m")
            assert await factor_of(dataplane, "m") == 2.0
            write_versions(repo, "m", {1: 7.0})
            await manager.load("m")
            assert await factor_of(dataplane, "m") == 7.0
            assert manager.get("m") is not old
            await asyncio.sleep(0)
            assert old.scheduler.inflight() == 0
            assert [e.state for e in manager.index()] == ["READY"]
        assert model_dir.exists()

    run(body())


def test_requests_during_a_reload_all_succeed(tmp_path: Path) -> None:
    """Requests queued on the old version finish on it; later ones go to the new one; none fails."""
    repo = tmp_path / "repo"
    write_versions(repo, "m", {1: 2.0}, "dynamic_batching { max_queue_delay_microseconds: 2000 }")

    async def body() -> None:
        async with serving(repo, tmp_path) as (manager, dataplane):
            results: list[float] = []
            stop = asyncio.Event()

            async def client() -> None:
                while not stop.is_set():
                    results.append(await factor_of(dataplane, "m"))

            clients = [asyncio.create_task(client()) for _ in range(8)]
            await asyncio.sleep(0.05)
            write_versions(repo, "m", {1: 3.0}, "dynamic_batching { max_queue_delay_microseconds: 2000 }")
            await manager.load("m")
            await asyncio.sleep(0.05)
            stop.set()
            await asyncio.gather(*clients)  # raises if any request failed
        assert set(results) == {2.0, 3.0}
        switched = results.index(3.0)
        assert 2.0 not in results[switched + 8:], "requests went to the old version long after the swap"

    run(body())


def test_failed_reload_keeps_the_loaded_version(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    model_dir = write_versions(repo, "m", {1: 2.0})

    async def body() -> None:
        async with serving(repo, tmp_path) as (manager, dataplane):
            (model_dir / "1" / "model.onnx").write_bytes(b"not an onnx model")
            with pytest.raises(ModelhostError) as error:
                await manager.load("m")
            assert error.value.kind is ErrorKind.UNAVAILABLE
            assert "version 1" in error.value.message and "model.onnx" in error.value.message
            assert await factor_of(dataplane, "m") == 2.0
            assert [(e.version, e.state) for e in manager.index()] == [("1", "READY")]
            # A broken config keeps it too.
            (model_dir / "config.pbtxt").write_text("max_batch_size: eight")
            with pytest.raises(ModelhostError):
                await manager.load("m")
            assert await factor_of(dataplane, "m") == 2.0

    run(body())


def test_unload_then_load_again(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    write_versions(repo, "m", {1: 2.0})

    async def body() -> None:
        async with serving(repo, tmp_path) as (manager, dataplane):
            dataplane.mark_started()
            served = manager.get("m")
            await manager.unload("m")
            assert served.scheduler.inflight() == 0
            with pytest.raises(ModelhostError) as error:
                manager.get("m")
            assert error.value.kind is ErrorKind.NOT_FOUND and "unloaded" in error.value.message
            assert [(e.version, e.state, e.reason) for e in manager.index()] == [("1", "UNAVAILABLE", "unloaded")]
            assert dataplane.ready(), "a model unloaded on request does not make a strict server unready"
            await manager.load("m")
            assert await factor_of(dataplane, "m") == 2.0

    run(body())


def test_load_of_a_model_not_in_the_repository(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    write_versions(repo, "m", {1: 2.0})

    async def body() -> None:
        manager = manager_for(repo, tmp_path)
        with pytest.raises(ModelhostError) as error:
            await manager.load("nope")
        assert error.value.kind is ErrorKind.NOT_FOUND and "nope" in error.value.message
        assert manager.index() == []
        with pytest.raises(ModelhostError) as error:
            await manager.unload("nope")
        assert error.value.kind is ErrorKind.NOT_FOUND

    run(body())


def test_load_with_a_config_override(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    write_versions(repo, "m", {1: 2.0})

    async def body() -> None:
        async with serving(repo, tmp_path) as (manager, dataplane):
            assert manager.get("m").config.max_batch_size == 8
            text = CONFIG.format(extra="").replace("max_batch_size: 8", "max_batch_size: 2")
            config = config_to_json(parse_config(text))
            override = check_load_request("m", LoadRequest(orjson.dumps(config).decode()))
            await manager.load("m", override)
            assert manager.get("m").config.max_batch_size == 2

    run(body())


def test_load_with_override_files(tmp_path: Path) -> None:
    """Files and a config make the model's directory; the repository's own files are not used."""
    repo = tmp_path / "repo"
    write_versions(repo, "m", {1: 2.0})
    async def body() -> None:
        async with serving(repo, tmp_path, load=False) as (manager, dataplane):
            config = orjson.dumps(config_to_json(parse_config(CONFIG.format(extra="")))).decode()
            files = {"file:5/model.onnx": scale_model(9.0).SerializeToString()}
            await manager.load("m", check_load_request("m", LoadRequest(config, files)))
            assert manager.versions("m") == [5]
            assert await factor_of(dataplane, "m") == 9.0

    run(body())


@pytest.mark.parametrize(("request_", "message"), [
    (LoadRequest(None, {"file:1/model.onnx": b"x"}), "need a 'config' parameter"),
    (LoadRequest("{}", {"file:../escape": b"x"}), "file:<version>/<path>"),
    (LoadRequest("{}", {"file:/etc/passwd": b"x"}), "file:<version>/<path>"),
    (LoadRequest("{}", {"file:model.onnx": b"x"}), "file:<version>/<path>"),
    (LoadRequest('{"max_batch_size": "eight"}'), "load parameter 'config'"),
    (LoadRequest(None, {}, ("bogus",)), "unknown load parameter 'bogus'"),
])
def test_bad_load_requests(request_: LoadRequest, message: str) -> None:
    with pytest.raises(ModelhostError) as error:
        check_load_request("m", request_)
    assert error.value.kind is ErrorKind.INVALID_INPUT
    assert message in error.value.message and "'m'" in error.value.message


# --------------------------------------------------------------------------- repository changes (poll)


def test_repository_changes_apply(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    model_dir = write_versions(repo, "m", {1: 1.0})

    async def body() -> None:
        store = LocalStore(repo)
        manager = ModelManager(store, 2, 4)
        dataplane = DataPlane(manager, "test", False)
        poller = RepositoryPoller(manager, store, 60)
        await manager.load_all()
        try:
            await poller.poll()  # nothing changed: nothing reloads
            first = manager.get("m")
            assert manager.get("m") is first

            write_versions(repo, "m", {2: 2.0})  # a new version replaces the latest
            await poller.poll()
            assert manager.versions("m") == [2]
            assert await factor_of(dataplane, "m") == 2.0

            write_versions(repo, "m", {2: 5.0})  # version 2's file rewritten in place
            touch(model_dir / "2" / "model.onnx")
            await poller.poll()
            assert await factor_of(dataplane, "m") == 5.0

            (model_dir / "config.pbtxt").write_text(CONFIG.format(extra="version_policy: { all { } }"))
            touch(model_dir / "config.pbtxt")
            await poller.poll()
            assert manager.versions("m") == [1, 2]

            shutil.rmtree(model_dir / "1")
            await poller.poll()
            assert manager.versions("m") == [2]

            write_versions(repo, "n", {1: 3.0})  # a new model
            await poller.poll()
            assert await factor_of(dataplane, "n") == 3.0

            (model_dir / "2" / "model.onnx").write_bytes(b"broken")  # a broken change keeps what serves
            touch(model_dir / "2" / "model.onnx")
            await poller.poll()
            assert await factor_of(dataplane, "m") == 5.0

            shutil.rmtree(repo / "n")  # a removed model unloads
            await poller.poll()
            assert "n" not in manager.names()
        finally:
            await poller.stop()
            await manager.stop()

    run(body())


def test_a_held_version_serves_its_request_after_a_reload_swaps_it_out(tmp_path: Path) -> None:
    """acquire() pins the version it gives: a request that awaits between the lookup and its submit (here the
    whole reload happens in that gap) still runs on the version it got, which stops only once released."""
    repo = tmp_path / "repo"
    write_versions(repo, "m", {1: 2.0})
    x = np.ones((1, 4), np.float32)

    async def body() -> None:
        async with serving(repo, tmp_path) as (manager, _):
            async with manager.acquire("m") as held:
                write_versions(repo, "m", {1: 5.0})
                await manager.load("m")  # swaps in the new version; the held one must not stop under us
                await asyncio.sleep(0.05)
                assert manager.get("m") is not held
                outputs = await held.scheduler.submit({"INPUT0": x}, ["OUTPUT0"], 1)
                assert outputs["OUTPUT0"].tolist() == [[2.0] * 4]
            await asyncio.sleep(0.05)
            with pytest.raises(ModelhostError, match="stopping"):  # released: now it drains and stops
                await held.scheduler.submit({"INPUT0": x}, ["OUTPUT0"], 1)
            new = manager.get("m")
            assert (await new.scheduler.submit({"INPUT0": x}, ["OUTPUT0"], 1))["OUTPUT0"].tolist() == [[5.0] * 4]

    run(body())


def test_requests_that_await_between_lookup_and_submit_survive_reloads(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """The data plane's request path with an await put between looking the model up and queueing the request:
    eight clients through five reloads, and not one request fails."""
    repo = tmp_path / "repo"
    write_versions(repo, "m", {1: 1.0})
    original = ServedModel.run

    async def with_a_gap(self: ServedModel, *args: Any, **kwargs: Any) -> Any:
        await asyncio.sleep(0.002)
        return await original(self, *args, **kwargs)

    monkeypatch.setattr(ServedModel, "run", with_a_gap)

    async def body() -> None:
        async with serving(repo, tmp_path) as (manager, dataplane):
            stop = asyncio.Event()
            results: list[float] = []

            async def client() -> None:
                while not stop.is_set():
                    results.append(await factor_of(dataplane, "m"))

            clients = [asyncio.create_task(client()) for _ in range(8)]
            for factor in (2.0, 3.0, 4.0, 5.0, 6.0):
                write_versions(repo, "m", {1: factor})
                await manager.load("m")
                await asyncio.sleep(0.02)
            stop.set()
            await asyncio.gather(*clients)  # raises if any request failed
            assert results and results[-1] == 6.0

    run(body())


def test_decode_and_infer_looks_the_model_up_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A front-end that decodes against the model's signature (TF Serving rows, SageMaker CSV) gets the metadata
    and runs the request on one lookup of one held version."""
    repo = tmp_path / "repo"
    write_versions(repo, "m", {1: 2.0})
    lookups: list[str] = []
    original = ModelManager.get

    def counted(self: ModelManager, name: str, version: str = "") -> Any:
        lookups.append(name)
        return original(self, name, version)

    monkeypatch.setattr(ModelManager, "get", counted)

    def decode(metadata: Any) -> tuple[InferRequest, str]:
        name = metadata.inputs[0].name
        return InferRequest("", {name: np.ones((1, 4), np.float32)}), name

    async def body() -> None:
        async with serving(repo, tmp_path) as (manager, dataplane):
            lookups.clear()
            response, decoded = await dataplane.decode_and_infer("m", "", decode)
            assert lookups == ["m"] and decoded == "INPUT0"
            assert response.model_name == "m" and response.outputs["OUTPUT0"].tolist() == [[2.0] * 4]
            assert manager.get("m").pins.count == 0

    run(body())


def test_every_waiter_on_a_versions_pins_wakes_when_the_last_request_lets_go() -> None:
    async def scenario() -> None:
        pins = Pins()
        pins.hold()
        pins.hold()
        waiters = [asyncio.ensure_future(pins.released()) for _ in range(3)]
        await asyncio.sleep(0)
        pins.release()
        await asyncio.sleep(0)
        assert not any(w.done() for w in waiters)
        pins.release()
        await asyncio.wait_for(asyncio.gather(*waiters), 1)
        await pins.released()  # at once, none held

    asyncio.run(scenario())


class RecordingBudget:
    """A LoadBudget that admits or refuses after the load, and records what the manager told it."""

    def __init__(self, refuse: set[str] = frozenset()) -> None:  # type: ignore[assignment]
        self.refuse = refuse
        self.admitted: list[str] = []
        self.removed_names: list[str] = []
        self.used_names: list[str] = []

    @contextlib.asynccontextmanager
    async def admitting(self, name: str, source: Any) -> AsyncIterator[None]:
        self.admitted.append(name)
        yield
        if name in self.refuse:
            raise ModelhostError(ErrorKind.NO_MEMORY, f"model '{name}' does not fit")

    def removed(self, name: str) -> None:
        self.removed_names.append(name)

    def used(self, name: str) -> None:
        self.used_names.append(name)


def test_a_budget_admits_first_loads_and_hears_of_every_removal(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    for name in ("a", "b", "big"):
        write_versions(repo, name, {1: 2.0})
    budget = RecordingBudget(refuse={"big"})

    async def main() -> None:
        manager = manager_for(repo, tmp_path)
        manager.set_budget(budget)
        try:
            await manager.load("a")
            await manager.load("a")  # a reload keeps the admission it had
            await manager.load_all(["b"])
            with pytest.raises(ModelhostError) as caught:
                await manager.load("big")
            assert caught.value.kind is ErrorKind.NO_MEMORY
            assert manager.served("big") == []  # loaded, refused, unloaded: nothing of it serves
            assert "does not fit" in next(e.reason for e in manager.index() if e.name == "big")
            await manager.unload("a")
            await manager.evict("b")
        finally:
            await manager.stop()

    run(main())
    assert budget.admitted == ["a", "b", "big"]
    assert budget.removed_names == ["a", "b"]
