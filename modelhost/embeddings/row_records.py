"""Which rows of a served table were updated since its version was written: each such row's latest delta log
record and the generation of the update that wrote it.

Sparse: 24 bytes per updated row, nothing for the others (a dense array over a 10,000,000-row table costs 160 MB
at its first update, and allocating it held lookups up for most of a second). Two sorted levels: `recent`
takes the rows an update adds (a copy of at most RECENT_ROWS entries), `base` the rest; `compacted` merges
`recent` into `base` off the lookups' lock once it is full. A row is in one level only; a row updated again has
its entry rewritten in place.

Readers take the (base, recent) pair once, without a lock: a lookup sees each row's record as it was when it
looked, or a later one (entries are rewritten one value at a time, each a whole record number). Writers (one
update at a time) call `set` and `install` under the table's publish lock, `compacted` outside it.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

RECENT_ROWS = 65_536  # entries `recent` holds before it is merged into `base`


class _Level(NamedTuple):
    rows: np.ndarray  # sorted, unique
    record: np.ndarray
    stamp: np.ndarray

    def find(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(places, found): where each of `rows` is in this level, and whether it is."""
        places = np.searchsorted(self.rows, rows)
        found = np.zeros(len(rows), dtype=bool)
        inside = places < len(self.rows)
        found[inside] = self.rows[places[inside]] == rows[inside]
        return places, found


_EMPTY = _Level(np.empty(0, np.int64), np.empty(0, np.int64), np.empty(0, np.int64))


class RowRecords:
    def __init__(self) -> None:
        self._levels = (_EMPTY, _EMPTY)  # (base, recent)

    def __len__(self) -> int:
        base, recent = self._levels
        return len(base.rows) + len(recent.rows)

    def of(self, rows: np.ndarray) -> np.ndarray:
        """Each row's latest record, -1 for a row not updated."""
        found = np.full(len(rows), -1, dtype=np.int64)
        for level in self._levels:
            if len(level.rows):
                places, hit = level.find(rows)
                found[hit] = level.record[places[hit]]
        return found

    def changed_since(self, rows: np.ndarray, generation: int) -> np.ndarray:
        """The ones of `rows` updated by a generation after `generation` (under the publish lock)."""
        changed = np.zeros(len(rows), dtype=bool)
        for level in self._levels:
            if len(level.rows):
                places, hit = level.find(rows)
                changed[hit] = level.stamp[places[hit]] > generation
        result: np.ndarray = rows[changed]
        return result

    def set(self, rows: np.ndarray, records: np.ndarray, generation: int) -> None:
        """Point `rows` (unique) at `records` (under the publish lock): rewritten in place where a level holds
        the row, added to `recent` otherwise."""
        new = np.ones(len(rows), dtype=bool)
        base, recent = self._levels
        for level in (base, recent):
            if len(level.rows):
                places, hit = level.find(rows)
                level.record[places[hit]] = records[hit]
                level.stamp[places[hit]] = generation
                new &= ~hit
        if new.any():
            order = np.argsort(rows[new], kind="stable")
            added = _Level(rows[new][order], records[new][order], np.full(int(new.sum()), generation, np.int64))
            self._levels = (base, _merge(recent, added))

    def entries(self) -> tuple[np.ndarray, np.ndarray]:
        """Every updated row (sorted) and its latest record, copied (under the update lock)."""
        merged = _merge(*self._levels)  # a copy
        return merged.rows, merged.record

    @property
    def full(self) -> bool:
        return len(self._levels[1].rows) >= RECENT_ROWS

    def compacted(self) -> tuple[_Level, _Level]:
        """`recent` merged into `base` (a copy: the served levels are untouched), for `install`. Only between
        updates (the caller holds the update lock): no `set` may run meanwhile."""
        base, recent = self._levels
        return _merge(base, recent), _EMPTY

    def install(self, levels: tuple[_Level, _Level]) -> None:
        """Serve what `compacted` made (under the publish lock)."""
        self._levels = levels


def _merge(into: _Level, added: _Level) -> _Level:
    """The entries of both (disjoint rows, each sorted), sorted."""
    if not len(into.rows):
        return _Level(added.rows.copy(), added.record.copy(), added.stamp.copy())
    places = np.searchsorted(into.rows, added.rows)
    return _Level(*(np.insert(mine, places, theirs) for mine, theirs in zip(into, added, strict=True)))
