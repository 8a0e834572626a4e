"""The instrumented pipeline: every step is timed where it runs, and the timings ride with the batch.

The Dataset wrapper times the load, the decode of a lazily opened image and each per-sample
transform with `perf_counter_ns`; the
collate times itself and each per-batch transform, and returns the timings beside the batch.
So per-transform numbers exist for any `num_workers` with no IPC beyond the batch itself.
`record_function` labels are added only while a profiler is recording (workers=0), and one
viztrace slice per step only while a recorder is set (`trace=viztracer`, see pipebench.measure.viztrace);
with neither, the per-sample path does nothing per step beyond the clock reads and one test.
"""

import threading
import time
from collections import Counter
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Protocol, Sequence, Tuple, Union

import numpy as np
import torch
from PIL import ImageFile
from torch.utils.data import Dataset, default_collate, get_worker_info

from pipebench.base.lifeline import die_with_parent, multiprocessing_parent_alive
from pipebench.base.watchdog import StepOverrun
from pipebench.storage.dataset_contract import told
from pipebench.storage.file_reads import IO_FIELDS, NO_IO, file_reads_of
from pipebench.pipeline.stages import (
    COLLATE_STAGE,
    DECODE_STAGE,
    LOAD_STAGE,
    PER_BATCH_STAGE,
    PER_SAMPLE_STAGE,
)

DECODE_NAME = "decode"
# A transform that takes the undecoded image and decodes it itself (a reduced-size or region
# decode) sets this class attribute to True; when it is first in the chain the decode is left to it.
DECODES_ITSELF_ATTR = "decodes_itself"
COLLATE_NAME = "default_collate"
# Worker id recorded for batches made in the main process (num_workers=0, and a thread backend's
# batches: every thread of its pool makes samples of each batch, in the job's own process).
MAIN_PROCESS_WORKER = -1
# Sample index reported when a per-batch step fails: no single sample is to blame.
BATCH_FAILURE_INDEX = -1
# Attribute WorkerInit sets on a worker's dataset copy: the worker's perf_counter_ns at start.
WORKER_STARTED_ATTR = "_pipebench_worker_started_ns"


class StepName(NamedTuple):
    """One timed step: its stage and a name unique within the chain."""

    stage: str
    name: str


def numbered(names: Sequence[str]) -> List[str]:
    """Names made distinct: repeats get `#2`, `#3` so every row of the table is distinct."""
    seen: Counter = Counter()
    out = []
    for name in names:
        seen[name] += 1
        out.append(name if seen[name] == 1 else f"{name}#{seen[name]}")
    return out


def step_names(steps: Sequence[Callable], stage: str) -> List[StepName]:
    """Name steps by class, `numbered`."""
    return [StepName(stage, name) for name in numbered([type(step).__name__ for step in steps])]


class SampleFailure(NamedTuple):
    """A sample that raised; travels in place of the sample so the main process applies the policy."""

    index: int
    where: str
    step: str
    message: str


class TimedItem(NamedTuple):
    """One sample out of the per-sample chain, with its timings; the collate stacks them.

    `worker`: the thread-pool worker that made it (`ThreadNumbers`), or MAIN_PROCESS_WORKER where
    the batch's own worker id says (a DataLoader worker process makes every sample of its batch).
    """

    sample: Any
    target: Any
    timings: np.ndarray
    cpu_ns: int
    index: int
    io: np.ndarray
    worker: int = MAIN_PROCESS_WORKER


