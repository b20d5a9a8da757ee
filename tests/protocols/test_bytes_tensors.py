"""BYTES tensors' wire form, against the plain per-element loop it replaces (differential, random inputs)."""

from __future__ import annotations

import struct

import numpy as np
import pytest

from modelhost.errors import ModelhostError
from modelhost.protocols.kserve_v2.bytes_tensors import join_elements, split_elements

U32 = struct.Struct("<I")


def plain_join(elements: list[object]) -> bytes:
    parts = []
    for element in elements:
        data = element if isinstance(element, bytes) else str(element).encode("utf-8")
        parts += [U32.pack(len(data)), data]
    return b"".join(parts)


def plain_split(name: str, data: bytes, count: int) -> list[bytes]:
    elements: list[bytes] = []
    offset = 0
    while offset < len(data):
        if offset + 4 > len(data):
            raise ValueError("truncated prefix")
        (length,) = U32.unpack_from(data, offset)
        offset += 4
        if offset + length > len(data):
            raise ValueError("runs past")
        elements.append(data[offset : offset + length])
        offset += length
    if len(elements) != count:
        raise ValueError("count")
    return elements


def random_elements(rng: np.random.Generator, count: int, same_length: bool) -> list[object]:
    width = int(rng.integers(0, 12))
    elements: list[object] = []
    for _ in range(count):
        size = width if same_length else int(rng.integers(0, 40))
        kind = rng.integers(0, 4)
        if kind == 0 or same_length:
            elements.append(rng.integers(0, 256, size, dtype=np.uint8).tobytes())  # NULs and high bytes too
        elif kind == 1:
            elements.append("".join(chr(int(c)) for c in rng.integers(32, 0x3000, size // 3 + 1)))
        elif kind == 2:
            elements.append(int(rng.integers(-10**6, 10**6)))
        else:
            elements.append(np.float32(rng.standard_normal()))
    return elements


@pytest.mark.parametrize("same_length", [True, False], ids=["same-length", "varied"])
def test_join_and_split_match_the_plain_loops(same_length: bool) -> None:
    rng = np.random.default_rng(7)
    for _ in range(300):
        count = int(rng.integers(0, 200))  # below and above the count where numpy takes over
        elements = random_elements(rng, count, same_length)
        array = np.empty(count, dtype=object)
        array[:] = elements
        wire = join_elements(array.reshape(-1, 1) if count % 2 else array)
        assert wire == plain_join(elements)
        assert split_elements("x", memoryview(wire), count) == plain_split("x", wire, count)


def test_all_str_elements_are_utf8() -> None:
    array = np.array(["héllo", "", "日本"], dtype=object)
    assert join_elements(array) == plain_join(["héllo", "", "日本"])


def test_hostile_bodies_raise_where_the_plain_loop_does_and_name_the_element() -> None:
    rng = np.random.default_rng(11)
    raised = 0
    for _ in range(2000):
        count = int(rng.integers(0, 8)) if rng.integers(0, 2) else int(rng.integers(64, 100))
        wire = bytearray(plain_join(random_elements(rng, count, bool(rng.integers(0, 2)))))
        for _ in range(int(rng.integers(1, 4))):  # corrupt: flip a byte, cut, or append
            action = rng.integers(0, 3)
            if action == 0 and wire:
                wire[int(rng.integers(0, len(wire)))] = int(rng.integers(0, 256))
            elif action == 1 and wire:
                del wire[int(rng.integers(0, len(wire))):]
            else:
                wire += rng.integers(0, 256, int(rng.integers(1, 6)), dtype=np.uint8).tobytes()
        claimed = count + int(rng.integers(-1, 2))
        if claimed < 0:
            continue
        try:
            expected = plain_split("x", bytes(wire), claimed)
        except ValueError:
            with pytest.raises(ModelhostError) as error:
                split_elements("x", memoryview(bytes(wire)), claimed)
            assert "input 'x'" in error.value.message
            raised += 1
        else:
            assert split_elements("x", memoryview(bytes(wire)), claimed) == expected
    assert raised > 500


@pytest.mark.parametrize(("wire", "count", "words"), [
    (b"\x02\x00", 1, "element 0 has a truncated 4-byte length prefix"),
    (b"\x05\x00\x00\x00ab", 1, "element 0 of 5 bytes runs past its data"),
    (b"\x01\x00\x00\x00a\x01\x00\x00\x00b", 1, "has 2 BYTES elements, but its shape needs 1"),
    (b"\x01\x00\x00\x00a\x01\x00\x00\x00b", 3, "has 2 BYTES elements, but its shape needs 3"),
    (b"", 2, "has 0 BYTES elements, but its shape needs 2"),
])
def test_messages(wire: bytes, count: int, words: str) -> None:
    with pytest.raises(ModelhostError) as error:
        split_elements("x", memoryview(wire), count)
    assert "input 'x'" in error.value.message and words in error.value.message
