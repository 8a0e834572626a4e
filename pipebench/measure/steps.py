"""What a measured pass is made of, and the plan every pass of a job runs by.

The step loop (pipebench.measure.runner) fills them; the window's cut and the summary read them.
"""

from dataclasses import dataclass, field, replace
from typing import Callable, Dict, List, Optional

import numpy as np

from pipebench.base.gpu_timeline import GpuStepSplit
from pipebench.config.specs import PROCESSES, JobSpec
from pipebench.measure.first_batch_parts import FirstBatchParts
from pipebench.pipeline.timed_chain import TimedBatch

__all__ = ["NS_PER_MS", "NS_PER_S", "WINDOW_COMPLETE", "WINDOW_TIME_CAP", "PassPlan", "PassResult", "StepSample",
           "TimingSink", "WindowMarks", "backlog_steps", "cycle_steps", "pass_plan", "warmup_steps", "window_steps",
           "with_gpu_split"]

NS_PER_MS = 1e6
NS_PER_S = 1e9


@dataclass(frozen=True, kw_only=True)
class StepSample:
    """One measured step, in nanoseconds. Steps are contiguous: `gap_ns` is the main loop's own
    time since the previous step ended (bookkeeping, freeing the previous batch's shared
    memory), so Σ step_ns is the wall time of the measured window, as a plain loop sees it."""

    gap_ns: int
    wait_ns: int
    h2d_ns: int
    compute_ns: int
    samples: int
    transfer_ns: int
    worker_id: int
    # The batch was finished before next() was called: the whole wait was delivery overhead
    # (queue, unpickling, shared-memory rebuild), none of it waiting for work.
    ready: bool
    # Time in StepLoop.after_step: a multi-rank run's end-of-step all-reduce (waiting for the
    # slowest rank); 0 in a single process.
    collective_ns: int = 0
    # The loader epoch the batch belongs to (counted from 1, as BatchStream counts them).
    epoch: int = 1
    # The on-device steps after the copy (transform.on_device); 0 when the chain has none.
    device_ns: int = 0
    # Bytes of the batch as the collate made it: what crosses the worker boundary (and, pinned,
    # the host-to-device copy).
    batch_bytes: int = 0
    # run.sync=async only, read late from the GPU's own timeline (pipebench.base.gpu_timeline):
    # the GPU idle before this step's first kernel, waiting for data and for anything else, and
    # busy from its first kernel to its last. None in the synchronised loop.
    gpu_idle_data_ns: Optional[int] = None
    gpu_idle_other_ns: Optional[int] = None
    gpu_busy_ns: Optional[int] = None

    @property
    def step_ns(self) -> int:
        return self.gap_ns + self.wait_ns + self.h2d_ns + self.device_ns + self.compute_ns + self.collective_ns

    @property
    def gpu_span_ns(self) -> Optional[int]:
        """The step on the GPU's clock, from the previous step's last kernel to its own."""
        if self.gpu_busy_ns is None:
            return None
        return self.gpu_idle_data_ns + self.gpu_idle_other_ns + self.gpu_busy_ns


def with_gpu_split(step: StepSample, split: GpuStepSplit) -> StepSample:
    """`step` with its span on the GPU's own clock: idle waiting for data, idle otherwise, busy."""
    return replace(step, gpu_idle_data_ns=round(split.idle_data_ms * NS_PER_MS),
                   gpu_idle_other_ns=round(split.idle_other_ms * NS_PER_MS), gpu_busy_ns=round(split.busy_ms * NS_PER_MS))


# Why a pass's window ended: it had its steps and time in whole cycles, or hit run.max_time_s.
WINDOW_COMPLETE, WINDOW_TIME_CAP = "window", "time cap"


@dataclass(frozen=True)
class PassResult:
    """One repeat: a fresh iteration of the loader. worker_startup_s: worker id -> seconds from the
    iterator's creation to its start. `start_epoch`: the epoch of the last batch before the window,
    so an epoch end just before it is seen too. `stop_reason`: WINDOW_* above."""

    first_batch_s: float
    warmup_steps: int
    steps: List[StepSample]
    wall_s: float
    epochs: int
    worker_startup_s: Dict[int, float]
    start_epoch: int = 1
    stop_reason: str = WINDOW_COMPLETE
    # Samples of the steps between the holding meters' first mark and the window (measure_pass's drain).
    drained_samples: int = 0
    # The first batch taken apart (pipebench.measure.first_batch_parts), set by the repeat loop that
    # saw it; None where none was (a rank merge).
    first_batch: Optional[FirstBatchParts] = None


