"""The index of a table's updated rows (modelhost/embeddings/row_records.py) against a dict: records and
generations of rows updated once or again, across merges of its levels."""

from __future__ import annotations

import numpy as np
import pytest

from modelhost.embeddings import row_records
from modelhost.embeddings.row_records import RowRecords


def test_updated_rows_find_their_latest_record_across_merges(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(row_records, "RECENT_ROWS", 50)
    index = RowRecords()
    latest: dict[int, tuple[int, int]] = {}  # row -> (record, generation)
    rng = np.random.default_rng(0)
    record = 0
    for generation in range(1, 40):
        rows = rng.choice(1000, 30, replace=False)
        records = np.arange(record, record + 30)
        record += 30
        index.set(rows, records, generation)
        latest.update({int(r): (int(n), generation) for r, n in zip(rows, records, strict=True)})
        if index.full:
            merged = index.compacted()
            assert index.of(rows).tolist() == records.tolist()  # the served levels are untouched by the merge
            index.install(merged)
        asked = np.arange(1000)
        expected = [latest.get(r, (-1, 0))[0] for r in range(1000)]
        assert index.of(asked).tolist() == expected
        since = generation - 3
        assert sorted(index.changed_since(asked, since).tolist()) == sorted(
            r for r, (_, g) in latest.items() if g > since)
    assert len(index) == len(latest)


def test_no_row_is_updated_in_an_empty_index() -> None:
    index = RowRecords()
    assert index.of(np.array([0, 5], dtype=np.int64)).tolist() == [-1, -1]
    assert index.changed_since(np.array([0, 5], dtype=np.int64), 0).tolist() == []