class ThreadNumbers:
    """Numbers the threads that call it 0, 1, 2... in the order each first does: the identity of a
    thread pool's workers, stable per thread for the pool's life (one epoch's), and 0..workers-1
    because the pool has `workers` threads. Thread-safe; a fresh one per pool."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._numbers: Dict[int, int] = {}

    def __call__(self) -> int:
        ident = threading.get_ident()
        number = self._numbers.get(ident)
        if number is None:
            with self._lock:
                number = self._numbers.setdefault(ident, len(self._numbers))
        return number


class NumberedGetitem:
    """`dataset[index]`, with the item stamped with the calling thread's number: what a thread
    backend maps over its pool, so per-worker figures exist for threads as for processes."""

    def __init__(self, dataset: "InstrumentedDataset") -> None:
        self.dataset = dataset
        self.numbers = ThreadNumbers()

    def __call__(self, index: int) -> Union[TimedItem, "SampleFailure"]:
        item = self.dataset[index]
        return item._replace(worker=self.numbers()) if isinstance(item, TimedItem) else item


class TimedBatch(NamedTuple):
    """A collated batch plus the timings of everything that made it.

    sample_ns: [n_samples, n_per_sample_steps] int64 wall time (load, decode, then the transforms); batch_ns:
    [1 + n_per_batch] wall time of the collate and per-batch steps. sample_cpu_ns / batch_cpu_ns:
    the thread CPU time of the same work, which oversubscribed workers cannot inflate.
    done_ns and worker_started_ns are perf_counter_ns stamps taken in the worker; on Linux that
    clock is CLOCK_MONOTONIC, shared by all processes, so the main loop can subtract its own.
    `worker_id` made the batch (collated it); `sample_workers` made each sample: the same worker
    process under the DataLoader, the pool's thread numbers under a thread backend.
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
    # The dataset index of every sample in `data`, in order, for the exactly-once check of
    # multi-rank runs (pipebench.measure.coverage); it rides back the same way the timings do.
    indices: np.ndarray = np.zeros(0, np.int64)
    # [n_samples, len(IO_FIELDS)] int64: what each sample's load step read from files (time,
    # bytes, files; pipebench.storage.file_reads); zeros for a dataset that reads no files.
    sample_io: np.ndarray = np.zeros((0, len(IO_FIELDS)), np.int64)
    # [n_samples] int64: the worker that made each sample (see the class doc).
    sample_workers: np.ndarray = np.zeros(0, np.int64)
    # Thread CPU ns of the CPU reference run after this batch in the same thread (calibrate=true,
    # pipebench.measure.cpu_reference); 0 where none ran. Not part of batch_cpu_ns.
    reference_cpu_ns: int = 0


def undecoded(sample: Any) -> bool:
    """A lazily opened PIL image whose pixels are not decoded yet (its tiles not read)."""
    return isinstance(sample, ImageFile.ImageFile) and bool(sample.tile)


class Labelled:
    """A step run inside its profiler label: what the chains call while a profiler records, so
    one loop serves both and the unprofiled chain enters no context manager."""

    __slots__ = ("name", "call")

    def __init__(self, name: str, call: Callable) -> None:
        self.name = name
        self.call = call

    def __call__(self, *args: Any) -> Any:
        with torch.profiler.record_function(self.name):
            return self.call(*args)


def labelled_steps(names: Sequence[str], steps: Sequence[Callable]) -> List[Labelled]:
    """Each step inside its label, `names` in step order."""
    return [Labelled(name, step) for name, step in zip(names, steps)]


class StreamEnd(Exception):
    """An iterable dataset has no more items (its StopIteration, which must not read as a bad sample)."""


def first_line(exc: BaseException) -> str:
    """`Type: the message's first line`, as a bad sample's or a failed step's line quotes its error."""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}".rstrip(": ")


def overrun_at(exc: StepOverrun, step: StepName, where: str) -> StepOverrun:
    """The watchdog's interrupt, naming the step of the chain it stopped and the sample it was on."""
    return exc.at(f"{step.stage}/{step.name} on {where}")


def _step_labels(steps: Sequence[StepName]) -> List[str]:
    """`stage/name` per step: the profiler label and the trace slice name, made once."""
    return [f"{step.stage}/{step.name}" for step in steps]


class _Traced:
    """A chain that may trace: `trace` is this process's viztrace recorder, or None (not tracing),
    never pickled (a recorder belongs to one process; the worker init sets a worker's own).
    `profiling` turns on torch.profiler labels (workers=0 profiled steps)."""

    profiling = False
    trace: Optional[Any] = None

    def __getstate__(self) -> dict:
        return {**self.__dict__, "trace": None}


