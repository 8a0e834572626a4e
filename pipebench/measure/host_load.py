"""CPU that other processes used on this host during the measured window (a Meter).

A run's interval sees only the noise inside its window, while most run-to-run variation on a
shared machine is other tenants' load, level for seconds (ten runs spread ±13% while each run's
quarters agreed within a few percent: benchmarks/noise_check.py). So the job measures that load
between the marks: host busy CPU less its own processes', and the hypervisor's steal. A row that
ran beside heavy load says so, and points at rounds=N.
"""

import time
from dataclasses import dataclass
from typing import Any, Dict, Optional

import psutil

from pipebench.measure.meter import FIRST_MEASURED, LAST_MEASURED, Meter
from pipebench.record.figures import Summary

__all__ = ["PROCESS_CPU_COLUMN", "HostLoadMeter", "HostReading", "host_load_note", "other_load"]

# Another tenant using a tenth of the host's logical CPUs moved this machine's rates by 10-25%
# between runs (2 cores, other engineers' jobs): past that, a rerun can land outside this
# run's interval, and the row says so.
OTHER_LOAD_NOTE_SHARE = 0.10
# Steal is CPU the hypervisor gave to other machines while this one wanted it: a few percent
# already shows a noisy neighbour.
STEAL_NOTE_PCT = 2.0
# The summary column of this job's own process tree's CPU a sample over the marked window.
PROCESS_CPU_COLUMN = "process_cpu_ms_per_sample"
MS_PER_S = 1000.0


@dataclass(frozen=True)
class HostReading:
    """One reading at a mark: host-wide busy and steal CPU seconds, this job's CPU seconds, the clock."""

    host_busy_s: float
    host_steal_s: float
    own_cpu_s: float
    wall_s: float


def own_cpu_s() -> float:
    """CPU seconds of this process, its reaped children and its live descendants (the workers)."""
    me = psutil.Process()
    times = me.cpu_times()
    total = times.user + times.system + times.children_user + times.children_system
    for child in me.children(recursive=True):
        try:
            child_times = child.cpu_times()
        except psutil.Error:  # exited between the listing and the read: its time lands in children_*
            continue
        total += child_times.user + child_times.system
    return total


def read_host() -> HostReading:
    host = psutil.cpu_times()
    idle = host.idle + getattr(host, "iowait", 0.0)
    steal = getattr(host, "steal", 0.0)
    # /proc/stat's user already includes guest time, so guest fields are not added again.
    busy = sum(host) - idle - steal - getattr(host, "guest", 0.0) - getattr(host, "guest_nice", 0.0)
    return HostReading(busy, steal, own_cpu_s(), time.perf_counter())


def other_load(first: HostReading, last: HostReading) -> Dict[str, float]:
    """Other processes' CPU in cores and steal as a share of the host's CPU over the window."""
    wall = last.wall_s - first.wall_s
    if wall <= 0:
        return {"host_other_cpu_cores": float("nan"), "host_steal_pct": float("nan")}
    other = (last.host_busy_s - first.host_busy_s) - (last.own_cpu_s - first.own_cpu_s)
    cpus = psutil.cpu_count() or 1
    steal = last.host_steal_s - first.host_steal_s
    return {"host_other_cpu_cores": max(other, 0.0) / wall, "host_steal_pct": 100.0 * steal / (wall * cpus)}


def host_load_note(other_cores: Optional[float], steal_pct: Optional[float], cpus: int) -> Optional[str]:
    """One line when other load may move a rerun beyond this run's interval; None otherwise."""
    parts = []
    if other_cores is not None and other_cores >= OTHER_LOAD_NOTE_SHARE * cpus:
        parts.append(f"other processes used {other_cores:.1f} of the host's {cpus} CPUs during the window")
    if steal_pct is not None and steal_pct >= STEAL_NOTE_PCT:
        parts.append(f"the hypervisor stole {steal_pct:.0f}% of the CPU")
    if not parts:
        return None
    return ("; ".join(parts) + ": a rerun can differ by more than this run's interval, "
            "which sees only the noise inside the window; rounds=N measures the run-to-run part")


class HostLoadMeter(Meter):
    """`host_other_cpu_cores` and `host_steal_pct` over the measured steps; see the module doc."""

    key = "host_load"

    def __init__(self) -> None:
        self._at: Dict[str, HostReading] = {}

    def mark(self, name: str) -> None:
        if name in (FIRST_MEASURED, LAST_MEASURED):
            self._at[name] = read_host()

    def columns(self) -> Dict[str, Optional[float]]:
        first, last = self._at.get(FIRST_MEASURED), self._at.get(LAST_MEASURED)
        if first is None or last is None:
            return {"host_other_cpu_cores": None, "host_steal_pct": None}
        return other_load(first, last)

    def own_cpu_cores(self) -> Optional[float]:
        """This job's own processes' CPU over the window, in cores (what `columns` leaves out)."""
        first, last = self._at.get(FIRST_MEASURED), self._at.get(LAST_MEASURED)
        if first is None or last is None or last.wall_s <= first.wall_s:
            return None
        return (last.own_cpu_s - first.own_cpu_s) / (last.wall_s - first.wall_s)

    def cpu_ms_per_sample(self, samples: int) -> Optional[float]:
        """CPU ms a sample of this job's whole process tree (every thread and worker process)
        between the marks, over the `samples` the window measured; None when there were none."""
        first, last = self._at.get(FIRST_MEASURED), self._at.get(LAST_MEASURED)
        if first is None or last is None or samples <= 0:
            return None
        return (last.own_cpu_s - first.own_cpu_s) * MS_PER_S / samples

    def record(self) -> Dict[str, Any]:
        columns = self.columns()
        cpus = psutil.cpu_count() or 1
        figures = Summary.from_row(columns)
        return {**columns, "host_cpus": cpus,
                "note": host_load_note(figures.host_other_cpu_cores, figures.host_steal_pct, cpus)}

    @staticmethod
    def notes(summary: Summary) -> Dict[str, str]:
        """`window_note`: other load on the host that may move a rerun beyond the row's interval,
        from the row's own cells (for a merge of ranks, the ranks' merged load)."""
        line = host_load_note(summary.host_other_cpu_cores, summary.host_steal_pct, psutil.cpu_count() or 1)
        return {"window_note": line} if line else {}