@dataclass
class TimingSink:
    """Per-step timings of measured steps, stacked as they arrive (main process only)."""

    sample_ns: List[np.ndarray] = field(default_factory=list)
    batch_ns: List[np.ndarray] = field(default_factory=list)
    sample_cpu_ns: List[np.ndarray] = field(default_factory=list)
    batch_cpu_ns: List[int] = field(default_factory=list)
    worker_ids: List[int] = field(default_factory=list)
    # What each sample's load step read from files: [n_samples, len(IO_FIELDS)] per batch.
    sample_io: List[np.ndarray] = field(default_factory=list)
    # The worker that made each sample (TimedBatch.sample_workers): [n_samples] per batch.
    sample_workers: List[np.ndarray] = field(default_factory=list)
    # Thread CPU ns of each CPU reference run after a measured batch (TimedBatch.reference_cpu_ns), none for 0.
    reference_cpu_ns: List[int] = field(default_factory=list)

    def add(self, batch: TimedBatch) -> None:
        self.sample_ns.append(batch.sample_ns)
        self.batch_ns.append(batch.batch_ns)
        self.sample_cpu_ns.append(batch.sample_cpu_ns)
        self.batch_cpu_ns.append(batch.batch_cpu_ns)
        self.worker_ids.append(batch.worker_id)
        self.sample_io.append(batch.sample_io)
        self.sample_workers.append(batch.sample_workers)
        if batch.reference_cpu_ns:
            self.reference_cpu_ns.append(batch.reference_cpu_ns)


def backlog_steps(spec: JobSpec) -> int:
    """The most batches worker processes can have made ahead of the loop: workers x prefetch_factor
    (none in one process, where a batch is made when asked for). A thread backend's queues can
    hold more (`drain_backlog` reads when its batches were made)."""
    return spec.workers * spec.loader.prefetch_factor


def warmup_steps(spec: JobSpec) -> int:
    """run.warmup_steps, but never fewer than the batches workers queue during start-up: measured
    before that backlog is drained, 8 workers on 2 cores read 13% above the CPU's capacity."""
    return max(spec.run.warmup_steps, backlog_steps(spec))


def cycle_steps(workers: int, worker_kind: str = PROCESSES) -> int:
    """Steps in one worker cycle: W worker processes started together deliver W batches, then all
    wait; a thread pool's threads make each batch together, so its cycle is one step."""
    return max(workers, 1) if worker_kind == PROCESSES else 1


def window_steps(spec: JobSpec) -> int:
    """The fewest measured steps: run.steps, and with workers at least `run.worker_cycles` times W
    steps, in whole cycles. Thread backends get the count W processes would, so backends swept
    side by side are measured over windows of one length."""
    if spec.workers == 0:
        return spec.run.steps
    cycle = cycle_steps(spec.workers, spec.worker_kind)
    wanted = max(spec.run.steps, spec.run.worker_cycles * spec.workers)
    return -(-wanted // cycle) * cycle


@dataclass(frozen=True)
class PassPlan:
    """The numbers every measured pass of a job runs by, resolved once from its config; `drain`:
    the fewest steps that take what the workers made while the holding meters held the loop."""

    warmup: int
    drain: int
    window: int
    cycle: int
    min_time_s: float
    max_time_s: float
    repeats: int
    progress: bool


def pass_plan(spec: JobSpec) -> PassPlan:
    """The plan of every measured pass of the job `spec`."""
    return PassPlan(warmup_steps(spec), backlog_steps(spec), window_steps(spec),
                    cycle_steps(spec.workers, spec.worker_kind),
                    spec.run.min_time_s, spec.run.max_time_s, spec.run.repeats, spec.run.progress)


@dataclass(frozen=True)
class WindowMarks:
    """The meters' marks around one pass's window, each called with FIRST_MEASURED, then
    LAST_MEASURED: `holding`, of readings that hold the loop, outside `quick`'s."""

    holding: Callable[[str], None]
    quick: Callable[[str], None]
