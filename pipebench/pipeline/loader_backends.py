"""The loader seam: what makes a job's batches, behind one protocol (`loader.backend`).

Every backend is built from the JobSpec, the instrumented dataset and the timed collate, and
yields the same `TimedBatch` items the step loop consumes, so per-transform timings ride back
with each batch whatever runs the chain. `dataloader` is torch's DataLoader (worker processes);
`threads` is torchdata.nodes on a thread pool; `spdl` an SPDL pipeline on a thread pool.

Under every backend a batch that does not come within `loader.timeout_s` ends the job in one line
(DataLoader's "timed out"; `StuckThreadError` on threads, whose stuck thread cannot be stopped, so
the job process exits without joining it).

`workers=0` is one loop under every backend: the main thread makes each batch, so it is built
as the DataLoader's in-process loop (and keeps the watchdog and the workers=0 profile).
"""

import math
import queue
import threading
from concurrent.futures import ThreadPoolExecutor
from contextlib import suppress
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterable, Iterator, List, Optional, Protocol, Sequence, Tuple, runtime_checkable

import torch
from torch.utils.data import DataLoader, DistributedSampler, IterableDataset, RandomSampler, SequentialSampler
from torch.utils.data._utils.pin_memory import pin_memory

from pipebench.base.errors import ConfigError, StuckThreadError
from pipebench.base.extras import MissingExtra, installed, missing_line
from pipebench.config.specs import BACKEND_WORKER_KINDS, PROCESSES, THREADS, JobSpec
from pipebench.storage.rank_info import rank_and_world
from pipebench.pipeline.timed_chain import InstrumentedDataset, NumberedGetitem, TimedBatch, TimedCollate, WorkerInit

__all__ = ["BACKENDS", "PROCESSES", "THREADS", "BackendInfo", "DataLoaderBackend", "LoaderBackend",
           "SpdlBackend", "ThreadsBackend", "backend_missing", "backend_problem", "build_backend", "build_loader",
           "build_sampler", "check_backends", "pin_memory_effective", "stuck_thread"]


def pin_memory_effective(spec: JobSpec) -> bool:
    """Pinning needs an accelerator; without one DataLoader warns and does nothing useful."""
    return spec.loader.pin_memory and torch.cuda.is_available()


def build_sampler(spec: JobSpec, dataset: InstrumentedDataset) -> Optional[Any]:
    """None for an iterable dataset (it shards itself); a DistributedSampler in a multi-rank run
    (same seed on every rank, so the shares are disjoint); else random or sequential order."""
    if isinstance(dataset, IterableDataset):
        return None
    rank, world = rank_and_world()
    if world > 1:
        return DistributedSampler(dataset, num_replicas=world, rank=rank, shuffle=spec.loader.shuffle,
                                  seed=spec.run.seed, drop_last=spec.loader.drop_last)
    generator = torch.Generator().manual_seed(spec.run.seed)
    return RandomSampler(dataset, generator=generator) if spec.loader.shuffle else SequentialSampler(dataset)


def build_loader(spec: JobSpec, dataset: InstrumentedDataset, collate: TimedCollate,
                 trace_session: Optional[Any] = None) -> DataLoader:
    """A DataLoader as the user asked for it; worker-only arguments are dropped at workers=0.

    `trace_session` (a viztrace.VizTraceSession) makes every worker start its own recorder.
    """
    kwargs = dict(
        batch_size=spec.loader.batch_size,
        sampler=build_sampler(spec, dataset),
        drop_last=spec.loader.drop_last,
        collate_fn=collate,
        num_workers=spec.workers,
        pin_memory=pin_memory_effective(spec),
    )
    if spec.workers > 0:
        # DataLoader raises a ValueError for these with num_workers=0: they configure workers.
        kwargs.update(
            prefetch_factor=spec.loader.prefetch_factor,
            persistent_workers=spec.loader.persistent_workers,
            multiprocessing_context=spec.loader.multiprocessing_context,
            timeout=spec.loader.timeout_s,
            worker_init_fn=WorkerInit(spec.loader.sharing_strategy, trace_session),
        )
    return DataLoader(dataset, **kwargs)


