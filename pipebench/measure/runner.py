"""The measured step loop: first batch, warm-up, then a steady state timed step by step.

step = the loop's own gap since the last step + wait in next(loader) + host-to-device copy +
consumer step. The first batch (worker start-up, imports) is reported on its own and never
enters the steady-state numbers. What the loop leaves (steps, passes, timings) and the plan it
runs by are pipebench.measure.steps.
"""

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterator, List, Optional

import torch
from tqdm import tqdm

from pipebench.base.errors import SampleError, StepTimeoutError
from pipebench.base.gpu_timeline import split_steps
from pipebench.base.gpu_timing import AsyncStepClock, DeviceCopy, moved_to
from pipebench.base.watchdog import StepOverrun, Unwatched
from pipebench.measure.meter import FIRST_MEASURED, LAST_MEASURED
from pipebench.measure.steps import (
    NS_PER_S,
    WINDOW_COMPLETE,
    WINDOW_TIME_CAP,
    PassPlan,
    PassResult,
    StepSample,
    TimingSink,
    WindowMarks,
    with_gpu_split,
)
from pipebench.pipeline.device_chain import DeviceChain
from pipebench.pipeline.loader_backends import LoaderBackend
from pipebench.pipeline.timed_chain import SampleFailure, TimedBatch


def batch_bytes(data: Any) -> int:
    """The bytes a collated batch holds: a tensor's, or a list's items' (the GPU decoder's JPEG bytes)."""
    if isinstance(data, torch.Tensor):
        return data.element_size() * data.nelement()
    if isinstance(data, (list, tuple)):
        return sum(batch_bytes(item) for item in data)
    return len(data) if isinstance(data, (bytes, bytearray)) else 0


class BatchStream:
    """Batches from the loader across epoch ends, with the bad-sample policy applied. `in_process`:
    made in this process (workers=0), where a step's watchdog covers making them."""

    def __init__(self, loader: LoaderBackend, on_error: str) -> None:
        self.loader = loader
        self.on_error = on_error
        self.created_ns = time.perf_counter_ns()
        self.iterator: Iterator[TimedBatch] = iter(loader)
        self.epochs = 1
        self.skipped: List[SampleFailure] = []
        self.worker_startup_s: Dict[int, float] = {}
        self.in_process = loader.num_workers == 0

    def next(self) -> TimedBatch:
        while True:
            try:
                batch = next(self.iterator)
            except StopIteration:
                self.epochs += 1
                set_epoch = getattr(self.loader.sampler, "set_epoch", None)
                if set_epoch is not None:  # a DistributedSampler reshuffles per epoch only when told
                    set_epoch(self.epochs - 1)
                self.iterator = iter(self.loader)
                continue
            if batch.worker_started_ns >= self.created_ns and batch.worker_id not in self.worker_startup_s:
                self.worker_startup_s[batch.worker_id] = (batch.worker_started_ns - self.created_ns) / NS_PER_S
            if batch.failures:
                first = batch.failures[0]
                if self.on_error == "fail":
                    raise SampleError(
                        f"sample {first.index} ({first.where}) failed in {first.step}: {first.message} "
                        "(run.on_error=skip drops bad samples and counts them)"
                    )
                self.skipped.extend(batch.failures)
            if batch.data is not None:
                return batch

    def close(self) -> None:
        # Deleting the iterator shuts its workers down before the next repeat starts its own.
        del self.iterator


# What the watchdog names when a step overruns outside any transform (the sampler, the collate's caller).
MAKING_BATCH = "making a batch in the main process"
CONSUMING_BATCH = "the consumer step (with the copy to its device)"
# Slice names of the main loop's own parts of a step in a viztrace timeline.
MAIN_WAIT_SLICE = "main/wait"
MAIN_H2D_SLICE = "main/h2d"
MAIN_DEVICE_SLICE = "main/on_device"
MAIN_STEP_SLICE = "main/step"


