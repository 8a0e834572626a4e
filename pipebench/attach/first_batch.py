"""A watched loader's time to first batch, taken apart: worker start, the dataset's pickle, the first fetch.

Plain picklable objects ride into the loader's processes with its dataset: `StampedInit` (the
loader's `worker_init_fn`) stamps the moment a worker reaches its first line of work
(`perf_counter_ns`, CLOCK_MONOTONIC on Linux, so the main process can subtract its own stamp) and
ties the worker's life to its parent's, the loader's process (PR_SET_PDEATHSIG); `TimedItems` (the dataset's instance
`__getitems__`) times each sample's whole `__getitem__`, the first its process's first fetch. The
clock hands both stamps to its process's first batch (`StepClock.take_startup`).

`dataset_pickle` pickles the dataset once with the pickler a spawn or forkserver worker receives it
by (`ForkingPickler`), counting the bytes rather than keeping them; a forked worker pickles nothing.
"""

import multiprocessing
import time
from multiprocessing.reduction import ForkingPickler
from dataclasses import dataclass
from typing import Any, Callable, List, Optional, Sequence

from pipebench.base.lifeline import die_with_parent, multiprocessing_parent_alive

__all__ = ["FORK_NOTE", "NO_WORKERS_NOTE", "DatasetPickle", "StampedInit", "TimedItems", "Startup",
           "dataset_pickle"]

BYTES_PER_MB = 1 << 20
NO_WORKERS_NOTE = "no workers: the dataset is used in the main process"
FORK_NOTE = "fork: the workers inherit the dataset, nothing is pickled"


@dataclass(frozen=True)
class Startup:
    """What one process reports with its first batch: its pid, when it started work (perf_counter_ns;
    None in the main process, which starts no worker) and its first sample's fetch, in ns."""

    pid: int
    started_ns: Optional[int]
    first_fetch_ns: Optional[int]


class StampedInit:
    """The loader's worker_init_fn while watched: stamps the worker's start, then the user's own."""

    def __init__(self, user_init: Optional[Callable[[int], None]], clock: Any) -> None:
        self.user_init = user_init
        self.clock = clock

    def __call__(self, worker_id: int) -> None:
        self.clock.started_ns = time.perf_counter_ns()
        die_with_parent(multiprocessing_parent_alive)
        if self.user_init is not None:
            self.user_init(worker_id)


class TimedItems:
    """The dataset's `__getitems__` while watched: the class's `__getitem__` a sample, each timed
    whole (`clock.begin_item` / `end_item`), the samples returned as torch's fetcher would build them."""

    def __init__(self, dataset: Any, clock: Any) -> None:
        self.dataset = dataset
        self.clock = clock

    def __call__(self, indices: Sequence[Any]) -> List[Any]:
        getitem = type(self.dataset).__getitem__
        clock, out = self.clock, []
        for index in indices:
            clock.begin_item()
            start = time.perf_counter_ns()
            try:
                out.append(getitem(self.dataset, index))
            finally:
                clock.end_item(time.perf_counter_ns() - start)
        return out


@dataclass(frozen=True)
class DatasetPickle:
    """The dataset as a worker receives it: MiB and seconds to pickle it once (None where it is not
    pickled or could not be), the start method, and why a figure is empty."""

    start_method: Optional[str]
    mb: Optional[float]
    seconds: Optional[float]
    note: Optional[str]


def dataset_pickle(loader: Any) -> DatasetPickle:
    """Pickle `loader.dataset` once, as a spawn/forkserver worker receives it; see the module doc."""
    if not getattr(loader, "num_workers", 0):
        return DatasetPickle(None, None, None, NO_WORKERS_NOTE)
    context = getattr(loader, "multiprocessing_context", None)  # the loader's own, else the default
    method = context.get_start_method() if context is not None else multiprocessing.get_start_method()
    if method == "fork":
        return DatasetPickle(method, None, None, FORK_NOTE)
    sink = _ByteCount()
    start = time.perf_counter()
    try:
        ForkingPickler(sink).dump(loader.dataset)
    except Exception as exc:  # the loader's own start would fail the same way; say why, measure nothing
        return DatasetPickle(method, None, None, f"could not pickle the dataset: {type(exc).__name__}: {exc}")
    return DatasetPickle(method, sink.count / BYTES_PER_MB, time.perf_counter() - start, None)


class _ByteCount:
    """A file that keeps only how many bytes were written to it: the pickle's size, without a copy
    of a large dataset in the user's process."""

    def __init__(self) -> None:
        self.count = 0

    def write(self, data: bytes) -> int:
        self.count += len(data)
        return len(data)
