"""The CPUs model threads are sized to: affinity and cgroup quotas, not the machine's count."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from modelhost.cpus import available_cpus, cgroup_cpu_quota
from modelhost.settings import ServerSettings


def _cgroups(tmp_path: Path, membership: str, files: dict[str, str]) -> tuple[Path, Path]:
    root = tmp_path / "cgroup"
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    (tmp_path / "membership").write_text(membership)
    return root, tmp_path / "membership"


def test_cgroup_v2_quota_is_the_tightest_up_the_hierarchy(tmp_path: Path) -> None:
    root, membership = _cgroups(tmp_path, "0::/pod/container\n", {
        "pod/cpu.max": "150000 100000\n", "pod/container/cpu.max": "max 100000\n"})
    assert cgroup_cpu_quota(root, membership) == 1.5


def test_cgroup_v2_unlimited(tmp_path: Path) -> None:
    root, membership = _cgroups(tmp_path, "0::/x\n", {"x/cpu.max": "max 100000\n"})
    assert cgroup_cpu_quota(root, membership) is None


def test_cgroup_v1_quota(tmp_path: Path) -> None:
    root, membership = _cgroups(tmp_path, "4:memory:/x\n3:cpu,cpuacct:/docker/abc\n0::/\n", {
        "cpu,cpuacct/docker/abc/cpu.cfs_quota_us": "50000\n", "cpu,cpuacct/docker/abc/cpu.cfs_period_us": "100000\n",
        "cpu,cpuacct/docker/cpu.cfs_quota_us": "-1\n", "cpu,cpuacct/docker/cpu.cfs_period_us": "100000\n"})
    assert cgroup_cpu_quota(root, membership) == 0.5


def test_no_cgroup_files_means_no_quota(tmp_path: Path) -> None:
    assert cgroup_cpu_quota(tmp_path / "absent", tmp_path / "absent-membership") is None


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="CPU affinity is Linux's")
def test_server_settings_count_the_cpus_of_the_affinity_mask() -> None:
    # A process started under `taskset -c 0` (a CPU set) sizes its model threads to one CPU.
    code = "from modelhost.settings import ServerSettings; print(ServerSettings().cpu_count)"
    first = sorted(os.sched_getaffinity(0))[0]
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                            preexec_fn=lambda: os.sched_setaffinity(0, {first}))
    assert result.stdout.strip() == "1"
    assert ServerSettings().cpu_count == available_cpus()
