"""One job's step loops and its repeat loop: the same for one process, its workers and each rank.

`LoopKit` holds what every step loop of a job shares, and `LoopKit.loop` builds the step loop of a
measured repeat or of an extra pass (a profile, a trace), so a hook added here reaches every loop
of every job. `measure_repeats` runs `run.repeats` measured passes around the job's meters.

`run.sync=auto` runs ahead, as training does, wherever a consumer trains on CUDA: nothing waits
inside a step and CUDA events are read late (pipebench.base.gpu_timing.AsyncStepClock).
`run.sync=per_step` finishes every phase before the next, so each is timed on its own. A consumer
that cannot run ahead (on the CPU, `emulated`, `none`) runs the synchronous path, with one line
where async was asked for or a training consumer ends up on the CPU.
"""

from dataclasses import dataclass, replace
from typing import Any, Callable, Optional, Sequence, Tuple

from pipebench.base.gpu_timing import AsyncStepClock, DeviceCopy
from pipebench.base.watchdog import Unwatched
from pipebench.config.specs import SYNC_ASYNC, SYNC_AUTO, SYNC_PER_STEP, JobSpec
from pipebench.measure.coverage import IndexLog
from pipebench.measure.first_batch_parts import FirstBatchLog
from pipebench.measure.gpu.session import GpuSession
from pipebench.measure.meter import FIRST_MEASURED, Meter
from pipebench.measure.runner import BatchStream, StepLoop, measure_pass
from pipebench.measure.steps import PassPlan, PassResult, TimingSink, WindowMarks, pass_plan
from pipebench.measure.window import Window, split_window
from pipebench.pipeline.build import JobParts
from pipebench.pipeline.device_chain import DeviceChain
from pipebench.pipeline.loader_backends import LoaderBackend
from pipebench.pipeline.timed_chain import SampleFailure, TimedBatch

__all__ = ["LoopKit", "Repeats", "StepSync", "build_loop_kit", "measure_repeats", "resolve_sync"]


@dataclass(frozen=True)
class StepSync:
    """The loop a job runs (`async` or `per_step`) and the one-line notice, if any."""

    mode: str
    note: Optional[str] = None

    def clock(self) -> Optional[AsyncStepClock]:
        """A fresh clock for one step loop, or None for the synchronised loop."""
        return AsyncStepClock() if self.mode == SYNC_ASYNC else None


def resolve_sync(requested: str, consumer: Any) -> StepSync:
    """The loop for `consumer` under run.sync=`requested`; switches the consumer to run ahead."""
    if requested == SYNC_PER_STEP:
        return StepSync(SYNC_PER_STEP)
    device = getattr(consumer, "device", None)
    can_run_ahead = hasattr(consumer, "run_ahead")
    if device is not None and device.type == "cuda" and can_run_ahead:
        consumer.run_ahead()
        return StepSync(SYNC_ASYNC)
    if requested == SYNC_AUTO and not can_run_ahead:
        return StepSync(SYNC_PER_STEP)  # nothing of its own runs on a GPU: nothing to run ahead of
    where = f"on {device}" if device is not None else "on the host"
    return StepSync(SYNC_PER_STEP, f"note: run.sync={requested}: the consumer runs {where}, not on a CUDA "
                                   "device, so the synchronous CPU path ran (step_sync=per_step)")


