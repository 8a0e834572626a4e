"""The instrumented pipeline: every step is timed where it runs, and the timings ride with the batch.

The Dataset wrapper times the load and each per-sample transform with `perf_counter_ns`; the
collate times itself and each per-batch transform, and returns the timings beside the batch.
So per-transform numbers exist for any `num_workers` with no IPC beyond the batch itself.
`record_function` labels are added only while a profiler is recording (workers=0).
"""

import time
from contextlib import nullcontext
from typing import Any, Callable, List, NamedTuple, Optional, Sequence, Tuple

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
# Sample index reported when a per-batch step fails: no single sample is to blame.
BATCH_FAILURE_INDEX = -1
# Attribute WorkerInit sets on a worker's dataset copy: the worker's perf_counter_ns at start.
WORKER_STARTED_ATTR = "_pipebench_worker_started_ns"


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

    sample_ns: [n_samples, n_per_sample_steps] int64 wall time (load first); batch_ns:
    [1 + n_per_batch] wall time of the collate and per-batch steps. sample_cpu_ns / batch_cpu_ns:
    the thread CPU time of the same work, which oversubscribed workers cannot inflate.
    done_ns and worker_started_ns are perf_counter_ns stamps taken in the worker; on Linux that
    clock is CLOCK_MONOTONIC, shared by all processes, so the main loop can subtract its own.
    """

    data: Any
    labels: Any
    sample_ns: np.ndarray
    batch_ns: np.ndarray
    sample_cpu_ns: np.ndarray
    batch_cpu_ns: int
    failures: Tuple[SampleFailure, ...]
    worker_id: int
    worker_started_ns: int
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
        cpu_start = time.thread_time_ns()
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
        return sample, target, timings, time.thread_time_ns() - cpu_start


class TimedCollate:
    """Collates (sample, target, timings) triples, then runs the per-batch chain, timing both."""

    def __init__(self, transforms: Sequence[Callable]) -> None:
        self.transforms = list(transforms)
        self.steps = [StepName(COLLATE_STAGE, COLLATE_NAME), *step_names(self.transforms, PER_BATCH_STAGE)]
        self.profiling = False

    def __call__(self, items: List[Any]) -> TimedBatch:
        cpu_start = time.thread_time_ns()
        failures = tuple(item for item in items if isinstance(item, SampleFailure))
        good = [item for item in items if not isinstance(item, SampleFailure)]
        batch_ns = np.zeros(len(self.steps), dtype=np.int64)
        info = get_worker_info()
        worker_id = info.id if info is not None else MAIN_PROCESS_WORKER
        started_ns = getattr(info.dataset, WORKER_STARTED_ATTR, 0) if info is not None else 0

        def batch(data: Any, labels: Any, sample_ns: np.ndarray, sample_cpu_ns: np.ndarray,
                  failed: Tuple[SampleFailure, ...]) -> TimedBatch:
            return TimedBatch(data, labels, sample_ns, batch_ns, sample_cpu_ns, time.thread_time_ns() - cpu_start,
                              failed, worker_id, started_ns, time.perf_counter_ns())

        if not good:
            return batch(None, None, np.zeros((0, len(self.steps)), np.int64), np.zeros(0, np.int64), failures)
        sample_ns = np.stack([item[2] for item in good])
        sample_cpu_ns = np.array([item[3] for item in good], dtype=np.int64)
        step = self.steps[0]
        try:
            start = time.perf_counter_ns()
            with _label(self.profiling, f"{COLLATE_STAGE}/{COLLATE_NAME}"):
                data, labels = default_collate([(item[0], item[1]) for item in good])
            batch_ns[0] = time.perf_counter_ns() - start
            for i, transform in enumerate(self.transforms, start=1):
                step = self.steps[i]
                start = time.perf_counter_ns()
                with _label(self.profiling, f"{PER_BATCH_STAGE}/{step.name}"):
                    data = transform(data)
                batch_ns[i] = time.perf_counter_ns() - start
        except Exception as exc:  # the whole batch is bad; the policy in the main process decides
            lost = SampleFailure(BATCH_FAILURE_INDEX, f"a batch of {len(good)} samples", step.name,
                                 _first_line(exc))
            return batch(None, None, sample_ns[:0], sample_cpu_ns[:0], failures + (lost,) * len(good))
        return batch(data, labels, sample_ns, sample_cpu_ns, failures)


class WorkerInit:
    """DataLoader `worker_init_fn`: stamps the worker's start and applies the sharing strategy.

    The stamp lands on the worker's own copy of the dataset, so the collate can send it back
    with the worker's batches: no globals, and it pickles under spawn.
    """

    def __init__(self, sharing_strategy: Optional[str]) -> None:
        self.sharing_strategy = sharing_strategy

    def __call__(self, worker_id: int) -> None:
        setattr(get_worker_info().dataset, WORKER_STARTED_ATTR, time.perf_counter_ns())
        if self.sharing_strategy is not None:
            torch.multiprocessing.set_sharing_strategy(self.sharing_strategy)


def set_profiling_labels(dataset: InstrumentedDataset, collate: TimedCollate, enabled: bool) -> None:
    """Turn `record_function` labels on for in-process (workers=0) profiled steps."""
    dataset.profiling = enabled
    collate.profiling = enabled

