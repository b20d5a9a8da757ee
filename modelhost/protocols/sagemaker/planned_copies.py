"""What a kept copy's last load planned, for the next load of the same copy.

A reload of an evicted archive, unchanged, takes its unpacked copy back (store/unpacked_copies.py) and would
plan its models again: read a config, find the backend, configure and complete it (0.1-0.2 ms of a miss's
CPU). The plan depends only on the copy's files and the manager's settings, which do not change while the
server runs, so it is remembered per key with the copy it was made from: the same directory (a fetch never
reuses one), the same archive stamp, and the directory's inode and modification time as they were. A fresh
unpack, a changed archive, or a copy deleted and made again plans anew. Thread-safe.
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from typing import Generic, TypeVar

from modelhost.store.archive_models import FetchedModels

Plans = TypeVar("Plans")

Identity = tuple[str, str, int, int]


class PlannedCopies(Generic[Plans]):
    def __init__(self, capacity: int) -> None:
        self._capacity = capacity
        self._lock = threading.Lock()
        self._plans: OrderedDict[str, tuple[Identity, Plans]] = OrderedDict()

    def recall(self, key: str, fetched: FetchedModels) -> Plans | None:
        """What `remember` kept for `key` made from this very copy; None for any other."""
        with self._lock:
            found = self._plans.get(key)
        if found is None:
            return None
        identity = _identity(fetched)
        return found[1] if identity is not None and identity == found[0] else None

    def remember(self, key: str, fetched: FetchedModels, plans: Plans) -> None:
        """Keep `plans`, made from `fetched`, if it is a copy that may be kept (an archive's, with its stamp)."""
        identity = _identity(fetched)
        if identity is None:
            return
        with self._lock:
            self._plans[key] = (identity, plans)
            self._plans.move_to_end(key)
            while len(self._plans) > self._capacity:
                self._plans.popitem(last=False)


def _identity(fetched: FetchedModels) -> Identity | None:
    if fetched.stamp is None:
        return None
    try:
        stat = os.stat(fetched.directory)
    except OSError:
        return None
    return str(fetched.directory), fetched.stamp, stat.st_ino, stat.st_mtime_ns
