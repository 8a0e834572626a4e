"""The steps that run on a batch after the host-to-device copy (`transform.on_device`), timed.

They run in the main process, on the consumer's device (the host CPU when it has none): the
late cast (uint8 across the worker boundary and the copy, float after it) and the batch forms
moved to the device. Their wall and thread CPU time join the batch's per-batch timings, so the
transform table and `cpu_ms_per_sample` count them like any other step. On CUDA the wall time
is the launch (the kernels run asynchronously; the consumer's step waits for them).
"""

import time
from typing import Any, Callable, Sequence

import numpy as np

from pipebench.base.errors import BatchStepError, PipebenchError
from pipebench.pipeline.timed_chain import TimedBatch, first_line, step_names

ON_DEVICE_STAGE = "on_device"
# A failed batch's line names at most this many of its samples' dataset indices.
NAMED_INDICES = 8


class DeviceChain:
    """Applies the on-device steps to a copied batch and adds their timings to the TimedBatch."""

    def __init__(self, transforms: Sequence[Callable]) -> None:
        self.transforms = list(transforms)
        self.steps = step_names(self.transforms, ON_DEVICE_STAGE)

    def __bool__(self) -> bool:
        return bool(self.transforms)

    def __call__(self, data: Any, batch: TimedBatch):
        """(the transformed data, `batch` with these steps' wall and CPU time appended)."""
        if not self.transforms:
            return data, batch
        timings = np.zeros(len(self.transforms), dtype=np.int64)
        cpu_start = time.thread_time_ns()
        for k, transform in enumerate(self.transforms):
            start = time.perf_counter_ns()
            try:
                data = transform(data)
            except PipebenchError:
                raise
            except Exception as exc:  # a user's step, or a decode meeting a corrupt file: one line
                raise BatchStepError(_failure_line(self.steps[k].name, batch, exc)) from exc
            timings[k] = time.perf_counter_ns() - start
        cpu_ns = time.thread_time_ns() - cpu_start
        return data, batch._replace(batch_ns=np.concatenate([batch.batch_ns, timings]),
                                    batch_cpu_ns=batch.batch_cpu_ns + cpu_ns)


def _failure_line(step: str, batch: TimedBatch, exc: Exception) -> str:
    indices = [int(i) for i in batch.indices]
    named = ", ".join(map(str, indices[:NAMED_INDICES])) + (", ..." if len(indices) > NAMED_INDICES else "")
    samples = f"the batch of samples {named}" if indices else "a batch"
    return (f"transform.on_device step {step} failed on {samples}: {first_line(exc)} (a step after the copy "
            "runs on the whole batch, so run.on_error=skip cannot drop one sample there)")
