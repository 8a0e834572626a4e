"""The asynchronous step loop's bookkeeping, free of CUDA: a ring of steps read late, and the
GPU's idle time between steps split into waiting for data and the rest.

A training loop that runs ahead records CUDA events at a step's boundaries and goes straight on;
the events complete later, on the GPU. `EventRing` holds the steps whose events are not read yet:
each step it reads, oldest first, those whose last event has completed (`query()`), and when more
than `capacity` steps are unread it blocks on the oldest (`synchronize()`): that is the bound on
steps in flight. `split_steps` turns the steps' event times into the GPU's own timeline.
Anything with `query()`, `synchronize()` and `elapsed_time(other)` works as an event, so the
logic is tested on a CPU with fake events (tests/test_async_steps.py).
"""

from collections import deque
from dataclasses import dataclass
from typing import Any, Deque, Generic, List, Optional, Protocol, Sequence, TypeVar


class TimedEvent(Protocol):
    """What the ring needs of an event: torch.cuda.Event has all four."""

    def record(self) -> None: ...

    def query(self) -> bool: ...

    def synchronize(self) -> None: ...

    def elapsed_time(self, end: Any) -> float: ...


class HasLastEvent(Protocol):
    last: TimedEvent


Item = TypeVar("Item", bound=HasLastEvent)


class EventRing(Generic[Item]):
    """Steps in flight, read oldest first once their `last` event has completed; never more than
    `capacity` unread: pushing one more blocks on the oldest."""

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"an event ring holds at least one step, got {capacity}")
        self.capacity = capacity
        self._pending: Deque[Item] = deque()
        # The most steps unread at once, after a push's reads: what the bound held it to.
        self.peak_in_flight = 0
        # Steps whose read had to wait for the GPU (the ring was full).
        self.blocked_reads = 0

    def __len__(self) -> int:
        return len(self._pending)

    def push(self, item: Item) -> List[Item]:
        """Add a step whose events are recorded; return the steps read now, oldest first."""
        self._pending.append(item)
        read = self._read_done()
        while len(self._pending) > self.capacity:
            oldest = self._pending.popleft()
            oldest.last.synchronize()
            self.blocked_reads += 1
            read.append(oldest)
            read.extend(self._read_done())
        self.peak_in_flight = max(self.peak_in_flight, len(self._pending))
        return read

    def drain(self) -> List[Item]:
        """Wait for every step still in flight; return them oldest first."""
        read = []
        while self._pending:
            oldest = self._pending.popleft()
            oldest.last.synchronize()
            read.append(oldest)
        return read

    def _read_done(self) -> List[Item]:
        read = []
        while self._pending and self._pending[0].last.query():
            read.append(self._pending.popleft())
        return read


@dataclass(frozen=True)
class StepTimes:
    """One step on the GPU's clock, in ms from the window's start (the GPU was idle there).

    wait_start: the host began waiting for the batch; data_ready: next(loader) returned it;
    first_kernel: the host queued the step's first GPU op (its host-to-device copy); copy_end:
    the copy finished; last_kernel_end: the step's last GPU op finished. An event completes
    when the GPU reaches it in the stream, so on an idle GPU it carries the host's time and
    on a busy one the time the work before it ended.
    """

    step: int
    wait_start: float
    data_ready: float
    first_kernel: float
    copy_end: float
    last_kernel_end: float


@dataclass(frozen=True)
class GpuStepSplit:
    """One step's span on the GPU, from the previous step's last kernel to its own last kernel:
    idle waiting for data, idle for any other reason (the host's own work, launches), busy."""

    idle_data_ms: float
    idle_other_ms: float
    busy_ms: float
    h2d_ms: float


def _overlap(start: float, end: float, other_start: float, other_end: float) -> float:
    return max(0.0, min(end, other_end) - max(start, other_start))


def split_steps(steps: Sequence[StepTimes], window_start: float = 0.0) -> List[GpuStepSplit]:
    """Each step's GPU span split up. The idle gap before a step runs from the previous step's
    last kernel end (or `window_start`) to its first kernel; the part of it the host spent
    blocked in next(loader) is waiting for data, the rest is other. Busy runs from the first
    kernel to the last kernel end: gaps inside a step (launch-bound kernels) count as busy,
    as NVML counts them."""
    out = []
    previous_end: Optional[float] = window_start
    for times in steps:
        gap_start = previous_end
        gap_end = max(times.first_kernel, gap_start)
        idle = gap_end - gap_start
        data = _overlap(gap_start, gap_end, times.wait_start, times.data_ready)
        end = max(times.last_kernel_end, gap_end)
        out.append(GpuStepSplit(data, idle - data, end - gap_end, max(times.copy_end - times.first_kernel, 0.0)))
        previous_end = end
    return out
