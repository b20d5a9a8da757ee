"""The registry of client shared memory regions, on real /dev/shm objects: keys that are paths, bounds, a view
that outlives its region's unregistration."""

from __future__ import annotations

import gc
import uuid
from collections.abc import Iterator
from multiprocessing import shared_memory

import numpy as np
import pytest

from modelhost.core.shared_memory import SharedMemory, object_name
from modelhost.errors import ErrorKind, ModelhostError


@pytest.fixture
def block() -> Iterator[shared_memory.SharedMemory]:
    made = shared_memory.SharedMemory(f"t{uuid.uuid4().hex[:12]}", create=True, size=8192)
    yield made
    made.close()
    made.unlink()


@pytest.mark.parametrize("key", ["", "/", "a/b", "../x", "/..", ".", "x\0y", "x\ud800", "a\nb", "/" + "n" * 256])
def test_a_key_is_one_name(key: str) -> None:
    with pytest.raises(ModelhostError, match="not the name of a shared memory object"):
        object_name(key)


def test_leading_slashes_are_dropped_as_shm_open_does() -> None:
    assert object_name("//input_data") == "input_data"


def test_view_outlives_unregister(block: shared_memory.SharedMemory) -> None:
    regions = SharedMemory(True, 4, 1 << 20)
    block.buf[5000:5008] = np.arange(2, dtype=np.float32).tobytes()
    regions.register("r", "/" + block.name, 4999, 100)  # an offset that is not page-aligned
    view = regions.region("r", "input").span(1, 8, "input")
    regions.unregister("r")  # a request still reads: the mapping stays until it lets go
    assert np.frombuffer(view, np.float32).tolist() == [0.0, 1.0]
    del view
    gc.collect()
    assert regions.status() == []


def test_bounds_and_limits(block: shared_memory.SharedMemory) -> None:
    regions = SharedMemory(True, 2, 8192)
    regions.register("a", block.name, 0, 8192)
    # Triton's words for each case (its qa/L0_shared_memory matches them)
    with pytest.raises(ModelhostError, match=r"Invalid offset \+ byte size for shared memory region 'a': input 'x'"):
        regions.region("a", "input 'x'").span(8190, 4, "input 'x'")
    with pytest.raises(ModelhostError, match="Invalid offset for shared memory region 'a': input 'x'"):
        regions.region("a", "input 'x'").span(8192, 4, "input 'x'")
    with pytest.raises(ModelhostError, match="Integer overflow detected: byte_size 18446744073709551584 "):
        regions.region("a", "input 'x'").span(32, 2**64 - 32, "input 'x'")
    assert len(regions.region("a", "input 'x'").span(8192, 0, "input 'x'")) == 0
    with pytest.raises(ModelhostError, match="shared memory region 'a' already in manager") as caught:
        regions.register("a", block.name, 0, 16)
    assert caught.value.kind is ErrorKind.ALREADY_EXISTS
    with pytest.raises(ModelhostError, match="would exceed the server's 8192 bytes") as caught:
        regions.register("b", block.name, 0, 1)
    assert caught.value.kind is ErrorKind.TOO_LARGE
    regions.unregister()
    regions.register("b", block.name, 0, 1)


def test_off_names_the_flag(block: shared_memory.SharedMemory) -> None:
    with pytest.raises(ModelhostError, match="Client shared memory is disabled: .*--allow-client-shm") as caught:
        SharedMemory(False, 4, 8192).register("a", block.name, 0, 16)
    assert caught.value.kind is ErrorKind.PRECONDITION
