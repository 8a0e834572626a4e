"""The timed chain for an IterableDataset: the stream decides which samples each worker reads.

An iterable dataset for pipebench yields `(index, sample, target)`: the index is the sample's
place in the epoch's full set, so the exactly-once check (pipebench.measure.coverage) can see whether
the stream shards itself correctly by rank and worker. The load step is the time `next()` on
the stream takes. Items have the same shape as InstrumentedDataset's, so TimedCollate and the
step loop handle both alike. Profiler labels and viztrace slices are not emitted per step here.
"""

import time
from typing import Iterator

import numpy as np
from torch.utils.data import IterableDataset

from pipebench.base.watchdog import StepOverrun
from pipebench.pipeline.timed_chain import (
    InstrumentedDataset,
    SampleFailure,
    _first_line,
    overrun_at,
)

# Index reported when pulling the next item from the stream fails: the stream never said which.
UNKNOWN_INDEX = -1


class InstrumentedIterable(InstrumentedDataset, IterableDataset):
    """Wraps an IterableDataset of `(index, sample, target)`; yields the timed items.

    Inherits the step names, `describe` and pickling from InstrumentedDataset; a bad sample
    becomes a SampleFailure in the stream, as in the map-style wrapper.
    """

    def __getitem__(self, index: int):
        raise TypeError("an iterable dataset is read by iterating it")

    def __iter__(self) -> Iterator:
        source = iter(self.base)
        while True:
            timings = np.zeros(len(self.steps), dtype=np.int64)
            index, step = UNKNOWN_INDEX, 0
            cpu_start = time.thread_time_ns()
            try:
                start = time.perf_counter_ns()
                try:
                    index, sample, target = next(source)
                except StopIteration:
                    return
                timings[0] = time.perf_counter_ns() - start
                for step, transform in enumerate(self.transforms, start=1):
                    start = time.perf_counter_ns()
                    sample = transform(sample)
                    timings[step] = time.perf_counter_ns() - start
            except StepOverrun as exc:
                raise overrun_at(exc, self.steps[step], self.describe(index)) from None
            except Exception as exc:  # the policy in the main process decides, as for map-style
                yield SampleFailure(index, self.describe(index), self.steps[step].name, _first_line(exc))
                continue
            yield sample, target, timings, time.thread_time_ns() - cpu_start, int(index)
