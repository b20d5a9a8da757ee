"""rows.bin reads (disk_rows.py): the read unit (a 512-byte sector where O_DIRECT allows it and no row straddles
one, else the 4 KiB block) and the rows read, against buffered reads of the same file."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from modelhost.embeddings.disk_rows import DiskRows
from modelhost.embeddings.table_files import ROWS, read_meta, write_version


@pytest.mark.parametrize("dtype, dim, unit", [
    ("float32", 16, 512),  # 64-byte rows: 8 to a sector
    ("float32", 256, 1024),  # 1 KiB rows: two sectors each
    ("float16", 200, 4096),  # 400-byte rows straddle 512, 1024 and 2048-byte boundaries
    ("int8", 16, 4096),  # 20-byte rows straddle every smaller unit
    ("float32", 1500, 4096),  # a row larger than a block: whole blocks
])
def test_rows_read_by_unit_equal_buffered_reads(tmp_path: Path, dtype: str, dim: int, unit: int) -> None:
    rows = 3000
    vectors = np.random.default_rng(0).standard_normal((rows, dim)).astype(np.float32)
    version = write_version(tmp_path / "t", np.arange(rows) * 3, vectors, dtype)
    meta = read_meta(version)
    direct = DiskRows(version / ROWS, meta, None, direct=True)
    buffered = DiskRows(version / ROWS, meta, None, direct=False)
    wanted = np.array([0, 1, 2, 7, 8, 9, 500, 1023, 1024, 2047, rows - 2, rows - 1])
    try:
        if direct.direct:  # O_DIRECT where the filesystem has it (tmpfs has not: buffered, any unit)
            assert direct.unit == unit
        np.testing.assert_array_equal(direct.read(wanted), buffered.read(wanted))
        np.testing.assert_array_equal(direct.read(wanted), meta.codec.encode(vectors[wanted]))
    finally:
        direct.close()
        buffered.close()
