"""A watched loop's steps on the GPU's own clock, where the user's loop runs on CUDA.

At each call of next() (the previous step's work is all queued) and each batch's delivery (the
step's work is about to be queued) the watch records a CUDA event on the current stream without
waiting. An event completes when the GPU reaches it: after the queued work, or at the host's time on
an idle GPU. Read late (an `EventRing`, pipebench.base.gpu_timeline), the events give each step's GPU
span from one call of next() to the next, and the GPU's idle time from the previous step's last work
to the batch's delivery: the part of the host's wait that the GPU felt. So an asynchronous step, whose
host runs ahead while the GPU works, is not charged with waits the GPU did not have.

Where the loop does not run on CUDA when the window opens, no clock is made and the host's clock
stands. Anything with `record()`, `query()`, `synchronize()` and `elapsed_time(other)` serves as an
event, so the bookkeeping is tested on a CPU with fake events.
"""

from dataclasses import dataclass
from typing import Callable, List, Optional, Sequence

import torch

from pipebench.base.gpu_timeline import EventRing, GpuStepSplit, StepTimes, TimedEvent, split_steps
from pipebench.base.gpu_timing import cuda_event
from pipebench.measure.steps import StepSample, with_gpu_split

__all__ = ["STEPS_IN_FLIGHT", "GpuWatchClock", "cuda_watch_clock", "on_gpu_clock"]

# Unread steps the watch lets the user's host run ahead of the GPU before it waits for the
# oldest. Far more than a loop runs ahead in practice (CUDA's launch queue holds a host back
# long before), so the watch does not hold the user's loop back the way pipebench's own loop
# bounds itself; an unread step holds only its three events.
STEPS_IN_FLIGHT = 1024


@dataclass(frozen=True)
class _Step:
    """One measured step's events: next() called, the batch delivered, the next call of next()."""

    index: int
    wait_start: TimedEvent
    data_ready: TimedEvent
    last: TimedEvent
    # Whether the step began where the previous measured step ended (no unmeasured step between).
    joined: bool


@dataclass
class _Open:
    """The step in progress: its next() event, its delivery event once the batch came, and whether
    it began where the previous measured step ended."""

    wait_start: TimedEvent
    joined: bool
    data_ready: Optional[TimedEvent] = None


class GpuWatchClock:
    """Events at a watched loop's step boundaries (each call of next() and each delivery), read late.
    Not frozen: it follows the user's loop."""

    def __init__(self, new_event: Callable[[], TimedEvent]) -> None:
        self.ring: EventRing[_Step] = EventRing(STEPS_IN_FLIGHT)
        self._new_event = new_event
        self._origin: Optional[TimedEvent] = None
        self._open: Optional[_Open] = None
        self._closed = 0
        self._times: List[StepTimes] = []
        self._joined: List[bool] = []

    def _record(self) -> TimedEvent:
        event = self._new_event()
        event.record()
        if self._origin is None:
            self._origin = event  # every later event is read from here, on the GPU's clock
        return event

    def boundary(self, measured: bool) -> None:
        """next() is being called: the step in progress (if its batch came) ends here, and one opens
        where the coming step is measured."""
        if self._open is None and not measured:
            return
        event = self._record()
        joined = False
        if self._open is not None and self._open.data_ready is not None:
            step = _Step(self._closed, self._open.wait_start, self._open.data_ready, event, self._open.joined)
            self._closed += 1
            self._read(self.ring.push(step))
            joined = True
        self._open = _Open(event, joined) if measured else None

    def delivered(self) -> None:
        """The batch of the step in progress came back from next()."""
        if self._open is not None:
            self._open.data_ready = self._record()

    def cut(self) -> None:
        """Drop the step in progress: the loop left it without calling next() again."""
        self._open = None

    def splits(self) -> List[GpuStepSplit]:
        """Every closed step's span on the GPU (waits for those in flight), oldest first. Steps
        that follow each other are split as one timeline; a step after a gap (an unmeasured step
        between) starts its own, from its own call of next()."""
        self._read(self.ring.drain())
        out: List[GpuStepSplit] = []
        start = 0
        for end in range(1, len(self._times) + 1):
            if end == len(self._times) or not self._joined[end]:
                run = self._times[start:end]
                out.extend(split_steps(run, window_start=run[0].wait_start))
                start = end
        return out

    def _read(self, steps: Sequence[_Step]) -> None:
        origin = self._origin
        for step in steps:
            wait_start, ready, last = (origin.elapsed_time(e) for e in (step.wait_start, step.data_ready, step.last))
            # The step's first GPU work is queued right after the delivery; no copy is seen apart.
            self._times.append(StepTimes(step.index, wait_start, ready, ready, ready, last))
            self._joined.append(step.joined)


def cuda_watch_clock() -> Optional[GpuWatchClock]:
    """A clock of CUDA events where the loop runs on CUDA (the script has started CUDA by the time
    the window opens), else None: a CPU loop is left on the host's clock, and a process that
    never touched CUDA does not get a CUDA context from the watch."""
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        return GpuWatchClock(cuda_event)
    return None


def on_gpu_clock(epochs: Sequence[List[StepSample]], splits: Sequence[GpuStepSplit]) -> List[List[StepSample]]:
    """The measured steps (grouped by epoch, oldest first) with their GPU idle and busy times."""
    total = sum(len(steps) for steps in epochs)
    if total != len(splits):
        raise RuntimeError(f"the GPU timeline has {len(splits)} steps, the watched window {total}")
    split = iter(splits)
    return [[with_gpu_split(step, next(split)) for step in steps] for steps in epochs]
