"""TableWatcher: new versions made current from outside are swapped in; delta files are applied, bad ones set
aside with the reason logged."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest

from modelhost.embeddings.store import EmbeddingStore, StoreSettings
from modelhost.embeddings.table_files import write_version
from modelhost.embeddings.watcher import DELTAS, TableWatcher

DIM = 4


def test_new_versions_and_delta_files_reach_the_served_table(tmp_path: Path,
                                                             caplog: pytest.LogCaptureFixture) -> None:
    table = tmp_path / "t"
    write_version(table, np.arange(10), np.zeros((10, DIM), np.float32), "float32")
    store = EmbeddingStore(StoreSettings(cache_bytes=1 << 12, io_threads=2))
    handle = store.open(table, "t")
    watcher = TableWatcher(store, poll_seconds=60)
    watcher.check_now()
    assert handle.table.version.name == "v1"

    write_version(table, np.arange(10), np.ones((10, DIM), np.float32), "float32")
    watcher.check_now()
    assert handle.table.version.name == "v2"
    np.testing.assert_array_equal(handle.lookup(np.array([3])), np.ones((1, DIM)))

    (table / DELTAS).mkdir()
    np.savez(table / DELTAS / "0001.npz", ids=np.array([3, 42]), vectors=np.full((2, DIM), 7.0))
    np.savez(table / DELTAS / "0002.npz", ids=np.array([5]), vectors=np.zeros((1, DIM + 1)))  # wrong dim
    (table / DELTAS / "0003.npz").write_bytes(b"not a zip")
    with open(table / DELTAS / "0004.npz.partial", "wb") as partial:  # still being written
        np.savez(partial, ids=np.array([6]), vectors=np.zeros((1, DIM)))
    with caplog.at_level(logging.ERROR, logger="modelhost.embeddings"):
        watcher.check_now()
    np.testing.assert_array_equal(handle.lookup(np.array([3, 42, 5])),
                                  np.vstack([np.full((2, DIM), 7.0), np.ones((1, DIM))]))
    assert sorted(path.name for path in (table / DELTAS).iterdir()) == [
        "0002.npz.rejected", "0003.npz.rejected", "0004.npz.partial"]
    assert "0002.npz rejected: 'vectors' must be [1, 4], is [1, 5]" in caplog.text
    assert "0003.npz rejected: not a readable .npz file" in caplog.text
    store.close()


def test_updates_are_refused_where_several_processes_serve_the_table(tmp_path: Path) -> None:
    write_version(tmp_path / "t", np.arange(3), np.zeros((3, DIM), np.float32), "float32")
    store = EmbeddingStore(StoreSettings(cache_bytes=1 << 12, io_threads=1, updates=False))
    handle = store.open(tmp_path / "t", "t")
    with pytest.raises(Exception, match="need a server of one process"):
        handle.update(np.array([1]), np.zeros((1, DIM), np.float32))
    store.close()