class InstrumentedDataset(_Traced, Dataset):
    """Wraps a dataset: loads sample i, runs the per-sample chain, returns timings with the sample.
    The main process's `trace` comes from `VizTraceSession.start_main`, a worker's from its init."""

    def __init__(self, base: Dataset, transforms: Sequence[Callable]) -> None:
        self.base = base
        self.transforms = list(transforms)
        load_name = StepName(LOAD_STAGE, type(base).__name__)
        self.steps = [load_name, StepName(DECODE_STAGE, DECODE_NAME), *step_names(self.transforms, PER_SAMPLE_STAGE)]
        # Left to the first transform when it decodes by itself; else forced after the load.
        self.force_decode = not (self.transforms and getattr(self.transforms[0], DECODES_ITSELF_ATTR, False))
        self.labels = _step_labels(self.steps)
        # The base's file reader (pickled with it, so a worker's copy counts that worker's reads).
        self.reads = file_reads_of(base)

    def __len__(self) -> int:
        return len(self.base)

    def describe(self, index: int) -> str:
        return told(self.base).describe(index)

    def __getitem__(self, index: int):
        return self.timed_item(index, self.indexed)

    def indexed(self, index: int) -> Tuple[int, Any, Any]:
        """The base's sample `index` with its index in front, the shape a stream yields."""
        sample, target = self.base[index]
        return index, sample, target

    def timed_item(self, index: int, load: Callable[[int], Tuple[int, Any, Any]]):
        """`load(index)` -> (index, sample, target), then every transform, each timed by the clock:
        the one per-sample path, for map-style datasets and streams (InstrumentedIterable) alike.
        Profiler labels and trace slices stay outside the timed spans, and cost nothing when off.

        Returns the timed item, or a SampleFailure naming the step (a bad sample must not kill
        the worker: the policy in the main process decides). StreamEnd passes through.
        """
        timings = np.zeros(len(self.steps), dtype=np.int64)
        names, rec, labelled = self.labels, self.trace, self.profiling
        transforms = self.transforms
        if labelled:
            load = Labelled(names[0], load)
            transforms = labelled_steps(names[2:], transforms)
        step = 0
        reads = self.reads
        cpu_start = time.thread_time_ns()
        try:
            read_before = reads.counts() if reads is not None else None
            start = time.perf_counter_ns()
            index, sample, target = load(index)
            end = time.perf_counter_ns()
            timings[0] = end - start
            io = reads.since(read_before) if reads is not None else NO_IO
            if rec is not None:
                rec.add(names[0], start, end)
            if self.force_decode and undecoded(sample):
                step = 1
                decode = Labelled(names[1], sample.load) if labelled else sample.load
                start = time.perf_counter_ns()
                decode()
                end = time.perf_counter_ns()
                timings[1] = end - start
                if rec is not None:
                    rec.add(names[1], start, end)
            for step, transform in enumerate(transforms, start=2):
                start = time.perf_counter_ns()
                sample = transform(sample)
                end = time.perf_counter_ns()
                timings[step] = end - start
                if rec is not None:
                    rec.add(names[step], start, end)
        except (StreamEnd, StepOverrun) as exc:
            if isinstance(exc, StepOverrun):
                raise overrun_at(exc, self.steps[step], self.describe(index)) from None
            raise
        except Exception as exc:
            return SampleFailure(index, self.describe(index), self.steps[step].name, first_line(exc))
        return TimedItem(sample, target, timings, time.thread_time_ns() - cpu_start, int(index), io)


def _stacked(rows: List[np.ndarray], width: int) -> np.ndarray:
    """`rows` as one [len(rows), width] int64 array; a batch with no sample left keeps the width."""
    return np.stack(rows) if rows else np.zeros((0, width), np.int64)


class BatchReference(Protocol):
    def after_batch(self, batch_cpu_ns: int) -> int:
        """Count a batch's thread CPU ns; run the reference workload when due and answer its ns, else 0."""


