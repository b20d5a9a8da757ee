"""Embedding tables (modelhost/embeddings): lookups against a numpy reference over every dtype, the cache's budget
and order, delta updates (durable, atomic per row under concurrent lookups), and bad tables."""

from __future__ import annotations

import gc
import threading
import weakref
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from modelhost.embeddings import row_records
from modelhost.embeddings.row_cache import SlotPool
from modelhost.embeddings.table import EmbeddingTable
from modelhost.embeddings.table_files import CURRENT, DELTA, IDS, META, TableError, write_version

DIM = 16
TOLERANCE = {"float32": 0.0, "float16": 2e-3, "int8": 1.0 / 127}


@pytest.fixture()
def executor() -> Iterator[ThreadPoolExecutor]:
    with ThreadPoolExecutor(4) as pool:
        yield pool


def reference(rows: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Hashed-looking ids (any int64, negatives too) and their vectors."""
    rng = np.random.default_rng(seed)
    ids = rng.choice(np.iinfo(np.int64).max, rows, replace=False) - (1 << 62)
    return ids.astype(np.int64), rng.standard_normal((rows, DIM)).astype(np.float32)


def open_table(path: Path, executor: ThreadPoolExecutor, cached_rows: int, dtype: str = "float32",
               policy: str = "clock") -> EmbeddingTable:
    from modelhost.embeddings.table_files import current_version, read_meta
    row_bytes = read_meta(current_version(path)).codec.row_bytes
    assert dtype  # the table says its dtype; the pool's slots are its rows' size
    return EmbeddingTable("t", path, 0, executor, pool=SlotPool(row_bytes, cached_rows, policy))


@pytest.mark.parametrize("dtype", ["float32", "float16", "int8"])
def test_lookups_equal_numpy_over_every_dtype_with_missing_and_repeated_ids(
        tmp_path: Path, executor: ThreadPoolExecutor, dtype: str) -> None:
    ids, vectors = reference(3000)
    default = np.linspace(-1, 1, DIM).astype(np.float32)
    write_version(tmp_path / "t", ids, vectors, dtype, default)
    table = open_table(tmp_path / "t", executor, cached_rows=300, dtype=dtype)
    by_id = dict(zip(ids.tolist(), vectors, strict=True))
    rng = np.random.default_rng(1)
    for _ in range(3):  # cold, then partly cached
        asked = rng.choice(ids, (50, 39))  # repeats within the request, as candidates share user ids
        asked[0, :5] = [7, 8, 9, 7, -1]  # ids the table does not hold
        got = table.lookup(asked)
        assert got.shape == (50, 39, DIM) and got.dtype == np.float32
        want = np.stack([by_id.get(i, default) for i in asked.reshape(-1).tolist()]).reshape(50, 39, DIM)
        scale = np.abs(want).max(axis=-1, keepdims=True)
        assert np.all(np.abs(got - want) <= TOLERANCE[dtype] * scale + 1e-7)
    assert table.counts.missing_ids == 3 * 4
    table.close()


def test_the_cache_holds_its_budget_and_hits_what_it_holds(tmp_path: Path, executor: ThreadPoolExecutor) -> None:
    ids, vectors = reference(2000)
    write_version(tmp_path / "t", ids, vectors, "float32")
    table = open_table(tmp_path / "t", executor, cached_rows=100)
    hot = ids[:80]
    table.lookup(hot)
    pool = table.pool  # the counts behind the metrics
    assert pool is not None
    assert pool.counts[0].hits == 0 and pool.cached_rows(0) == 80
    np.testing.assert_array_equal(table.lookup(hot), vectors[:80])
    assert pool.counts[0].hits == 80
    table.lookup(ids[100:1100])  # more misses than the cache holds: as many as it holds are cached
    assert pool.cached_rows(0) == 100  # never past the budget
    assert pool.counts[0].evictions == 80  # the hot rows, each given its second chance first
    table.close()


def test_clock_evicts_rows_not_asked_for_since_the_hand_passed() -> None:
    pool = SlotPool(4, 4, "clock")
    pool.register(0, 100)
    data = np.arange(16, dtype=np.uint8).reshape(4, 4)
    pool.admit(0, np.array([0, 1, 2, 3]), data)
    out = np.empty((2, 4), dtype=np.uint8)
    assert not pool.get(0, np.array([1, 3]), out).any()  # rows 1 and 3 referenced
    pool.admit(0, np.array([10, 11]), data[:2])
    missed = pool.get(0, np.array([0, 1, 2, 3, 10, 11]), np.empty((6, 4), dtype=np.uint8))
    assert missed.tolist() == [True, False, True, False, False, False]


def test_tinylfu_keeps_a_hot_row_that_one_off_rows_would_push_out() -> None:
    pool = SlotPool(4, 8, "tinylfu")
    pool.register(0, 10_000)
    scratch = np.empty((8, 4), dtype=np.uint8)
    hot = np.arange(8)
    for _ in range(5):
        missed = pool.get(0, hot, scratch)
        pool.admit(0, hot[missed], np.zeros((int(missed.sum()), 4), dtype=np.uint8))
    for start in range(100, 1100, 8):  # a scan of rows asked for once each
        once = np.arange(start, start + 8)
        missed = pool.get(0, once, scratch)
        pool.admit(0, once[missed], np.ones((int(missed.sum()), 4), dtype=np.uint8))
    assert not pool.get(0, hot, scratch).any()


def test_updates_add_and_replace_rows_refresh_the_cache_and_survive_reopening(
        tmp_path: Path, executor: ThreadPoolExecutor) -> None:
    ids, vectors = reference(500)
    write_version(tmp_path / "t", ids, vectors, "float32")
    table = open_table(tmp_path / "t", executor, cached_rows=100)
    table.lookup(ids[:10])  # cached now
    changed = np.full((3, DIM), 5.0, dtype=np.float32)
    assert table.update(np.array([ids[0], ids[400], 12345]), changed) == 1  # 12345 is new
    np.testing.assert_array_equal(table.lookup(np.array([ids[0], ids[400], 12345, ids[1]])),
                                  np.vstack([changed, vectors[1:2]]))
    assert table.update(np.array([12345, 12345]), np.stack([np.zeros(DIM), np.ones(DIM)])) == 0  # last one wins
    table.close()
    reopened = open_table(tmp_path / "t", executor, cached_rows=100)
    np.testing.assert_array_equal(reopened.lookup(np.array([ids[0], 12345, ids[2]])),
                                  np.vstack([changed[:1], np.ones((1, DIM)), vectors[2:3]]))
    reopened.close()


def test_a_torn_last_batch_in_the_log_is_dropped_at_reopen(tmp_path: Path, executor: ThreadPoolExecutor) -> None:
    ids, vectors = reference(100)
    version = write_version(tmp_path / "t", ids, vectors, "float32")
    table = open_table(tmp_path / "t", executor, cached_rows=10)
    table.update(ids[:2], np.full((2, DIM), 3.0, dtype=np.float32))
    table.update(ids[2:4], np.full((2, DIM), 4.0, dtype=np.float32))
    table.close()
    log = version / DELTA
    log.write_bytes(log.read_bytes()[:-10])  # a crash in the middle of the second batch
    reopened = open_table(tmp_path / "t", executor, cached_rows=10)
    got = reopened.lookup(ids[:4])
    np.testing.assert_array_equal(got[:2], np.full((2, DIM), 3.0))
    np.testing.assert_array_equal(got[2:], vectors[2:4])
    reopened.update(ids[5:6], np.full((1, DIM), 6.0, dtype=np.float32))  # appends after the cut
    reopened.close()
    again = open_table(tmp_path / "t", executor, cached_rows=10)
    np.testing.assert_array_equal(again.lookup(ids[5:6]), np.full((1, DIM), 6.0))
    again.close()


def test_concurrent_lookups_during_updates_never_see_a_torn_vector(tmp_path: Path, executor: ThreadPoolExecutor,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(row_records, "RECENT_ROWS", 64)  # the updated rows' index is merged under the lookups too
    rows = 400
    ids = np.arange(rows, dtype=np.int64) * 7919
    # Every version of a row is uniform: row r at version v is all r * 1000 + v.
    write_version(tmp_path / "t", ids, np.repeat((np.arange(rows) * 1000.0)[:, None], DIM, axis=1), "float32")
    table = open_table(tmp_path / "t", executor, cached_rows=100)
    stop = threading.Event()
    problems: list[str] = []
    versions = 30

    def look() -> None:
        rng = np.random.default_rng(threading.get_ident() % 1000)
        while not stop.is_set():
            asked = rng.integers(0, rows, 200)
            got = table.lookup(ids[asked])
            uniform = np.all(got == got[:, :1], axis=1)
            version = got[:, 0] - asked * 1000.0
            if not uniform.all() or np.any((version < 0) | (version > versions)):
                problems.append(f"torn or foreign vectors for rows {asked[~uniform][:5].tolist()}")
                return

    readers = [threading.Thread(target=look) for _ in range(3)]
    for reader in readers:
        reader.start()
    rng = np.random.default_rng(2)
    for version in range(1, versions + 1):
        changed = rng.choice(rows, 150, replace=False)
        table.update(ids[changed], np.repeat((changed * 1000.0 + version)[:, None], DIM, axis=1))
    stop.set()
    for reader in readers:
        reader.join()
    assert not problems
    table.close()


@pytest.mark.parametrize("damage, message", [
    (lambda t, v: (t / CURRENT).unlink(), "not an embedding table"),
    (lambda t, v: (t / CURRENT).write_text("../elsewhere"), "not a version of the table"),
    (lambda t, v: (v / META).write_text("{}"), "is not a modelhost-embedding-table"),
    (lambda t, v: np.save(v / IDS, np.array([3, 2, 1], dtype=np.int64)), "must hold 4 int64 ids"),
    (lambda t, v: np.save(v / IDS, np.array([3, 2, 1, 0], dtype=np.int64)), "not sorted and unique"),
    (lambda t, v: (v / "rows.bin").write_bytes(b"short"), "rows.bin holds 5 bytes"),
])
def test_bad_tables_are_refused_naming_the_problem(tmp_path: Path, executor: ThreadPoolExecutor, damage: object,
                                                   message: str) -> None:
    version = write_version(tmp_path / "t", np.arange(4), np.zeros((4, DIM), dtype=np.float32), "float32")
    damage(tmp_path / "t", version)  # type: ignore[operator]
    with pytest.raises(TableError, match=message):
        open_table(tmp_path / "t", executor, cached_rows=2)


def test_writing_refuses_repeated_ids_and_unstorable_values(tmp_path: Path) -> None:
    with pytest.raises(TableError, match="id 3 appears more than once"):
        write_version(tmp_path / "a", np.array([3, 1, 3]), np.zeros((3, DIM), dtype=np.float32), "float32")
    with pytest.raises(TableError, match="NaN or infinite"):
        write_version(tmp_path / "b", np.array([1]), np.full((1, DIM), np.nan, dtype=np.float32), "float32")
    with pytest.raises(TableError, match="beyond float16's range"):
        write_version(tmp_path / "c", np.array([1]), np.full((1, DIM), 1e6, dtype=np.float32), "float16")


def test_a_closed_table_is_freed_without_the_garbage_collector(tmp_path: Path,
                                                               executor: ThreadPoolExecutor) -> None:
    """No reference cycle: a version replaced by a compaction frees its ids index (56 MB for the benchmark's
    10,000,000 rows) when it closes, not whenever the collector next runs."""
    ids, vectors = reference(100)
    write_version(tmp_path / "t", ids, vectors, "float32")
    table = open_table(tmp_path / "t", executor, cached_rows=10)
    table.update(ids[:3], vectors[:3] + 1)
    table.lookup(ids[:20])
    table.close()
    gc.disable()
    try:
        freed = weakref.ref(table)
        del table
        assert freed() is None
    finally:
        gc.enable()
