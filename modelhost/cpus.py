"""How many CPUs this process may use: what the model threads are sized to.

os.cpu_count() counts the machine's CPUs. A container or `taskset` usually gives the process fewer:
a CPU set (affinity; Kubernetes' static CPU manager, `docker --cpuset-cpus`) or a CFS quota
(cgroup v2 `cpu.max`; `docker --cpus`, Kubernetes CPU limits). Sizing thread pools to the machine
there makes compute threads outnumber the CPUs they may run on, and they spin and preempt each other.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from pathlib import Path

_CGROUP_ROOT = Path("/sys/fs/cgroup")


def available_cpus() -> int:
    """The smaller of the CPUs in this process's affinity mask and its cgroup v2 CPU quota (rounded up)."""
    try:
        count = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        count = os.cpu_count() or 1
    quota = cgroup_cpu_quota()
    if quota is not None:
        count = min(count, max(1, math.ceil(quota)))
    return max(1, count)


def cgroup_cpu_quota(root: Path = _CGROUP_ROOT, membership: Path = Path("/proc/self/cgroup")) -> float | None:
    """CPUs' worth of time this process's cgroup allows (quota / period, the tightest up its hierarchy),
    cgroup v2 (`cpu.max`) or v1 (`cpu.cfs_quota_us`); None when unlimited or unknown."""
    try:
        lines = membership.read_text().splitlines()
    except OSError:
        return None
    limit: float | None = None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controllers == "":
            limit = _min(limit, _tightest(root, root / path.lstrip("/"), _v2_quota))
        elif "cpu" in controllers.split(","):
            mount = root / controllers
            limit = _min(limit, _tightest(mount, mount / path.lstrip("/"), _v1_quota))
    return limit


def _tightest(mount: Path, directory: Path, quota: Callable[[Path], float | None]) -> float | None:
    limit: float | None = None
    while True:
        limit = _min(limit, quota(directory))
        if directory == mount or mount not in directory.parents:
            return limit
        directory = directory.parent


def _v2_quota(directory: Path) -> float | None:
    fields = _read(directory / "cpu.max").split()
    if len(fields) != 2 or fields[0] == "max":
        return None
    return _ratio(fields[0], fields[1])


def _v1_quota(directory: Path) -> float | None:
    return _ratio(_read(directory / "cpu.cfs_quota_us"), _read(directory / "cpu.cfs_period_us"))


def _read(file: Path) -> str:
    try:
        return file.read_text().strip()
    except OSError:
        return ""


def _ratio(quota: str, period: str) -> float | None:
    try:
        q, p = int(quota), int(period)
    except ValueError:
        return None
    return q / p if q > 0 and p > 0 else None  # v1 writes -1 for unlimited


def _min(a: float | None, b: float | None) -> float | None:
    if a is None:
        return b
    return a if b is None else min(a, b)
