"""Transforms of known cost, for tests and calibration: they pass their input through
unchanged after spending a set time, either on the CPU (BusyWait) or idle (Sleep)."""

import math
import time

from pipebench.pipeline.movement import BOTH, Movement
from pipebench.storage.rank_info import rank_and_world


class _Delay:
    """Shared part: validate and hold the delay in milliseconds."""

    # The identity on any input, so a crop may move ahead of it (its cost does not shrink).
    movement = Movement(accepts=BOTH, pointwise=True)

    def __init__(self, ms: float):
        ms = float(ms)
        if not (math.isfinite(ms) and ms >= 0):
            raise ValueError(f"{type(self).__name__}: ms must be a finite number >= 0, got {ms}")
        self.ms = ms

    def __repr__(self) -> str:
        return f"{type(self).__name__}(ms={self.ms})"


class BusyWait(_Delay):
    """Spin the CPU until this thread has used ``ms`` milliseconds of CPU time, then return
    the input unchanged.

    Stands in for CPU-bound work such as decode: its cost is fixed CPU time, so when workers
    outnumber cores it takes longer in wall time, as real decode does. (Spinning to a wall
    clock deadline would not: a descheduled spinner still finishes on time, having done less
    work, so oversubscribed workers would look free.)
    """

    def __call__(self, sample):
        deadline = time.thread_time_ns() + round(self.ms * 1_000_000)
        while time.thread_time_ns() < deadline:
            pass
        return sample


class Sleep(_Delay):
    """Sleep ``ms`` milliseconds, then return the input unchanged.

    Stands in for I/O latency: it costs wall time but no CPU.
    """

    def __call__(self, sample):
        time.sleep(self.ms / 1000.0)
        return sample


class RankBusyWait(BusyWait):
    """BusyWait ``ms`` only in multi-rank run rank ``rank`` (pass-through elsewhere): a
    deliberate straggler, for seeing what one slow rank costs the others at the all-reduce."""

    def __init__(self, ms: float, rank: int = 1):
        super().__init__(ms)
        self.rank = int(rank)

    def __call__(self, sample):
        return super().__call__(sample) if rank_and_world()[0] == self.rank else sample

    def __repr__(self) -> str:
        return f"{type(self).__name__}(ms={self.ms}, rank={self.rank})"
