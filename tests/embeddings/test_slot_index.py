"""The slot pool's index of cached rows (slot_index.py) against a dict, and through the pool: boundaries, tables
sharing row numbers, full buckets, removals."""

from __future__ import annotations

import numpy as np

from modelhost.embeddings.row_cache import SlotPool
from modelhost.embeddings.slot_index import WAYS, SlotIndex


def test_the_index_answers_as_a_dict_through_inserts_and_removals() -> None:
    rng = np.random.default_rng(0)
    slots = 4096
    index = SlotIndex(slots)
    owners = np.full(slots, -1, dtype=np.int32)
    rows_of = np.zeros(slots, dtype=np.int64)
    reference: dict[tuple[int, int], int] = {}
    for _ in range(40):
        table = int(rng.integers(0, 3))
        free = np.flatnonzero(owners < 0)
        wanted = rng.choice((1 << 32) - 1, 300, replace=False)
        wanted = wanted[[(table, int(r)) not in reference for r in wanted]][: len(free)]
        given = free[: len(wanted)]
        entered = index.insert(table, wanted, given)
        owners[given[entered]], rows_of[given[entered]] = table, wanted[entered]
        reference.update(((table, int(r)), int(s)) for r, s in zip(wanted[entered], given[entered], strict=True))
        held = np.flatnonzero(owners >= 0)
        gone = rng.choice(held, len(held) // 4, replace=False)
        for owner in np.unique(owners[gone]).tolist():
            same = gone[owners[gone] == owner]
            index.remove(owner, rows_of[same], same)
            for slot in same.tolist():
                del reference[(owner, int(rows_of[slot]))]
        owners[gone] = -1
        for probe_table in range(3):
            probe = np.concatenate((rows_of[owners >= 0], rng.integers(0, 1 << 32, 200)))
            expected = [reference.get((probe_table, int(r)), -1) for r in probe]
            assert index.find(probe_table, probe, owners).tolist() == expected
    assert len(reference) >= 800  # inserts of 300 and removals of a quarter settle near 900 keys


def test_boundary_rows_and_the_same_row_of_two_tables_are_told_apart() -> None:
    index = SlotIndex(8)
    owners = np.array([0, 1, 0, 1, -1, -1, -1, -1], dtype=np.int32)
    rows = np.array([0, 0, (1 << 32) - 1, (1 << 32) - 1])
    assert index.insert(0, rows[[0, 2]], np.array([0, 2])).all()
    assert index.insert(1, rows[[1, 3]], np.array([1, 3])).all()
    assert index.find(0, rows[:2], owners).tolist() == [0, 0]
    assert index.find(1, rows[2:], owners).tolist() == [3, 3]
    assert index.find(2, rows, owners).tolist() == [-1] * 4
    index.remove(0, np.array([0]), np.array([0]))
    owners[0] = -1
    assert index.find(0, np.array([0, (1 << 32) - 1]), owners).tolist() == [-1, 2]
    assert index.find(1, np.array([0]), owners).tolist() == [1]


def test_a_full_bucket_refuses_keys_and_the_pool_does_not_cache_them() -> None:
    index = SlotIndex(8)  # the smallest index: two buckets
    rows = np.arange(4 * WAYS)
    entered = index.insert(0, rows, np.arange(len(rows)))
    assert entered.sum() == 2 * WAYS  # each bucket took WAYS keys, the rest were refused
    owners = np.zeros(len(rows), dtype=np.int32)
    found = index.find(0, rows, owners)
    assert (found[entered] == rows[entered]).all() and (found[~entered] == -1).all()

    pool = SlotPool(4, 64, "clock")  # 64 slots, 16 buckets: 200 rows fill some buckets before the slots
    pool.register(0, 1000)
    many = np.arange(0, 1000, 5)
    pool.admit(0, many[:64], np.ones((64, 4), dtype=np.uint8))
    cached = pool.cached_rows(0)
    missed = pool.get(0, many[:64], np.empty((64, 4), dtype=np.uint8))
    assert int((~missed).sum()) == cached <= 64


def test_a_forgotten_table_leaves_no_entry_behind() -> None:
    pool = SlotPool(4, 32, "clock")
    pool.register(0, 100)
    pool.register(1, 100)
    rows = np.arange(16)
    pool.admit(0, rows, np.zeros((16, 4), dtype=np.uint8))
    pool.admit(1, rows, np.ones((16, 4), dtype=np.uint8))
    pool.forget(0)
    pool.register(2, 100)
    out = np.empty((16, 4), dtype=np.uint8)
    assert pool.get(2, rows, out).all()
    assert not pool.get(1, rows, out).any() and (out == 1).all()
    pool.admit(2, rows, np.full((16, 4), 2, dtype=np.uint8))
    assert not pool.get(2, rows, out).any() and (out == 2).all()
