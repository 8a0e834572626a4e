"""The cores this process may use: the affinity mask capped by the cgroup's CPU quota.

Apart from the fingerprint (pipebench.measure.fingerprint, which imports torch), so a command
that only plans a sweep (`workers=auto`) knows the cores without torch's import.
"""

import os
from pathlib import Path
from typing import Optional

__all__ = ["cgroup_cpu_quota", "usable_cores"]

# cgroup v2 then v1 files that hold the CPU quota a container may use.
CGROUP_V2_CPU_MAX = Path("/sys/fs/cgroup/cpu.max")
CGROUP_V1_QUOTA = Path("/sys/fs/cgroup/cpu/cpu.cfs_quota_us")
CGROUP_V1_PERIOD = Path("/sys/fs/cgroup/cpu/cpu.cfs_period_us")


def cgroup_cpu_quota() -> Optional[float]:
    """CPUs the cgroup allows (e.g. 2.0), or None when unlimited or unreadable."""
    try:
        if CGROUP_V2_CPU_MAX.exists():
            quota, period = CGROUP_V2_CPU_MAX.read_text().split()
            return None if quota == "max" else int(quota) / int(period)
        if CGROUP_V1_QUOTA.exists():
            quota = int(CGROUP_V1_QUOTA.read_text())
            return None if quota < 0 else quota / int(CGROUP_V1_PERIOD.read_text())
    except (OSError, ValueError):
        pass
    return None


def usable_cores() -> int:
    """Cores this process may run on: the affinity mask, capped by the cgroup quota."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    quota = cgroup_cpu_quota()
    return max(1, min(cores, int(quota))) if quota else cores
