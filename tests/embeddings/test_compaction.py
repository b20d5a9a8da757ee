"""Compaction of a table's delta log into a new version (compaction.py, table_rewrite.py): updates made while it
runs are all visible after it and after a restart, lookups meanwhile never see a torn or foreign vector, the cache
is handed over, the log's size starts it, and a process killed at any step restarts with every acknowledged
update."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from modelhost.cli import modelhost_settings
from modelhost.embeddings import compaction, table_rewrite
from modelhost.embeddings.store import EmbeddingStore, StoreSettings
from modelhost.embeddings.table import EmbeddingTable
from modelhost.embeddings.table_files import CURRENT, write_version
from modelhost.embeddings.watcher import TableWatcher
from modelhost.settings import ServerSettings, SettingsError
from modelhost.settings_checks import check_settings

DIM = 8
ROWS = 3000
IDS = np.arange(ROWS, dtype=np.int64) * 7919 - 10**6


def uniform(values: np.ndarray) -> np.ndarray:
    """Each row's vector all one value (id i at version v: base(i) * 1000 + v, so a torn one shows)."""
    return np.repeat(values.astype(np.float32)[:, None], DIM, axis=1)


def base(ids: np.ndarray) -> np.ndarray:
    """A small number for each id (exact in float32 times 1000): its place among IDS and the ids added after."""
    return (ids + 10**6) // 7919


def make_table(path: Path) -> None:
    write_version(path, IDS, uniform(base(IDS) * 1000.0), "float32")


def reopened(path: Path, ids: np.ndarray) -> np.ndarray:
    table = EmbeddingTable("t", path, 0, None)
    try:
        return table.lookup(ids)[:, 0]
    finally:
        table.close()