class TimedCollate(_Traced):
    """Collates TimedItems, then runs the per-batch chain, timing both; then, when given one, the CPU
    reference when it is due (pipebench.measure.cpu_reference, handed in by the job as a `BatchReference`).

    In a worker it traces into the recorder on the worker's dataset copy (`get_worker_info().dataset
    .trace`); in the main process (workers=0) into its own `trace`, set by `start_main`.
    """

    def __init__(self, transforms: Sequence[Callable], reference: Optional[BatchReference] = None,
                 sample_steps: int = 0) -> None:
        self.transforms = list(transforms)
        self.steps = [StepName(COLLATE_STAGE, COLLATE_NAME), *step_names(self.transforms, PER_BATCH_STAGE)]
        self.labels = _step_labels(self.steps)
        self.reference = reference
        # The per-sample chain's step count: the width of a batch's sample_ns when no sample is left.
        self.sample_steps = sample_steps

    def __call__(self, items: List[Any]) -> TimedBatch:
        cpu_start = time.thread_time_ns()
        failures = tuple(item for item in items if isinstance(item, SampleFailure))
        good = [item for item in items if not isinstance(item, SampleFailure)]
        batch_ns = np.zeros(len(self.steps), dtype=np.int64)
        info = get_worker_info()
        if info is not None:
            worker_id = info.id
            started_ns = getattr(info.dataset, WORKER_STARTED_ATTR, 0)
            # Not self.trace: a forked worker's copy of this object still holds the main's recorder.
            rec = getattr(info.dataset, "trace", None)
        else:
            worker_id, started_ns, rec = MAIN_PROCESS_WORKER, 0, self.trace

        def batch(data: Any, labels: Any, samples: Tuple[np.ndarray, ...],
                  failed: Tuple[SampleFailure, ...]) -> TimedBatch:
            sample_ns, sample_cpu_ns, indices, sample_io, sample_workers = samples
            cpu_ns = time.thread_time_ns() - cpu_start
            reference = self.reference
            reference_ns = 0 if reference is None else reference.after_batch(cpu_ns + int(sample_cpu_ns.sum()))
            return TimedBatch(data, labels, sample_ns, batch_ns, sample_cpu_ns, cpu_ns, failed, worker_id, started_ns,
                              time.perf_counter_ns(), indices, sample_io, sample_workers, reference_ns)

        workers = [worker_id if item.worker == MAIN_PROCESS_WORKER else item.worker for item in good]
        samples = (_stacked([item.timings for item in good], self.sample_steps),
                   np.array([item.cpu_ns for item in good], dtype=np.int64),
                   np.array([item.index for item in good], dtype=np.int64),
                   _stacked([item.io for item in good], len(IO_FIELDS)), np.array(workers, dtype=np.int64))
        if not good:
            return batch(None, None, samples, failures)
        names = self.labels
        collate, transforms = default_collate, self.transforms
        if self.profiling:
            collate, *transforms = labelled_steps(names, [collate, *transforms])
        step = 0
        try:
            start = time.perf_counter_ns()
            data, labels = collate([(item.sample, item.target) for item in good])
            end = time.perf_counter_ns()
            batch_ns[0] = end - start
            if rec is not None:
                rec.add(names[0], start, end)
            for step, transform in enumerate(transforms, start=1):
                start = time.perf_counter_ns()
                data = transform(data)
                end = time.perf_counter_ns()
                batch_ns[step] = end - start
                if rec is not None:
                    rec.add(names[step], start, end)
        except StepOverrun as exc:
            raise overrun_at(exc, self.steps[step], f"a batch of {len(good)} samples") from None
        except Exception as exc:  # the whole batch is bad; the policy in the main process decides
            lost = SampleFailure(BATCH_FAILURE_INDEX, f"a batch of {len(good)} samples", self.steps[step].name,
                                 first_line(exc))
            return batch(None, None, tuple(array[:0] for array in samples), failures + (lost,) * len(good))
        return batch(data, labels, samples, failures)


class WorkerInit:
    """DataLoader `worker_init_fn`: ties the worker's life to the job process's, stamps the worker's
    start, applies the sharing strategy and, when a viztrace session is given, starts the worker's
    recorder on its dataset copy.

    torch's own check for a dead parent runs only between batches (every 5 s when idle, never
    inside a long transform) and under forkserver watches the forkserver, so a job process killed
    outright would leave its workers running; the kernel's parent-death signal does not.

    The stamp and the recorder land on the worker's own copy of the dataset, so the collate finds
    them there: no globals, and it pickles under spawn (the session is picklable).
    """

    def __init__(self, sharing_strategy: Optional[str], trace_session: Optional[Any] = None) -> None:
        self.sharing_strategy = sharing_strategy
        self.trace_session = trace_session

    def __call__(self, worker_id: int) -> None:
        die_with_parent(multiprocessing_parent_alive)
        dataset = get_worker_info().dataset
        setattr(dataset, WORKER_STARTED_ATTR, time.perf_counter_ns())
        if self.sharing_strategy is not None:
            torch.multiprocessing.set_sharing_strategy(self.sharing_strategy)
        if self.trace_session is not None:
            # Last, and before the worker loads anything: replaces the recorder a forked worker
            # inherited from the main process with the worker's own.
            self.trace_session.worker_init(worker_id, dataset)


def set_profiling_labels(dataset: InstrumentedDataset, collate: TimedCollate, enabled: bool) -> None:
    """Turn `record_function` labels on for in-process (workers=0) profiled steps."""
    dataset.profiling = enabled
    collate.profiling = enabled