@dataclass(frozen=True)
class BackendInfo:
    """One backend: the kind of worker it runs, the module it needs and the extra that installs it."""

    name: str
    module: Optional[str]
    extra: Optional[str]
    # A map-only backend reads samples by index; an IterableDataset cannot feed it.
    map_only: bool

    @property
    def worker_kind(self) -> str:
        """Processes or threads, from the one table of them (config.specs.BACKEND_WORKER_KINDS)."""
        return BACKEND_WORKER_KINDS[self.name]


BACKENDS: Dict[str, BackendInfo] = {
    info.name: info for info in (
        BackendInfo("dataloader", None, None, map_only=False),
        BackendInfo("threads", "torchdata.nodes", "threads", map_only=True),
        BackendInfo("spdl", "spdl.pipeline", "spdl", map_only=True),
    )
}


@runtime_checkable
class LoaderBackend(Protocol):
    """What the step loop needs from a loader: each `iter()` is one epoch of TimedBatch items.

    The per-worker hooks: `worker_kind` says what the `num_workers` workers are (PROCESSES or
    THREADS: the window's cycle, the capacity figures, the diagnosis's model and the per-worker
    breakdown follow it), and each batch says which worker made each of its samples
    (`TimedBatch.sample_workers`: a DataLoader worker's id; a pool thread's number 0..W-1,
    `timed_chain.NumberedGetitem`, under a thread backend).
    """

    name: str
    worker_kind: str
    num_workers: int
    # The index sampler (None for a stream); the step loop tells a DistributedSampler the epoch.
    sampler: Optional[Any]

    def __iter__(self) -> Iterator[TimedBatch]: ...

    def __len__(self) -> int: ...

    def close(self) -> None: ...


def _unreadable(info: BackendInfo, dataset: Any) -> str:
    """Why backend `info` cannot read `dataset` whatever is installed ("" when it can)."""
    if info.map_only and isinstance(dataset, IterableDataset):
        return (f"loader.backend={info.name} reads samples by index; dataset {type(dataset).__name__} is an "
                "IterableDataset (use loader.backend=dataloader)")
    return ""


def backend_missing(name: str, dataset: Any) -> Optional[MissingExtra]:
    """The library loader.backend=`name` lacks here to read `dataset`, with the extra that installs it;
    None when it lacks none, or when it could not read that dataset anyway (installing would not help)."""
    info = BACKENDS[name]
    if info.module is None or installed(info.module) or _unreadable(info, dataset):
        return None
    return MissingExtra(f"loader.backend={info.name}", info.module.split(".")[0], info.extra)


def backend_problem(name: str, dataset: Any) -> str:
    """Why loader.backend=`name` cannot read `dataset` here, in one line ("" when it can): it reads
    samples by index and the dataset is an IterableDataset, or its library is not installed."""
    lacking = backend_missing(name, dataset)
    return missing_line([lacking]) if lacking is not None else _unreadable(BACKENDS[name], dataset)


def check_backends(jobs: Sequence[Tuple[str, Any]]) -> None:
    """Plan-time check of a sweep's (backend, dataset) pairs (ConfigError): every library missing
    for any of them in one line with one install command, so a second try does not stop at the
    next one; then each backend can read its dataset."""
    lacking = [m for m in dict.fromkeys(backend_missing(name, dataset) for name, dataset in jobs) if m is not None]
    if lacking:
        raise ConfigError(missing_line(lacking))
    for name, dataset in jobs:
        problem = backend_problem(name, dataset)
        if problem:
            raise ConfigError(problem)


class DataLoaderBackend:
    """torch's DataLoader, as `build_loader` makes it: worker processes with their start method."""

    name = "dataloader"
    worker_kind = PROCESSES

    def __init__(self, loader: DataLoader) -> None:
        self.loader = loader
        self.num_workers = loader.num_workers
        self.sampler = loader.sampler

    def __iter__(self) -> Iterator[TimedBatch]:
        return iter(self.loader)

    def __len__(self) -> int:
        return len(self.loader)

    def close(self) -> None:
        """Workers end with their iterator (the step loop drops it); nothing else is held."""


