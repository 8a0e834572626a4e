"""Timers that are right on a GPU: CUDA events for device work, host clocks only where work is synchronous.

CUDA calls return before their kernels run, so a host clock around them measures the launch,
not the work: the GPU's own time is read from CUDA events, by the synchronised step loop
(`CudaPhaseTimer`, `DeviceCopy`) and, read late, by the asynchronous one (`AsyncStepClock`).
"""

import time
from dataclasses import dataclass, field
from typing import Any, Callable, List, Optional

import torch

from pipebench.base.gpu_timeline import EventRing, StepTimes, TimedEvent

NS_PER_MS = 1_000_000
# Steps the asynchronous loop lets the host run ahead of the GPU before it waits for the oldest.
# Three: one step running on the GPU, one queued behind it and one being launched hide any
# host-side hiccup shorter than two steps (the loader's prefetch already buffers batches on the
# host, so more buys no throughput), while every step in flight keeps its input batch on the
# device (a seed batch of 256 float images is 200 MB) and the readings stay at most 3 steps late.
MAX_STEPS_IN_FLIGHT = 3
# Events a step records, in order: wait start, data ready, first kernel (before the copy), copy
# end, last kernel end (pipebench.base.gpu_timeline.StepTimes).
STEP_BOUNDARIES = 5


class HostPhaseTimer:
    """Times step phases with perf_counter_ns; right on the CPU, where every op is synchronous."""

    name = "perf_counter"

    def __init__(self) -> None:
        self._marks: List[int] = []

    def mark(self) -> None:
        self._marks.append(time.perf_counter_ns())

    def finish(self) -> List[float]:
        marks, self._marks = self._marks, []
        return [(b - a) / NS_PER_MS for a, b in zip(marks, marks[1:])]


class CudaPhaseTimer:
    """Times step phases with CUDA events (GPU-side time); `finish` waits for the step's work."""

    name = "cuda_event"

    def __init__(self, phases: int) -> None:
        self._events = [torch.cuda.Event(enable_timing=True) for _ in range(phases + 1)]
        self._next = 0

    def mark(self) -> None:
        self._events[self._next].record()
        self._next += 1

    def finish(self) -> List[float]:
        self._events[self._next - 1].synchronize()
        events, self._next = self._events[:self._next], 0
        return [a.elapsed_time(b) for a, b in zip(events, events[1:])]


class UntimedPhases:
    """The phase timer of a step that waits for nothing (run.sync=async): records nothing."""

    name = "none (run.sync=async)"

    def mark(self) -> None:
        return None

    def finish(self) -> List[float]:
        return []


@dataclass
class DeviceCopy:
    """The host-to-device copy of a batch, done before returning.

    On CUDA it records an event before and after the copy and waits on the second, so the host
    time around `copy` is the whole copy, and `gpu_ms` (one entry per recorded copy) is the GPU's
    own time for it. Elsewhere (no device, or CPU) it is a plain `.to`, and records nothing.
    """

    gpu_ms: List[float] = field(default_factory=list)
    _events: Optional[tuple] = field(default=None, repr=False)

    def copy(self, data: Any, device: Optional[torch.device], non_blocking: bool, record: bool) -> Any:
        if device is None or device.type != "cuda" or not isinstance(data, torch.Tensor):
            return moved_to(data, device, non_blocking)
        if self._events is None:
            self._events = (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
        start, end = self._events
        start.record()
        moved = data.to(device, non_blocking=non_blocking)
        end.record()
        end.synchronize()
        if record:
            self.gpu_ms.append(start.elapsed_time(end))
        return moved


def moved_to(data: Any, device: Optional[torch.device], non_blocking: bool) -> Any:
    """`data` on `device`; unchanged without a device, or when it is not a tensor (JPEG bytes that
    the on-device decoder uploads itself)."""
    if device is None or not isinstance(data, torch.Tensor):
        return data
    return data.to(device, non_blocking=non_blocking)


def cuda_event() -> TimedEvent:
    """A CUDA event that keeps its time, as the step rings and the watch clock record them."""
    return torch.cuda.Event(enable_timing=True)


@dataclass(frozen=True)
class _StepEvents:
    index: int
    measured: bool
    events: tuple

    @property
    def last(self) -> TimedEvent:
        return self.events[-1]


class AsyncStepClock:
    """The asynchronous step loop's clock: `mark()` records the next of a step's STEP_BOUNDARIES
    events on the current stream without waiting; `end_step` hands the step to an EventRing,
    which reads steps late and blocks on the oldest once `capacity` are in flight.

    `begin_window` waits for the warm-up's steps (once, outside any step) and records the
    window's origin; `end_window` waits for the rest and returns the measured steps' StepTimes,
    in ms from the origin. `new_event` and `synchronize` default to torch.cuda's; tests pass fakes.
    """

    def __init__(self, capacity: int = MAX_STEPS_IN_FLIGHT, new_event: Callable[[], TimedEvent] = cuda_event,
                 synchronize: Optional[Callable[[], None]] = None) -> None:
        self.ring: EventRing[_StepEvents] = EventRing(capacity)
        self._new_event = new_event
        self._synchronize = synchronize or torch.cuda.synchronize
        self._marks: List[TimedEvent] = []
        self._origin: Optional[TimedEvent] = None
        self._times: List[StepTimes] = []

    def mark(self) -> None:
        event = self._new_event()
        event.record()
        self._marks.append(event)

    def end_step(self) -> None:
        """Queue this step's events; read the steps that are done (or the oldest, when full).
        A step between begin_window and end_window is kept; any other is waited for and dropped."""
        if len(self._marks) != STEP_BOUNDARIES:
            raise RuntimeError(f"a step records {STEP_BOUNDARIES} events, got {len(self._marks)}")
        step = _StepEvents(len(self._times) + len(self.ring), self._origin is not None, tuple(self._marks))
        self._marks = []
        self._read(self.ring.push(step))

    def begin_window(self) -> None:
        self.ring.drain()  # warm-up steps: waited for, not kept
        self._synchronize()
        self._origin = self._new_event()
        self._origin.record()
        self._times = []

    def end_window(self) -> List[StepTimes]:
        self._read(self.ring.drain())
        times, self._times, self._origin = self._times, [], None
        return times

    def _read(self, steps: List[_StepEvents]) -> None:
        origin = self._origin
        for step in steps:
            if step.measured and origin is not None:
                self._times.append(StepTimes(step.index, *(origin.elapsed_time(e) for e in step.events)))
