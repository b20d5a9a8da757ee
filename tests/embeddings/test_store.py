"""EmbeddingStore: tables shared by path, one budget split by row size, versions swapped under lookups."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np

from modelhost.embeddings.store import EmbeddingStore, StoreSettings
from modelhost.embeddings.table_files import write_version

DIM = 8


def test_a_table_is_opened_once_and_closed_with_its_last_holder(tmp_path: Path) -> None:
    write_version(tmp_path / "t", np.arange(100), np.ones((100, DIM), dtype=np.float32), "float32")
    store = EmbeddingStore(StoreSettings(cache_bytes=1 << 20, io_threads=2))
    first = store.open(tmp_path / "t", "t")
    second = store.open(tmp_path / "." / "t", "t")
    assert second.table is first.table  # the same resolved path
    table = first.table
    store.release(first)
    assert store.tables() == [table]
    store.release(second)
    assert store.tables() == []
    store.close()


def test_the_budget_is_split_between_row_sizes_by_their_tables_bytes(tmp_path: Path) -> None:
    write_version(tmp_path / "big", np.arange(3000), np.ones((3000, DIM), dtype=np.float32), "float32")
    write_version(tmp_path / "small", np.arange(1000), np.ones((1000, DIM), dtype=np.float32), "int8")
    store = EmbeddingStore(StoreSettings(cache_bytes=1 << 16, io_threads=2))
    big = store.open(tmp_path / "big", "big").table
    assert big.pool is not None and big.pool.nbytes == (1 << 16) // 32 * 32  # alone: all of it
    small = store.open(tmp_path / "small", "small").table
    assert big.pool is not None and small.pool is not None and big.pool is not small.pool
    total = big.meta.file_bytes() + small.meta.file_bytes()
    assert abs(big.pool.nbytes - (1 << 16) * big.meta.file_bytes() / total) <= 32
    assert big.pool.nbytes + small.pool.nbytes <= 1 << 16
    np.testing.assert_array_equal(small.lookup(np.arange(5)), np.ones((5, DIM)))
    store.close()


def test_a_new_version_is_swapped_in_under_lookups(tmp_path: Path) -> None:
    ids = np.arange(500)
    write_version(tmp_path / "t", ids, np.zeros((500, DIM), dtype=np.float32), "float32")
    store = EmbeddingStore(StoreSettings(cache_bytes=1 << 14, io_threads=2))
    handle = store.open(tmp_path / "t", "t")
    table = handle.table
    seen: list[float] = []
    stop = threading.Event()

    def look() -> None:
        while not stop.is_set():
            got = handle.lookup(ids[::7])
            assert np.all(got == got[0, 0])  # all of one version
            seen.append(float(got[0, 0]))

    reader = threading.Thread(target=look)
    reader.start()
    write_version(tmp_path / "t", ids, np.ones((500, DIM), dtype=np.float32), "float32")
    swapped = store.swap(tmp_path / "t")
    stop.set()
    reader.join()
    assert swapped is not table and swapped.version.name == "v2"
    np.testing.assert_array_equal(swapped.lookup(ids[:3]), np.ones((3, DIM)))
    assert set(seen) <= {0.0, 1.0}
    store.close()


def test_a_hot_id_list_fills_the_cache_when_the_table_opens(tmp_path: Path) -> None:
    ids = np.arange(1000) * 3
    write_version(tmp_path / "t", ids, np.ones((1000, DIM), dtype=np.float32), "float32")
    np.save(tmp_path / "t" / "hot_ids.npy", ids[::-1])  # hottest first: the last ids
    store = EmbeddingStore(StoreSettings(cache_bytes=100 * DIM * 4, io_threads=2))
    table = store.open(tmp_path / "t", "t").table
    assert table.pool is not None and table.pool.cached_rows(table.table_id) == 100
    missed = table.pool.get(table.table_id, np.array([999, 900, 0]), np.empty((3, DIM * 4), dtype=np.uint8))
    assert missed.tolist() == [False, False, True]  # the hottest rows are in, the coldest not
    store.close()


def test_a_budget_larger_than_the_tables_holds_no_more_slots_than_they_have_rows(tmp_path: Path) -> None:
    write_version(tmp_path / "t", np.arange(800), np.ones((800, DIM), dtype=np.float32), "float32")
    store = EmbeddingStore(StoreSettings(cache_bytes=1 << 30, io_threads=1))
    table = store.open(tmp_path / "t", "t").table
    assert table.pool is not None and table.pool.capacity == 900  # 800 rows, and an eighth more for new ones
    store.close()