class _ThreadPoolBackend:
    """What the thread-pool backends share: the sampler, the batch settings; a fresh pipeline an epoch."""

    worker_kind = THREADS

    def __init__(self, spec: JobSpec, dataset: InstrumentedDataset, collate: TimedCollate) -> None:
        self.dataset = dataset
        self.collate = collate
        self.num_workers = spec.workers
        self.sampler = build_sampler(spec, dataset)
        self.batch_size = spec.loader.batch_size
        self.drop_last = spec.loader.drop_last
        self.prefetch = spec.loader.prefetch_factor
        self.pin = pin_memory_effective(spec)
        self.timeout_s = spec.loader.timeout_s

    def __len__(self) -> int:
        samples = len(self.sampler)
        return samples // self.batch_size if self.drop_last else math.ceil(samples / self.batch_size)

    def close(self) -> None:
        """Each epoch's threads end when its iterator ends or is dropped."""


class ThreadsBackend(_ThreadPoolBackend):
    """torchdata.nodes: sampler -> ParallelMapper(thread) over __getitem__ -> Batcher -> the timed
    collate -> PinMemory (when pinning is effective), pulled `prefetch_factor` batches ahead on a
    thread of its own (`_handed_off`: torchdata's Prefetcher would wait for a stuck thread forever).
    A fresh graph an epoch, as a DataLoader without persistent workers starts fresh workers; the
    collate runs on the puller's one thread."""

    name = "threads"

    def __iter__(self) -> Iterator[TimedBatch]:
        import torchdata.nodes as nodes

        # in_order: batches hold the sampler's order, as the DataLoader's do.
        built = [nodes.ParallelMapper(nodes.IterableWrapper(self.sampler), NumberedGetitem(self.dataset),
                                      num_workers=self.num_workers, in_order=True, method="thread")]
        built.append(nodes.Batcher(built[-1], self.batch_size, drop_last=self.drop_last))
        built.append(nodes.Mapper(built[-1], self.collate))
        if self.pin:
            built.append(nodes.PinMemory(built[-1]))
        loader = nodes.Loader(built[-1], restart_on_stop_iteration=False)
        return _handed_off(loader, self.prefetch, self.timeout_s, self.name, lambda: _stop_graph(built))


def stuck_thread(backend: str, timeout_s: float) -> StuckThreadError:
    """A thread backend's line for a batch that did not come, worded and numbered as DataLoader's own
    timeout (`DataLoader timed out after 1.0 seconds`), with the hint worker_faults_named adds."""
    return StuckThreadError(f"{backend} timed out after {float(timeout_s)} seconds (loader.timeout_s={timeout_s:g}; a "
                            "worker thread is stuck in a sample and a thread cannot be stopped: the job process "
                            "exits without it)")


def _stop_graph(built: List[Any]) -> None:
    """Join the threads of a torchdata graph's nodes now. torchdata stops them only in `__del__`, and a
    daemon thread still running a transform when the job process exits aborts it (SIGABRT, seen here).
    A thread stuck in a transform is waited for only torchdata's join timeout."""
    for node in reversed(built):  # the root first, so nothing upstream is pulled again
        it = getattr(node, "_it", None)
        while it is not None:  # ParallelMapper -> its impl -> the iterator that owns the threads
            shutdown = getattr(it, "_shutdown", None)
            if shutdown is not None:
                shutdown()
            it = getattr(it, "_it", None)


# How often the puller looks whether the epoch was dropped while its queue is full.
HANDOFF_POLL_S = 0.1
# The end of an epoch on the hand-off queue.
_END = object()


