"""The instrumented pipeline: every step is timed where it runs, and the timings ride with the batch.

The Dataset wrapper times the load and each per-sample transform with `perf_counter_ns`; the
collate times itself and each per-batch transform, and returns the timings beside the batch.
So per-transform numbers exist for any `num_workers` with no IPC beyond the batch itself.
`record_function` labels are added only while a profiler is recording (workers=0).
"""

import time
from contextlib import nullcontext
from typing import Any, Callable, List, NamedTuple, Sequence, Tuple

import numpy as np
import torch
from torch.utils.data import Dataset, default_collate, get_worker_info

LOAD_STAGE = "load"
PER_SAMPLE_STAGE = "per_sample"
COLLATE_STAGE = "collate"
PER_BATCH_STAGE = "per_batch"
COLLATE_NAME = "default_collate"
# Worker id recorded for batches made in the main process (num_workers=0).
MAIN_PROCESS_WORKER = -1


class StepName(NamedTuple):
    """One timed step: its stage and a name unique within the chain."""

    stage: str
    name: str


def step_names(steps: Sequence[Callable], stage: str) -> List[StepName]:
    """Name steps by class; repeats get `#2`, `#3` so every row of the table is distinct."""
    seen: dict = {}
    names = []
    for step in steps:
        base = type(step).__name__
        seen[base] = seen.get(base, 0) + 1
        names.append(StepName(stage, base if seen[base] == 1 else f"{base}#{seen[base]}"))
    return names


class SampleFailure(NamedTuple):
    """A sample that raised; travels in place of the sample so the main process applies the policy."""

    index: int
    where: str
    step: str
    message: str


class TimedBatch(NamedTuple):
    """A collated batch plus the timings of everything that made it.

    sample_ns: [n_samples, n_per_sample_steps] int64 (load first); batch_ns: [1 + n_per_batch].
    done_ns: the worker's perf_counter_ns when the batch was finished (CLOCK_MONOTONIC, shared
    by all processes on Linux), so the main loop can measure transfer latency.
    """

    data: Any
    labels: Any
    sample_ns: np.ndarray
    batch_ns: np.ndarray
    failures: Tuple[SampleFailure, ...]
    worker_id: int
    done_ns: int


def _label(enabled: bool, name: str):
    return torch.profiler.record_function(name) if enabled else nullcontext()


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}".rstrip(": ")


class InstrumentedDataset(Dataset):
    """Wraps a dataset: loads sample i, runs the per-sample chain, returns timings with the sample."""

    def __init__(self, base: Dataset, transforms: Sequence[Callable]) -> None:
        self.base = base
        self.transforms = list(transforms)
        load_name = StepName(LOAD_STAGE, type(base).__name__)
        self.steps = [load_name, *step_names(self.transforms, PER_SAMPLE_STAGE)]
        self.profiling = False

    def __len__(self) -> int:
        return len(self.base)

    def describe(self, index: int) -> str:
        describe = getattr(self.base, "describe", None)
        return describe(index) if describe is not None else f"sample {index}"

    def __getitem__(self, index: int):
        timings = np.zeros(len(self.steps), dtype=np.int64)
        labels = self.profiling
        step = self.steps[0]
        try:
            start = time.perf_counter_ns()
            with _label(labels, f"{LOAD_STAGE}/{step.name}"):
                sample, target = self.base[index]
            timings[0] = time.perf_counter_ns() - start
            for i, transform in enumerate(self.transforms, start=1):
                step = self.steps[i]
                start = time.perf_counter_ns()
                with _label(labels, f"{PER_SAMPLE_STAGE}/{step.name}"):
                    sample = transform(sample)
                timings[i] = time.perf_counter_ns() - start
        except Exception as exc:  # a bad sample must not kill the worker: the policy decides
            return SampleFailure(index, self.describe(index), step.name, _first_line(exc))
        return sample, target, timings


class TimedCollate:
    """Collates (sample, target, timings) triples, then runs the per-batch chain, timing both."""

    def __init__(self, transforms: Sequence[Callable]) -> None:
        self.transforms = list(transforms)
        self.steps = [StepName(COLLATE_STAGE, COLLATE_NAME), *step_names(self.transforms, PER_BATCH_STAGE)]
        self.profiling = False

    def __call__(self, items: List[Any]) -> TimedBatch:
        failures = tuple(item for item in items if isinstance(item, SampleFailure))
        good = [item for item in items if not isinstance(item, SampleFailure)]
        batch_ns = np.zeros(len(self.steps), dtype=np.int64)
        info = get_worker_info()
        worker_id = info.id if info is not None else MAIN_PROCESS_WORKER
        if not good:
            return TimedBatch(None, None, np.zeros((0, 0), np.int64), batch_ns, failures, worker_id,
                              time.perf_counter_ns())
        start = time.perf_counter_ns()
        with _label(self.profiling, f"{COLLATE_STAGE}/{COLLATE_NAME}"):
            data, labels = default_collate([(sample, target) for sample, target, _ in good])
        batch_ns[0] = time.perf_counter_ns() - start
        for i, transform in enumerate(self.transforms, start=1):
            start = time.perf_counter_ns()
            with _label(self.profiling, f"{PER_BATCH_STAGE}/{self.steps[i].name}"):
                data = transform(data)
            batch_ns[i] = time.perf_counter_ns() - start
        sample_ns = np.stack([timings for _, _, timings in good])
        return TimedBatch(data, labels, sample_ns, batch_ns, failures, worker_id, time.perf_counter_ns())


def set_profiling_labels(dataset: InstrumentedDataset, collate: TimedCollate, enabled: bool) -> None:
    """Turn `record_function` labels on for in-process (workers=0) profiled steps."""
    dataset.profiling = enabled
    collate.profiling = enabled


def batch_size_of(batch: TimedBatch) -> int:
    return int(batch.sample_ns.shape[0])
