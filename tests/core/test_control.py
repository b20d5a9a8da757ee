"""Repository control's rules that no single server shows: several servers' indexes as one (Ray Serve's
replicas), each version in the most a server says of it; loads and unloads refused to clients whatever mode the
manager runs in."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from modelhost.core.control import Control, merged_index
from modelhost.core.manager import ModelManager
from modelhost.core.model_record import IndexEntry
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