@dataclass
class StepLoop:
    """Runs steps against one BatchStream and records them. Batches go to `consumer.device`.

    `trace`: the main process's viztrace recorder, or None. `copier` makes the host-to-device copy.
    `after_measured` (after each measured step) and `on_batch(batch, epoch)` (every batch, warm-up
    included) are the loop's own bookkeeping: their cost lands in the next step's gap.
    `after_step(batch, epoch)` is timed as the step's collective (a multi-rank all-reduce).
    `watchdog` bounds this process's own work in a step (making an in-process batch, the copy, the
    consumer step; not `after_step`). `clock`: run.sync=async, where nothing waits inside a step and
    CUDA events at its boundaries are read late; None: each phase finished before the next.
    """

    stream: BatchStream
    consumer: Any
    non_blocking: bool
    trace: Optional[Any] = None
    copier: DeviceCopy = field(default_factory=DeviceCopy)
    after_measured: Optional[Callable[[], None]] = None
    on_batch: Optional[Callable[[TimedBatch, int], None]] = None
    after_step: Optional[Callable[[TimedBatch, int], None]] = None
    watchdog: Unwatched = field(default_factory=Unwatched)
    # transform.on_device: steps run on the copied batch, timed apart from the copy and the step.
    device_chain: DeviceChain = field(default_factory=lambda: DeviceChain(()))
    clock: Optional[AsyncStepClock] = None
    # When the previous step's bookkeeping ended; None until a step has run.
    last_end_ns: Optional[int] = None
    # When the previous step's batch was finished (TimedBatch.done_ns); None until a step has run.
    last_done_ns: Optional[int] = None

    def _mark(self) -> None:
        if self.clock is not None:
            self.clock.mark()

    def _to_device(self, data: Any, record: bool) -> Any:
        if self.clock is None:
            return self.copier.copy(data, self.consumer.device, self.non_blocking, record=record)
        self.clock.mark()
        moved = moved_to(data, self.consumer.device, self.non_blocking)
        self.clock.mark()
        return moved

    def begin_window(self) -> None:
        """Before the first measured (or traced) step: run.sync=async waits for the steps in flight."""
        if self.clock is not None:
            self.clock.begin_window()

    def end_window(self, steps: List[StepSample]) -> List[StepSample]:
        """After the last measured step: run.sync=async waits for the steps in flight and gives
        each measured step its GPU idle and busy time (the copies' GPU time goes to `copier`)."""
        if self.clock is None:
            return steps
        splits = split_steps(self.clock.end_window())
        if len(splits) != len(steps):
            raise RuntimeError(f"the GPU timeline has {len(splits)} steps, the window {len(steps)}")
        self.copier.gpu_ms.extend(split.h2d_ms for split in splits)
        return [with_gpu_split(step, split) for step, split in zip(steps, splits)]

    def step(self, sink: Optional[TimingSink]) -> StepSample:
        watchdog = self.watchdog
        t0 = time.perf_counter_ns()
        gap = t0 - self.last_end_ns if self.last_end_ns is not None else 0
        try:
            if self.stream.in_process:
                watchdog.arm(MAKING_BATCH)
            self._mark()
            batch = self.stream.next()
            self._mark()
            watchdog.arm(CONSUMING_BATCH)
            t1 = time.perf_counter_ns()
            data = self._to_device(batch.data, record=sink is not None)
            t2 = time.perf_counter_ns()
            data, batch = self.device_chain(data, batch)
            t2d = time.perf_counter_ns()
            self.consumer.step(data, batch.labels)
            if self.clock is not None:
                self.clock.mark()
                self.clock.end_step()  # may wait for the oldest step
            t3 = time.perf_counter_ns()
            if self.after_step is not None:
                # The collective waits for the slowest rank: distributed.collective_timeout_s bounds
                # it, the watchdog only this process's own work.
                watchdog.disarm()
                self.after_step(batch, self.stream.epochs)
            t4 = time.perf_counter_ns()
        except StepOverrun as exc:
            raise StepTimeoutError(f"{exc}; stopped the job (raise it if the step is only slow)") from None
        finally:
            watchdog.disarm()  # its cost lands in the next step's gap, the loop's own
        # Everything from here to the next step's start (records, freeing this batch's shared
        # memory when the locals die) is the main loop's own cost: the next step's gap.
        self.last_end_ns = t4
        self.last_done_ns = batch.done_ns
        if self.on_batch is not None:
            self.on_batch(batch, self.stream.epochs)
        if sink is not None:
            sink.add(batch)
            if self.after_measured is not None:
                self.after_measured()
        rec = self.trace
        if rec is not None:
            rec.add(MAIN_WAIT_SLICE, t0, t1)
            rec.add(MAIN_H2D_SLICE, t1, t2)
            if t2d > t2:
                rec.add(MAIN_DEVICE_SLICE, t2, t2d)
            rec.add(MAIN_STEP_SLICE, t2d, t3)
        return StepSample(gap_ns=gap, wait_ns=t1 - t0, h2d_ns=t2 - t1, compute_ns=t3 - t2d,
                          samples=int(batch.sample_ns.shape[0]), transfer_ns=t1 - batch.done_ns,
                          worker_id=batch.worker_id, ready=batch.done_ns < t0, collective_ns=t4 - t3,
                          epoch=self.stream.epochs, device_ns=t2d - t2, batch_bytes=batch_bytes(batch.data))


