"""Bytes fetched from storage by the job's processes over the measured window (a Meter).

Linux counts, per process, the bytes that reads made the kernel fetch from a block device
(`read_bytes` in /proc/<pid>/io): a read the page cache served adds nothing. Summed over the
main process and its DataLoader workers between the first and the last measured step, it says
whether storage fed the window or the page cache did, which a data set larger than RAM turns
around. Readings are taken at the marks only; a worker that exits inside the window takes its
count with it (non-persistent workers at an epoch end), and the note says so.
"""

import time
from typing import Any, Dict, Optional

import psutil

from pipebench.measure.meter import FIRST_MEASURED, LAST_MEASURED

__all__ = ["StorageReadMeter"]

BYTES_PER_MB = 1 << 20


def _read_bytes() -> Optional[Dict[int, int]]:
    """pid -> bytes read from storage, for this process and its children; None where unsupported."""
    me = psutil.Process()
    counts = {}
    for proc in [me, *me.children(recursive=True)]:
        try:
            counts[proc.pid] = proc.io_counters().read_bytes
        except (psutil.Error, AttributeError):  # gone, denied, or no io_counters on this platform
            if proc is me:
                return None
    return counts


class StorageReadMeter:
    """`storage_read_mb` and `storage_read_mb_per_s` over the measured steps; see the module doc."""

    key = "storage_io"

    def __init__(self) -> None:
        self._at: Dict[str, Optional[Dict[int, int]]] = {}
        self._time: Dict[str, float] = {}

    def start(self) -> None:
        """Nothing: the counters are read at the marks."""

    def mark(self, name: str) -> None:
        if name in (FIRST_MEASURED, LAST_MEASURED):
            self._at[name] = _read_bytes()
            self._time[name] = time.perf_counter()

    def stop(self) -> None:
        """Nothing to join."""

    def _delta(self) -> Optional[Dict[str, Any]]:
        first, last = self._at.get(FIRST_MEASURED), self._at.get(LAST_MEASURED)
        if first is None or last is None:
            return None
        read = sum(count - first.get(pid, 0) for pid, count in last.items())
        gone = sorted(set(first) - set(last))
        seconds = self._time[LAST_MEASURED] - self._time[FIRST_MEASURED]
        return {"bytes": read, "seconds": seconds, "processes": len(last), "exited_in_window": len(gone)}

    def columns(self) -> Dict[str, Optional[float]]:
        delta = self._delta()
        if delta is None:
            return {"storage_read_mb": None, "storage_read_mb_per_s": None}
        mb = delta["bytes"] / BYTES_PER_MB
        return {"storage_read_mb": mb, "storage_read_mb_per_s": mb / delta["seconds"] if delta["seconds"] > 0 else None}

    def record(self) -> Dict[str, Any]:
        delta = self._delta()
        if delta is None:
            return {"note": "not measured: no per-process I/O counters here (Linux /proc/<pid>/io)"}
        note = (f"{delta['exited_in_window']} process(es) exited inside the window and took their counts"
                if delta["exited_in_window"] else None)
        return {**delta, "note": note}
