"""The embedding store's heap trims (modelhost/embeddings/heap_trim.py): at most one per interval, however many
lookups end meanwhile, run on the store's executor rather than the lookup's thread."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from modelhost.core.memory import malloc_trim
from modelhost.embeddings.heap_trim import HeapTrimmer


@pytest.mark.skipif(malloc_trim is None, reason="glibc only")
def test_lookups_trim_the_heap_at_most_once_per_interval() -> None:
    with ThreadPoolExecutor(2) as executor:
        trimmer = HeapTrimmer(executor, interval=0.2, growth=0)
        for _ in range(50):  # within the first interval: none
            trimmer.lookup_done()
        assert trimmer.trims == 0
        time.sleep(0.25)
        callers = [threading.Thread(target=trimmer.lookup_done) for _ in range(8)]
        for caller in callers:
            caller.start()
        for caller in callers:
            caller.join()
    assert trimmer.trims == 1
    assert trimmer.trim_seconds > 0
