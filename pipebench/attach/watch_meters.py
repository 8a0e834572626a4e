"""The project's memory and storage-read meters over a watched loader's window.

`WindowMeters` runs `pipebench run`'s meters (`memory.MemorySampler`, `storage_io.StorageReadMeter`)
from the window's first measured step to its end, with the same FIRST_MEASURED / LAST_MEASURED
marks. The memory meter reads this process and the loader's own workers, not the other processes
the script started (wandb's service), which the record names; the storage meter reads the whole
process tree. A window never opened, or closed after the workers were gone, leaves the cells empty.

A reading walks every process's page tables (smaps_rollup: about 10 ms of CPU a process), so the
readings run on a thread of their own, never on the user's loop: a reading lands a few ms after the
moment it stands for, which a window of many steps does not notice.
"""

import sys
import threading

from typing import Any, Callable, Collection, Dict, Iterator, Optional, Set

from pipebench.measure.memory import MemorySampler
from pipebench.measure.meter import FIRST_MEASURED, LAST_MEASURED
from pipebench.measure.storage_io import StorageReadMeter

__all__ = ["WindowMeters", "worker_pids"]

SCOPE_NOTE = "the attach process and all its children: every loader's workers, not this loader's alone"
WORKERS_SCOPE_NOTE = ("memory: the attach process and this loader's worker processes; storage reads: the attach "
                      "process and all its children")
NOT_OPENED_NOTE = "not measured: the window never opened (no measured step)"


class WindowMeters:
    """Memory (RSS/PSS, /dev/shm) and storage reads from `begin` to the last `mark_last` before `end`.

    The last reading is taken while the workers are alive, at the window's end or an epoch's end
    inside it: when the script stops before the window is over, its workers may be gone by `end`, so
    the reading at the last epoch end stands. `workers`: the loader's worker pids, a set its watch
    fills as each epoch starts (None: not known, the whole tree is read)."""

    def __init__(self, workers: Optional[Set[int]] = None) -> None:
        self.meters = (MemorySampler(workers=workers), StorageReadMeter())
        self.scope = SCOPE_NOTE if workers is None else WORKERS_SCOPE_NOTE
        self.prepared = self.begun = self.ended = self.marked = False
        self._last: Optional[threading.Thread] = None

    def _off_thread(self, work: Callable[[], None]) -> None:
        """Run `work` on a thread of its own, after the work asked for before it; nothing at
        interpreter exit (a watched epoch left open in a global is closed then), where no thread
        can start any more: Thread.start would wait for it forever, and no figure is asked for."""
        if sys.is_finalizing():
            return
        previous = self._last

        def run() -> None:
            if previous is not None:
                previous.join()
            work()

        self._last = threading.Thread(target=run, name="pipebench-watch-meters", daemon=True)
        self._last.start()

    def _settled(self) -> None:
        """Wait for the readings asked for so far."""
        if self._last is not None:
            self._last.join()

    def prepare(self) -> None:
        """Start the meters ahead of the window (the run's first batch): their own first reading is
        then not between the window's first step and its first mark."""
        if self.prepared:
            return
        self.prepared = True
        self._off_thread(lambda: [meter.start() for meter in self.meters])

    def begin(self) -> None:
        """The window's first measured step."""
        if self.begun:
            return
        self.prepare()
        self.begun = True
        self._off_thread(lambda: [meter.mark(FIRST_MEASURED) for meter in self.meters])

    def mark_last(self) -> None:
        """Take the window's last reading now (a later one replaces it)."""
        if not self.begun or self.ended:
            return
        self.marked = True
        self._off_thread(lambda: [meter.mark(LAST_MEASURED) for meter in self.meters])

    def end(self, fresh: bool) -> None:
        """The window's end (idempotent): a last reading now when the window began and `fresh` or
        none was taken, then the meters stop."""
        if not self.prepared or self.ended:
            return
        if self.begun and (fresh or not self.marked):
            self.mark_last()
        self.ended = True
        self._off_thread(lambda: [meter.stop() for meter in self.meters])

    def columns(self) -> Dict[str, Optional[float]]:
        """The meters' summary cells; empty before the window has ended."""
        self._settled()
        over = self.ended and self.begun
        return {key: value if over else None for meter in self.meters for key, value in meter.columns().items()}

    def loader_columns(self, pids: Collection[int]) -> Dict[str, Optional[float]]:
        """One loader's own workers (by pid) out of the meter's readings: their summed PSS at
        the window's last reading and their growth (`memory.MemorySampler.processes_pss`); empty
        before the window has ended."""
        self._settled()
        pss, growth = self.meters[0].processes_pss(pids) if self.ended and self.begun else (None, None)
        return {"loader_workers_pss_mb": pss, "loader_worker_pss_growth_mb": growth}

    def record(self) -> Dict[str, Any]:
        """Each meter's record, and what the figures cover."""
        self._settled()
        if not (self.ended and self.begun):
            return {"note": NOT_OPENED_NOTE}
        records = {meter.key: meter.record() for meter in self.meters}
        left_out = records[self.meters[0].key].get("left_out")
        return {"scope": self.scope + (f"; left out of the memory: {', '.join(left_out)}" if left_out else ""),
                **records}


def worker_pids(iterator: Iterator[Any]) -> Set[int]:
    """The pids of a DataLoader iterator's worker processes, started as the iterator is made (torch's
    `_MultiProcessingDataLoaderIter._workers`); none for an iterator in the main process."""
    return {worker.pid for worker in getattr(iterator, "_workers", ()) if worker.pid is not None}
