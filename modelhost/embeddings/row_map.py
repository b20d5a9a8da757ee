"""Which row of a served table holds an id: the version's ids (rows 0..n-1, in id order: id_index.py) and the ids
added by updates since the version was written (rows n.., in the order they came).

Not locked here: rows are added under the table's publish lock (table_updates.py), one slice at a time, and a
lookup finds a new id only once its row's record is in.
"""

from __future__ import annotations

import numpy as np

from modelhost.embeddings.id_index import IdIndex


class RowMap:
    def __init__(self, ids: IdIndex) -> None:
        self.ids = ids
        self._added: dict[int, int] = {}  # id not in the version -> its row (from len(ids) on)

    @property
    def rows(self) -> int:
        """Rows the table holds: the version's and those added since."""
        return len(self.ids) + len(self._added)

    def rows_of(self, unique: np.ndarray) -> np.ndarray:
        """Rows of ids (sorted, unique); -1 for an id the table does not hold."""
        rows = self.ids.rows_of(unique)
        if self._added:
            for index in np.flatnonzero(rows < 0).tolist():
                rows[index] = self._added.get(int(unique[index]), -1)
        return rows

    def ids_of(self, rows: np.ndarray) -> np.ndarray:
        """The id of each row (rows < self.rows)."""
        ids = np.empty(len(rows), dtype=np.int64)
        inside = rows < len(self.ids)
        ids[inside] = self.ids.ids_of(rows[inside])
        if not inside.all():
            added_ids, added_rows = self._added_arrays()
            order = np.argsort(added_rows)
            ids[~inside] = added_ids[order][np.searchsorted(added_rows[order], rows[~inside])]
        return ids

    def add(self, ids: np.ndarray, rows: np.ndarray) -> None:
        """Give ids the table did not hold their rows (numbered from `rows` on, as `rows_of` will find them)."""
        self._added.update(zip(ids.tolist(), rows.tolist(), strict=True))

    def added_by_id(self) -> tuple[np.ndarray, np.ndarray]:
        """The ids added since the version was written, sorted, and their rows."""
        added_ids, added_rows = self._added_arrays()
        order = np.argsort(added_ids)
        return added_ids[order], added_rows[order]

    def _added_arrays(self) -> tuple[np.ndarray, np.ndarray]:
        count = len(self._added)
        return np.fromiter(self._added.keys(), np.int64, count), np.fromiter(self._added.values(), np.int64, count)
