"""Timers that are right on a GPU: CUDA events for device work, host clocks only where work is synchronous.

CUDA calls return before their kernels run, so a host clock around them measures the launch,
not the work. `CudaPhaseTimer` records a CUDA event at each phase boundary and reads the
elapsed GPU time between them; `HostPhaseTimer` is the CPU twin (every CPU op is synchronous).
`DeviceCopy` is the step loop's host-to-device copy: finished before it returns (so the host
time charged to it is the copy's) and, on CUDA, also timed by events on the GPU.
"""

import time
from dataclasses import dataclass, field
from typing import Any, List, Optional

import torch

NS_PER_MS = 1_000_000


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
        if device is None or not isinstance(data, torch.Tensor):
            return data  # no device, or not a tensor (JPEG bytes the on-device decoder uploads itself)
        if device.type != "cuda":
            return data.to(device, non_blocking=non_blocking)
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
