"""The compressed ids index (id_index.py) against numpy's searchsorted over the ids' shapes tables have: hashed,
dense, one row, the int64 extremes, a far outlier; and its refusal of unsorted or repeated ids."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from modelhost.embeddings import table_files
from modelhost.embeddings.id_index import IdIndex
from modelhost.embeddings.table_files import read_ids, read_meta, write_version

LOWEST, HIGHEST = np.iinfo(np.int64).min, np.iinfo(np.int64).max
RNG = np.random.default_rng(0)
SHAPES = {
    "hashed": np.unique(RNG.integers(LOWEST, HIGHEST, 50_000, dtype=np.int64)),
    "strided": np.arange(50_000, dtype=np.int64) * 2_654_435_761 + 12_345,
    "dense": np.arange(-5_000, 5_000, dtype=np.int64),
    "one row": np.array([42], dtype=np.int64),
    "one row, lowest": np.array([LOWEST], dtype=np.int64),
    "extremes": np.array([LOWEST, LOWEST + 1, -1, 0, 1, HIGHEST - 1, HIGHEST], dtype=np.int64),
    "far outlier": np.concatenate((np.arange(1_000), [1 << 62])).astype(np.int64),
    "clustered": np.concatenate((np.arange(3_000), np.arange(1 << 40, (1 << 40) + 3_000))).astype(np.int64),
    "buckets beyond the window": np.concatenate((np.arange(0, 4_000, 4), (1 << 40) + np.arange(0, 400, 2),
                                                 [1 << 41])).astype(np.int64),
}


def expected_rows(ids: np.ndarray, queries: np.ndarray) -> np.ndarray:
    places = np.minimum(np.searchsorted(ids, queries), len(ids) - 1)
    return np.where(ids[places] == queries, places, -1)


def queries_for(ids: np.ndarray) -> np.ndarray:
    """Every id, its neighbours (absent unless dense), random ids and the int64 extremes."""
    with np.errstate(over="ignore"):
        near = np.concatenate((ids, ids + 1, ids - 1))
    return np.unique(np.concatenate((near, RNG.integers(LOWEST, HIGHEST, 2_000, dtype=np.int64), [LOWEST, HIGHEST])))


@pytest.mark.parametrize("shape", list(SHAPES))
def test_rows_and_ids_equal_a_sorted_search(shape: str) -> None:
    ids = SHAPES[shape]
    index = IdIndex.of(ids)
    queries = queries_for(ids)
    assert index.rows_of(queries).tolist() == expected_rows(ids, queries).tolist()
    assert index.rows_of(queries[::-1].copy()).tolist() == expected_rows(ids, queries[::-1]).tolist()
    assert index.ids_of(np.arange(len(ids))).tolist() == ids.tolist()
    assert index.nbytes <= 8.7 * len(ids) + 64  # never much above a plain int64 array, even for an outlier


def test_large_tables_take_fewer_bytes_a_row_than_int64() -> None:
    hashed = np.unique(RNG.integers(LOWEST, HIGHEST, 2_000_000, dtype=np.int64))
    assert IdIndex.of(hashed).nbytes / len(hashed) < 6.8  # 48 low bits in 6 bytes, a bucket per ~4 rows
    strided = np.arange(2_000_000, dtype=np.int64) * 2_654_435_761
    assert IdIndex.of(strided).nbytes / len(strided) < 5.7  # 34 low bits in 5 bytes, a bucket per ~6.5 rows
    dense = np.arange(2_000_000, dtype=np.int64)
    assert IdIndex.of(dense).nbytes / len(dense) < 2.1


def test_an_empty_index_holds_nothing() -> None:
    index = IdIndex.of(np.empty(0, dtype=np.int64))
    assert index.rows_of(np.array([0, LOWEST, HIGHEST])).tolist() == [-1, -1, -1]


@pytest.mark.parametrize("ids", [[1, 1, 2], [3, 2, 1], [1, 3, 2]])
def test_unsorted_or_repeated_ids_are_refused(ids: list[int]) -> None:
    with pytest.raises(ValueError, match="not sorted and unique"):
        IdIndex.of(np.array(ids, dtype=np.int64))


def test_a_table_file_is_read_in_chunks_whose_seams_are_checked(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(table_files, "_READ_IDS", 7)
    ids = SHAPES["hashed"][:100]
    version = write_version(tmp_path / "t", ids, np.zeros((100, 2), dtype=np.float32), "float32")
    index = read_ids(version, read_meta(version))
    assert index.rows_of(ids).tolist() == list(range(100))
    np.save(version / table_files.IDS, np.concatenate((ids[:7], ids[6:99])))  # a repeat across a seam
    with pytest.raises(table_files.TableError, match="not sorted and unique"):
        read_ids(version, read_meta(version))