def drain_backlog(loop: StepLoop, least: int, since_ns: int, most: int,
                  agree: Optional[Callable[[bool], bool]] = None) -> int:
    """Steps that take what the workers made ahead of the loop while it was held since `since_ns`;
    returns their samples. At least `least` steps, then on until a batch finished after `since_ns`
    comes (a thread backend's queues hold more than workers x prefetch_factor: spdl's first 6 window
    steps came at once after a drain of 2), at most `most` more. `agree` as in the window."""
    samples = steps = 0
    while True:
        held_back = steps < least or (steps > 0 and loop.last_done_ns < since_ns and steps < least + most)
        if agree is not None:
            held_back = agree(held_back)
        if not held_back:
            return samples
        samples += loop.step(None).samples
        steps += 1


def measure_pass(loop: StepLoop, plan: PassPlan, sink: TimingSink, label: str,
                 marks: Optional[WindowMarks] = None,
                 agree: Optional[Callable[[bool], bool]] = None) -> PassResult:
    """First batch, warm-up, then whole worker cycles (no phase bias in a starved loop) until the
    plan's window and `run.min_time_s` are both reached, or `run.max_time_s` has passed.

    `marks` bracket the steady state. The holding ones (half a second of page-table walks at 8
    workers) hold the loop while the workers build a backlog that a window would get free, and a CPU
    meter would count without its CPU: so `drain_backlog` steps follow them, outside the clock and
    the quick meters' marks. `agree(want_more)` shares the wish to go on with the other ranks; its
    time is no step's.
    """
    start = time.perf_counter_ns()
    loop.step(None)
    first_batch_s = (time.perf_counter_ns() - start) / NS_PER_S
    for _ in range(plan.warmup):
        loop.step(None)
    drained_samples = 0
    if marks is not None:
        marks.holding(FIRST_MEASURED)
        drained_samples = drain_backlog(loop, plan.drain, time.perf_counter_ns(), plan.window, agree)
    start_epoch = loop.stream.epochs
    steps: List[StepSample] = []
    min_time_ns = plan.min_time_s * NS_PER_S
    max_time_ns = plan.max_time_s * NS_PER_S
    target, cycle = plan.window, plan.cycle
    bar = tqdm(total=target, desc=label, unit="step", leave=False, disable=None if plan.progress else True)
    measured_ns = 0
    samples = 0
    stop_reason = WINDOW_COMPLETE
    loop.begin_window()
    # The clock starts before the quick meters' first marks: what the workers make while those
    # read (tens of ms where worker threads hold the GIL) belongs to the window, and their time
    # is the first step's gap, the loop's own.
    loop.last_end_ns = time.perf_counter_ns()
    if marks is not None:
        marks.quick(FIRST_MEASURED)
    while True:
        want_more = len(steps) < target or measured_ns < min_time_ns or len(steps) % cycle != 0
        if want_more and steps and measured_ns >= max_time_ns:
            want_more, stop_reason = False, WINDOW_TIME_CAP
        if agree is not None:
            asked = time.perf_counter_ns()
            want_more = agree(want_more)
            loop.last_end_ns += time.perf_counter_ns() - asked  # the collective's wait is no step's
        if not want_more:
            break
        sample = loop.step(sink)
        steps.append(sample)
        measured_ns += sample.step_ns
        samples += sample.samples
        if not bar.disable:
            bar.update(1)
            bar.set_postfix(samples_per_s=f"{samples * NS_PER_S / measured_ns:.1f}")
    steps = loop.end_window(steps)
    if marks is not None:
        marks.quick(LAST_MEASURED)
        marks.holding(LAST_MEASURED)
    bar.close()
    return PassResult(first_batch_s, plan.warmup, steps, measured_ns / NS_PER_S, loop.stream.epochs,
                      dict(loop.stream.worker_startup_s), start_epoch, stop_reason, drained_samples)
