"""Byte counts agree with a count by hand on both sides of their size thresholds and chunk edges."""

from __future__ import annotations

import random

import pytest

from modelhost.protocols.byte_counts import CHUNK, SMALL, count_after, count_byte


def _body(size: int, seed: int) -> bytes:
    return bytes(random.Random(seed).choice(b"-e1E[,") for _ in range(size))


SIZES = [0, 1, 2, SMALL - 1, SMALL, SMALL + 1, CHUNK - 1, CHUNK, CHUNK + 1, 2 * CHUNK + 7]


@pytest.mark.parametrize("size", SIZES)
def test_count_byte_counts_every_occurrence(size: int) -> None:
    body = _body(size, size)
    for byte in b"-[x":
        assert count_byte(body, byte) == sum(1 for b in body if b == byte)
        assert count_byte(bytearray(body), byte) == sum(1 for b in body if b == byte)


@pytest.mark.parametrize("size", SIZES)
def test_count_after_counts_pairs_across_chunk_edges(size: int) -> None:
    body = _body(size, size + 1)
    expected = sum(1 for i in range(1, len(body)) if body[i] == ord("-") and body[i - 1] in b"eE")
    assert count_after(body, ord("-"), b"eE") == expected


def test_count_after_sees_a_pair_split_by_the_chunk_edge() -> None:
    body = b"1" * CHUNK + b"e-"  # the '-' opens the second chunk, its 'e' closes the first
    assert count_after(body, ord("-"), b"eE") == 1
    assert count_byte(body, ord("-")) == 1