@pytest.fixture()
def slow_steps(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each step of a compaction waits a little, so that updates and lookups fall between its steps."""
    monkeypatch.setattr(compaction, "crash_point", lambda step: time.sleep(0.15))


def test_updates_and_lookups_during_a_compaction(tmp_path: Path, slow_steps: None) -> None:
    make_table(tmp_path / "t")
    store = EmbeddingStore(StoreSettings(cache_bytes=1000 * DIM * 4, compact_log_bytes=0, io_threads=2))
    handle = store.open(tmp_path / "t", "t")
    expected = dict(zip(IDS.tolist(), (base(IDS) * 1000.0).tolist(), strict=True))
    rng = np.random.default_rng(0)
    version = 0

    def update(count: int, new_ids: int = 0) -> None:
        nonlocal version
        version += 1
        added = rng.integers(ROWS, 2 * ROWS, new_ids) * 7919 - 10**6 + 1
        chosen = np.concatenate((rng.choice(IDS, count, replace=False), np.unique(added)))
        values = base(chosen) * 1000.0 + version
        handle.update(chosen, uniform(values))
        expected.update(zip(chosen.tolist(), values.tolist(), strict=True))

    for _ in range(5):
        update(200, new_ids=20)
    handle.lookup(IDS[:800])  # cached rows, to be handed over
    problems: list[str] = []
    stop = threading.Event()

    def look() -> None:
        while not stop.is_set():
            asked = IDS[rng.integers(0, ROWS, 300)]
            got = handle.lookup(asked)
            versions = got[:, 0] - base(asked) * 1000.0
            if not (got == got[:, :1]).all() or ((versions < 0) | (versions > 1000)).any():
                problems.append("a torn or foreign vector")

    reader = threading.Thread(target=look)
    reader.start()
    # The watcher sees CURRENT name the new version before it serves: it must leave the switch to the compaction.
    watcher = TableWatcher(store, poll_seconds=0.02)
    watcher.start()
    old = handle.table
    store.compactor.request(handle.key)
    while handle.table is old:  # updates all through the compaction, the last ones waiting for its switch
        update(50, new_ids=5)
        time.sleep(0.01)
    store.compactor.wait()
    update(50, new_ids=5)
    stop.set()
    reader.join()
    watcher.stop()
    assert not problems
    table = handle.table
    assert table.version.name == "v2" and table.counts.compactions == 1 and table.counts.compaction_seconds > 0
    assert table.pool is not None and table.pool.cached_rows(table.table_id) > 0  # the cache was handed over
    everything = np.array(sorted(expected))
    want = np.array([expected[i] for i in everything.tolist()])
    np.testing.assert_array_equal(handle.lookup(everything)[:, 0], want)
    assert version > 8  # updates did fall between the compaction's steps
    store.close()
    np.testing.assert_array_equal(reopened(tmp_path / "t", everything), want)


def test_a_log_past_the_limit_starts_a_compaction(tmp_path: Path) -> None:
    make_table(tmp_path / "t")
    store = EmbeddingStore(StoreSettings(cache_bytes=0, compact_log_bytes=40_000))
    handle = store.open(tmp_path / "t", "t")
    for start in range(0, 1000, 250):  # 250 records of 40 bytes a batch: the fourth passes 40,000 bytes
        handle.update(IDS[start:start + 250], uniform(np.full(250, 7.0)))
    store.compactor.wait()
    assert handle.table.version.name == "v2" and handle.table.log.count == 0
    np.testing.assert_array_equal(handle.lookup(IDS[:1000])[:, 0], np.full(1000, 7.0))
    store.close()


CRASHING = """
import os, sys
import numpy as np
from pathlib import Path
from modelhost.embeddings import compaction, table_rewrite
from modelhost.embeddings.store import EmbeddingStore, StoreSettings
path, stop_at, ids = Path(sys.argv[1]), sys.argv[2], np.array(eval(sys.argv[3]), dtype=np.int64)
store = EmbeddingStore(StoreSettings(cache_bytes=4096, compact_log_bytes=0))
handle = store.open(path, "t")
def update(part, value):
    handle.update(ids[part::3], np.full((len(ids[part::3]), 8), value, dtype=np.float32))
    print(part, flush=True)  # acknowledged
def step(name):
    if name == "frozen":
        update(1, 2.0)  # after the freeze: copied to the new log before the switch
    if name == "opened":
        update(2, 3.0)  # copied under the switch
    if name == stop_at:
        os._exit(9)
compaction.crash_point = step
update(0, 1.0)
compaction.compact(store, path.resolve())
"""


@pytest.mark.parametrize("step", ["frozen", "written", "opened", "switching", "current", "served", "pruned"])
def test_a_crash_at_any_step_restarts_with_every_acknowledged_update(tmp_path: Path, step: str) -> None:
    make_table(tmp_path / "t")
    chosen = IDS[::10].tolist() + [5, 6, 7]  # three ids the table does not hold: added by the updates
    done = subprocess.run([sys.executable, "-c", CRASHING, str(tmp_path / "t"), step, json.dumps(chosen)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 9, done.stderr
    acknowledged = [int(line) for line in done.stdout.split()]
    assert acknowledged == [0, 1, 2][: len(acknowledged)] and len(acknowledged) >= 1
    ids = np.array(chosen, dtype=np.int64)
    want = np.where(np.isin(ids, IDS), base(ids) * 1000.0, 0.0)
    for part in acknowledged:
        want[part::3] = float(part + 1)
    np.testing.assert_array_equal(reopened(tmp_path / "t", ids), want)
    serving = (tmp_path / "t" / CURRENT).read_text().strip()
    assert serving == ("v2" if step in ("current", "served", "pruned") else "v1")
    # The table compacts again after the crash, and what the crashed one left is gone.
    store = EmbeddingStore(StoreSettings(cache_bytes=0, compact_log_bytes=0))
    store.open(tmp_path / "t", "t")
    compaction.compact(store, (tmp_path / "t").resolve())
    store.close()
    np.testing.assert_array_equal(reopened(tmp_path / "t", ids), want)
    now = (tmp_path / "t" / CURRENT).read_text().strip()
    assert sorted(entry.name for entry in (tmp_path / "t").iterdir()) == ["CURRENT", serving, now] and now != serving


def test_the_flag_sets_the_limit_within_its_bounds() -> None:
    settings = modelhost_settings(["serve", "--embedding-compact-log-bytes", "64MiB"], {})
    assert settings.embedding_compact_log_bytes == 64 << 20
    check_settings(ServerSettings(embedding_compact_log_bytes=0))  # never
    for bad in (-1, 4096):
        with pytest.raises(SettingsError, match="--embedding-compact-log-bytes must be 0 .never. or at least 1MiB"):
            check_settings(ServerSettings(embedding_compact_log_bytes=bad))


@pytest.mark.parametrize(("dtype", "dim"), [("int8", 8), ("float16", 24), ("float32", 1100)])
def test_a_compaction_keeps_every_row_of_every_dtype(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, dtype: str,
                                                     dim: int) -> None:
    """Rows that do not fill a block (341 int8 rows of 12 bytes, 85 float16 rows of 48) or take several: each chunk
    of the rewrite starts a block (a chunk of 1000 rows once started mid-block and shifted every later row)."""
    monkeypatch.setattr(table_rewrite, "CHUNK_ROWS", 1000)
    monkeypatch.setattr(table_rewrite, "PACE_BYTES", 1 << 40)
    rng = np.random.default_rng(0)
    write_version(tmp_path / "t", IDS, rng.standard_normal((ROWS, dim)).astype(np.float32), dtype)
    store = EmbeddingStore(StoreSettings(cache_bytes=0, compact_log_bytes=0, io_threads=2))
    handle = store.open(tmp_path / "t", "t")
    handle.update(IDS[::7], rng.standard_normal((len(IDS[::7]), dim)).astype(np.float32))
    handle.update(np.array([-(10**7), 5]), np.ones((2, dim), np.float32))  # new ids: below the first, inside
    every = np.concatenate((IDS, [-(10**7), 5]))
    before = handle.lookup(every)
    compaction.compact(store, handle.key)
    assert handle.table.version.name == "v2"
    np.testing.assert_array_equal(handle.lookup(every), before)
    store.close()
    table = EmbeddingTable("t", tmp_path / "t", 0, None)
    np.testing.assert_array_equal(table.lookup(every), before)
    table.close()
