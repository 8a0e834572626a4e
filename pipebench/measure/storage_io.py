"""Storage I/O figures of a job: what its file reads cost, and what storage itself delivered.

File reads: each sample's load step sends back what it read through pipebench.storage.file_reads
(time, bytes, files, requests; an fsspec URL's requests are its ranged GETs), from whichever process
read them, whence the figures a sample and the I/O share of the load step.

Storage (`StorageReadMeter`): the bytes reads made the kernel fetch from a block device
(/proc/<pid>/io `read_bytes`; the page cache adds nothing), summed over the main process and its
workers between the marks, say whether storage or the page cache fed the window. A worker that
exits inside the window takes its count with it, and the note says so.
"""

import time
from dataclasses import asdict, dataclass
from typing import Any, Dict, Optional

import numpy as np
import psutil

from pipebench.measure.meter import FIRST_MEASURED, LAST_MEASURED, Meter
from pipebench.measure.steps import NS_PER_MS, NS_PER_S, TimingSink
from pipebench.record.figures import Summary
from pipebench.storage.file_reads import BYTES_PER_MB, READ_BYTES, READ_FILES, READ_NS, READ_REQUESTS

__all__ = ["StorageReadMeter", "file_read_columns", "file_read_figures"]

# The summary cells of file reads, all empty for a dataset that reads no files through pipebench.
FILE_READ_COLUMNS = ("read_bytes_per_sample", "read_files_per_sample", "read_requests_per_sample",
                     "read_ms_per_sample", "read_mb_per_s", "read_speed_mb_per_s", "io_share_of_load_pct")
# The per-sample figures of `file_read_figures` (the rest of FILE_READ_COLUMNS needs the job's rate).
SAMPLE_READ_FIGURES = tuple(key for key in FILE_READ_COLUMNS if key != "read_mb_per_s")


def file_read_figures(io: np.ndarray, load_ns: np.ndarray) -> Dict[str, Optional[float]]:
    """Per sample, from `io` [n, IO_FIELDS] and each sample's load step time: bytes, files, requests,
    read ms, the speed reads got (bytes over time in reads) and the I/O share of the load step. All
    None when nothing was read from files."""
    files = int(io[:, READ_FILES].sum()) if io.size else 0
    # A stream's shard opened before the window still feeds it: its samples read bytes, no file.
    if files == 0 and not (io.size and io[:, READ_BYTES].any()):
        return {key: None for key in SAMPLE_READ_FIGURES}
    n = io.shape[0]
    read_ns, read_bytes = float(io[:, READ_NS].sum()), float(io[:, READ_BYTES].sum())
    load = float(load_ns.sum())
    return {
        "read_bytes_per_sample": read_bytes / n,
        "read_files_per_sample": files / n,
        "read_requests_per_sample": float(io[:, READ_REQUESTS].sum()) / n,
        "read_ms_per_sample": read_ns / NS_PER_MS / n,
        "read_speed_mb_per_s": read_bytes / BYTES_PER_MB / (read_ns / NS_PER_S) if read_ns > 0 else None,
        "io_share_of_load_pct": 100.0 * read_ns / load if load > 0 else None,
    }


def file_read_columns(sink: TimingSink, samples_per_s: float) -> Dict[str, Optional[float]]:
    """The job's file-read cells over every measured sample; `read_mb_per_s` is bytes a sample
    times the steady rate: what the job pulls from its files a second."""
    if not sink.sample_io:
        return {key: None for key in FILE_READ_COLUMNS}
    figures = file_read_figures(np.concatenate(sink.sample_io), np.concatenate(sink.sample_ns)[:, 0])
    per_sample = Summary.from_row(figures).read_bytes_per_sample
    rate = per_sample * samples_per_s / BYTES_PER_MB if per_sample is not None and np.isfinite(samples_per_s) else None
    return {**figures, "read_mb_per_s": rate}


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


@dataclass(frozen=True)
class StorageDelta:
    """What storage delivered between the marks: bytes, over seconds, to the processes read at the last
    mark; those that exited inside the window took their counts with them."""

    bytes: int
    seconds: float
    processes: int
    exited_in_window: int


class StorageReadMeter(Meter):
    """`storage_read_mb` and `storage_read_mb_per_s` over the measured steps; see the module doc."""

    key = "storage_io"

    def __init__(self) -> None:
        self._at: Dict[str, Optional[Dict[int, int]]] = {}
        self._time: Dict[str, float] = {}

    def mark(self, name: str) -> None:
        if name in (FIRST_MEASURED, LAST_MEASURED):
            self._at[name] = _read_bytes()
            self._time[name] = time.perf_counter()

    def following(self) -> "StorageReadMeter":
        """A meter from this one's last mark on, whose first reading is that mark's: windows end to
        end read the process tree once a boundary, not twice (each read lists every process on the
        host to find the tree's, about 1 ms on the 2-core VM's ~90 processes)."""
        after = StorageReadMeter()
        after._at[FIRST_MEASURED] = self._at.get(LAST_MEASURED)
        after._time[FIRST_MEASURED] = self._time[LAST_MEASURED]
        return after

    def _delta(self) -> Optional[StorageDelta]:
        first, last = self._at.get(FIRST_MEASURED), self._at.get(LAST_MEASURED)
        if first is None or last is None:
            return None
        read = sum(count - first.get(pid, 0) for pid, count in last.items())
        seconds = self._time[LAST_MEASURED] - self._time[FIRST_MEASURED]
        return StorageDelta(read, seconds, len(last), len(first.keys() - last.keys()))

    def columns(self) -> Dict[str, Optional[float]]:
        delta = self._delta()
        if delta is None:
            return {"storage_read_mb": None, "storage_read_mb_per_s": None}
        mb = delta.bytes / BYTES_PER_MB
        return {"storage_read_mb": mb, "storage_read_mb_per_s": mb / delta.seconds if delta.seconds > 0 else None}

    def record(self) -> Dict[str, Any]:
        delta = self._delta()
        if delta is None:
            return {"note": "not measured: no per-process I/O counters here (Linux /proc/<pid>/io)"}
        note = (f"{delta.exited_in_window} process(es) exited inside the window and took their counts"
                if delta.exited_in_window else None)
        return {**asdict(delta), "note": note}