def _handed_off(source: Iterable[TimedBatch], depth: int, timeout_s: float, backend: str,
                stop: Callable[[], None]) -> Iterator[TimedBatch]:
    """One epoch of `source`, pulled on a thread of its own up to `depth` batches ahead; each batch
    waited for at most `timeout_s` (then StuckThreadError). `stop()` ends the source's threads when
    the epoch ends, fails or is dropped; then the puller ends too."""
    handoff: "queue.Queue[Tuple[Any, Optional[BaseException]]]" = queue.Queue(maxsize=depth)
    dropped = threading.Event()

    def put(item: Any, error: Optional[BaseException] = None) -> None:
        while not dropped.is_set():
            with suppress(queue.Full):
                handoff.put((item, error), timeout=HANDOFF_POLL_S)
                return

    def pull() -> None:
        try:
            for batch in source:
                put(batch)
            put(_END)
        except BaseException as exc:  # the collate's own failure: raised in the main thread
            put(None, exc)

    puller = threading.Thread(target=pull, name=f"pipebench-{backend}-prefetch", daemon=True)
    puller.start()
    try:
        while True:
            try:
                item, error = handoff.get(timeout=timeout_s)
            except queue.Empty:
                raise stuck_thread(backend, timeout_s) from None
            if error is not None:
                raise error
            if item is _END:
                return
            yield item
    finally:
        dropped.set()
        stop()


class SpdlBackend(_ThreadPoolBackend):
    """An SPDL pipeline: the sampler as source -> __getitem__ on `workers` threads (input order) ->
    aggregate a batch -> the timed collate -> prefetch. A fresh pipeline an epoch."""

    name = "spdl"

    def __iter__(self) -> Iterator[TimedBatch]:
        from spdl.pipeline import AsyncQueue, PipelineBuilder

        # A pool of exactly `workers` threads for the per-sample chain: `concurrency` alone lets
        # SPDL run the op on its shared pool (measured here: 1.3 samples in flight at concurrency=1).
        pool = ThreadPoolExecutor(max_workers=self.num_workers, thread_name_prefix="pipebench-spdl")
        builder = (PipelineBuilder()
                   .add_source(list(self.sampler))
                   .pipe(NumberedGetitem(self.dataset), concurrency=self.num_workers, executor=pool,
                         output_order="input")
                   .aggregate(self.batch_size, drop_last=self.drop_last)
                   .pipe(self.collate))
        if self.pin:  # the whole TimedBatch, as DataLoader pins it
            builder = builder.pipe(pin_memory)
        # The collate gets a thread of its own beside the per-sample ones.
        # Plain queues and no task hooks: SPDL's default ones time every task and log a stats
        # table at each epoch's end, work and lines the job's own timing already covers.
        pipeline = builder.add_sink(self.prefetch).build(num_threads=self.num_workers + 1, queue_class=AsyncQueue,
                                                         task_hook_factory=lambda stage: [])
        return _spdl_epoch(pipeline, pool, self.timeout_s)


def _spdl_epoch(pipeline: Any, pool: ThreadPoolExecutor, timeout_s: float) -> Iterator[TimedBatch]:
    """One epoch; the pipeline stops and its pool ends when the epoch does or is dropped. A batch
    not out within `timeout_s` (SPDL's own wait) is a StuckThreadError."""
    try:
        with pipeline.auto_stop():
            try:
                yield from pipeline.get_iterator(timeout=timeout_s)
            except TimeoutError:
                raise stuck_thread(SpdlBackend.name, timeout_s) from None
    finally:
        pool.shutdown(wait=False, cancel_futures=True)


def build_backend(spec: JobSpec, dataset: InstrumentedDataset, collate: TimedCollate,
                  trace_session: Optional[Any] = None) -> LoaderBackend:
    """The backend `loader.backend` names (the DataLoader's in-process loop at workers=0)."""
    check_backends([(spec.loader.backend, dataset)])
    if spec.loader.backend == "dataloader" or spec.workers == 0:
        return DataLoaderBackend(build_loader(spec, dataset, collate, trace_session))
    if spec.loader.backend == "threads":
        return ThreadsBackend(spec, dataset, collate)
    return SpdlBackend(spec, dataset, collate)
