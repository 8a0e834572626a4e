"""Which step loop a job runs: asynchronous, as training runs, or synchronised at every phase.

`run.sync=auto` (the default) runs ahead wherever a consumer trains on CUDA: the pinned batch
is copied non-blocking, nothing waits inside a step, and CUDA events are read late with at
most MAX_STEPS_IN_FLIGHT steps in flight (pipebench.base.gpu_timing.AsyncStepClock).
`run.sync=per_step` finishes every phase before the next, so each is timed on its own (the
copy, the consumer's forward / backward / optimizer). A consumer that cannot run ahead (one on
the CPU, where every op is synchronous; `emulated`, which sleeps on the host; `none`) runs the
synchronous path; when async was asked for, or a training consumer ends up on the CPU, one
line says so. The summary's `step_sync` names the loop a row used.
"""

from dataclasses import dataclass
from typing import Any, Optional

from pipebench.base.gpu_timing import AsyncStepClock
from pipebench.config.specs import SYNC_ASYNC, SYNC_AUTO, SYNC_PER_STEP


@dataclass(frozen=True)
class StepSync:
    """The loop a job runs (`async` or `per_step`) and the one-line notice, if any."""

    mode: str
    note: Optional[str] = None

    def clock(self) -> Optional[AsyncStepClock]:
        """A fresh clock for one step loop, or None for the synchronised loop."""
        return AsyncStepClock() if self.mode == SYNC_ASYNC else None


def _can_run_ahead(consumer: Any) -> bool:
    return hasattr(consumer, "run_ahead")


def resolve_sync(requested: str, consumer: Any) -> StepSync:
    """The loop for `consumer` under run.sync=`requested`; switches the consumer to run ahead."""
    if requested == SYNC_PER_STEP:
        return StepSync(SYNC_PER_STEP)
    device = getattr(consumer, "device", None)
    on_cuda = device is not None and device.type == "cuda"
    if on_cuda and _can_run_ahead(consumer):
        consumer.run_ahead()
        return StepSync(SYNC_ASYNC)
    if requested == SYNC_AUTO and not _can_run_ahead(consumer):
        return StepSync(SYNC_PER_STEP)  # nothing of its own runs on a GPU: nothing to run ahead of
    where = f"on {device}" if device is not None else "on the host"
    return StepSync(SYNC_PER_STEP, f"note: run.sync={requested}: the consumer runs {where}, not on a CUDA "
                                   "device, so the synchronous CPU path ran (step_sync=per_step)")
