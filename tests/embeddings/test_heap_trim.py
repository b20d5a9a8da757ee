"""The embedding store's heap trims (modelhost/embeddings/heap_trim.py): none while resident memory has not
grown, then one, however many lookups end at once, on the store's executor rather than the lookup's thread."""

from __future__ import annotations

import gc
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from modelhost.core.memory import malloc_trim
from modelhost.embeddings.heap_trim import HeapTrimmer


@pytest.mark.skipif(malloc_trim is None, reason="glibc only")
def test_lookups_trim_the_heap_once_resident_memory_grew() -> None:
    # Resident memory is the process's: what earlier tests in this worker left to free must not shrink it under
    # the trimmer's floor while the ballast grows it (CI once saw no trim after 64 MB of ballast).
    gc.collect()
    assert malloc_trim is not None
    malloc_trim(0)
    with ThreadPoolExecutor(2) as executor:
        trimmer = HeapTrimmer(executor, interval=0.1, growth=32 * 1024**2)
        for _ in range(50):  # within the first interval: not even a check
            trimmer.lookup_done()
        time.sleep(0.15)
        trimmer.lookup_done()  # checked: resident memory has not grown
        assert trimmer.trims == 0
        ballast = np.ones(256 * 1024**2, dtype=np.uint8)  # 256 MB, every page touched: 8x the growth
        time.sleep(0.15)
        callers = [threading.Thread(target=trimmer.lookup_done) for _ in range(8)]
        for caller in callers:
            caller.start()
        for caller in callers:
            caller.join()
    assert trimmer.trims == 1
    assert trimmer.trim_seconds > 0
    del ballast
