"""WriteBehind (write_behind.py): what it writes is the file, byte for byte, however the writes are cut into
pieces, with sync_file_range and with the fdatasync fallback; the pace sees every byte, a piece at a time."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from modelhost.embeddings import write_behind
from modelhost.embeddings.write_behind import PIECE, WriteBehind


@pytest.mark.parametrize("ranged", [True, False], ids=["sync_file_range", "fdatasync"])
def test_the_file_holds_what_was_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, ranged: bool) -> None:
    if not ranged:
        monkeypatch.setattr(write_behind, "_sync_range", None)
    elif write_behind._sync_range is None:  # noqa: SLF001
        pytest.skip("no sync_file_range here")
    data = np.random.default_rng(0).integers(0, 256, 3 * PIECE + 12_345, dtype=np.uint8).tobytes()
    paced: list[int] = []
    fd = os.open(tmp_path / "f", os.O_WRONLY | os.O_CREAT)
    try:
        out = WriteBehind(fd, paced.append)
        for start, end in ((0, 100), (100, PIECE + 7), (PIECE + 7, 2 * PIECE + 7), (2 * PIECE + 7, len(data))):
            assert out.write(data[start:end]) == end - start
        out.finish()
    finally:
        os.close(fd)
    assert (tmp_path / "f").read_bytes() == data
    assert sum(paced) == len(data) and max(paced) <= PIECE