@dataclass(frozen=True)
class LoopKit:
    """What every step loop of one job is built from; see the module doc."""

    loader: LoaderBackend
    consumer: Any
    on_error: str
    non_blocking: bool
    device_chain: DeviceChain
    sync: StepSync
    watchdog: Unwatched
    gpu: GpuSession
    plan: PassPlan
    # A rank's all-reduce after each step (pipebench.measure.distributed.ranks); None in one process.
    after_step: Optional[Callable[[TimedBatch, int], None]] = None

    def loop(self, consumer: Any = None, loader: Optional[LoaderBackend] = None, measured: bool = False,
             on_batch: Optional[Callable[[TimedBatch, int], None]] = None) -> StepLoop:
        """A fresh iteration of `loader` (default: the job's) stepped into `consumer` (default: the
        job's). `measured`: the GPU session's copier keeps the copies' GPU times and its allocator
        is read after each measured step; an extra pass copies with a copier of its own, so its
        steps never reach the job's figures."""
        return StepLoop(BatchStream(loader or self.loader, self.on_error), consumer or self.consumer,
                        non_blocking=self.non_blocking, copier=self.gpu.copier if measured else DeviceCopy(),
                        after_measured=self.gpu.alloc.sample if measured else None, on_batch=on_batch,
                        after_step=self.after_step, watchdog=self.watchdog, device_chain=self.device_chain,
                        clock=self.sync.clock())


def build_loop_kit(spec: JobSpec, parts: JobParts, gpu: GpuSession, watchdog: Unwatched,
                   after_step: Optional[Callable[[TimedBatch, int], None]] = None) -> LoopKit:
    """The job's LoopKit; resolves run.sync (switching the consumer to run ahead) and prints its note."""
    sync = resolve_sync(spec.run.sync, parts.consumer)
    if sync.note is not None:
        print(sync.note, flush=True)
    return LoopKit(parts.loader, parts.consumer, spec.run.on_error, parts.pinned, parts.device_chain, sync,
                   watchdog, gpu, pass_plan(spec), after_step)


@dataclass(frozen=True)
class Repeats:
    """The measured passes of a job (or a rank) as their window, cut once from the plan's cycle
    (every figure of the job reads this cut), the samples they skipped, the epoch each reached."""

    window: Window
    skipped: Tuple[SampleFailure, ...]
    epochs: Tuple[int, ...]

    @property
    def passes(self) -> Tuple[PassResult, ...]:
        return self.window.passes

    @property
    def marked_samples(self) -> int:
        """The samples of the window the quick meters' marks bound: the first repeat's measured steps."""
        return sum(step.samples for step in self.passes[0].steps) if self.passes else 0


def measure_repeats(kit: LoopKit, meters: Sequence[Meter], index_log: IndexLog, sink: TimingSink,
                    label: str = "", agree: Optional[Callable[[bool], bool]] = None) -> Repeats:
    """`run.repeats` passes (the kit's plan), each on a fresh iteration of the loader. The meters
    start before the first, are marked around the first repeat's window and stop after the last
    (in reverse, also on failure). `index_log` sees every batch; each pass keeps its first batch taken
    apart (`PassResult.first_batch`); `agree` is a rank's shared stop decision."""

    def marker(group: Sequence[Meter]) -> Callable[[str], None]:
        def mark(name: str) -> None:
            # The last mark in reverse: each meter's window then nests inside the ones before it,
            # so the CPU of the host-load meter's window holds no memory sample's page-table walk.
            for meter in (group if name == FIRST_MEASURED else reversed(group)):
                meter.mark(name)
        return mark

    marks = WindowMarks(marker([m for m in meters if m.holds_loop]), marker([m for m in meters if not m.holds_loop]))
    passes, skipped, epochs = [], [], []
    for meter in meters:
        meter.start()
    try:
        for repeat in range(kit.plan.repeats):
            index_log.repeat = repeat
            first_batch = FirstBatchLog(index_log)
            loop = kit.loop(measured=True, on_batch=first_batch)
            measured = measure_pass(loop, kit.plan, sink, f"{label}repeat {repeat + 1}/{kit.plan.repeats}",
                                    marks=marks if repeat == 0 else None, agree=agree)
            passes.append(replace(measured, first_batch=first_batch.parts))
            skipped.extend(loop.stream.skipped)
            epochs.append(loop.stream.epochs)
            loop.stream.close()
    finally:
        for meter in reversed(meters):
            meter.stop()
    return Repeats(split_window(passes, kit.plan.cycle), tuple(skipped), tuple(epochs))
