"""Watch a user's own DataLoader in the user's own loop: the wait in next() and the step between.

`LoaderWatch` wraps the epochs of one loader. Per batch it times the time blocked in `next()` (the
data wait) and the time from the batch's delivery to the next call of `next()` (the user's step),
over a bounded window after some warm-up steps; then batches pass through untouched. Each epoch's
first batch stays apart (worker start-up), as the harness keeps it apart. `watching_loaders` patches
`torch.utils.data.DataLoader` for a `with` block so every loader a script iterates is watched, each
named by its `LoaderIdentity`. The figures come from the harness's own summary
(`summarize.summary_row`), so a watched loop and a pipebench job are read by one rule.
"""

import contextlib
import itertools
import sys
import time
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterator, List, Mapping, Optional, Sequence, Set, Tuple, Union

import numpy as np
import torch
from torch.utils.data import DataLoader

from pipebench.attach.built_with import BuiltWith, recording_datasets
from pipebench.attach.call_site import UNKNOWN_SITE, CallSite, call_site
from pipebench.attach.export_pipeline import ExportedPipeline, export_pipeline
from pipebench.attach.first_batch import DatasetPickle, Startup, dataset_pickle
from pipebench.attach.watch_chain import Recipe, Riding, collate_step, subset_base
from pipebench.attach.watch_stages import timed_any
from pipebench.attach.watch_clock import GpuWatchClock, cuda_watch_clock, on_gpu_clock
from pipebench.attach.watch_meters import WindowMeters, worker_pids
from pipebench.base.cores import usable_cores
from pipebench.measure.steps import NS_PER_MS, NS_PER_S, PassResult, StepSample, TimingSink, cycle_steps
from pipebench.measure.summarize import TransformRow, summary_row, transform_rows
from pipebench.measure.window import Window, rate_interval, split_window
from pipebench.record.figures import Summary
from pipebench.storage.file_reads import IO_FIELDS

__all__ = ["DEFAULT_REPLAY", "DEFAULT_SECONDS", "DEFAULT_SKIP_STEPS", "DEFAULT_STEPS", "SITE_KEY", "LoaderIdentity",
           "LoaderWatch", "VIA_KEY", "WatchWindow", "batch_samples", "watching_loaders"]

# The measured window ends on its own, so a long training run goes on unmeasured (and unslowed):
# 200 steps hold 25+ worker cycles at up to 8 workers, enough blocks for the interval...
DEFAULT_STEPS = 200
# ... after 5 warm-up steps past the first batch: the prefetch queue that filled while the
# first batch was made drains in about prefetch_factor (2) steps a worker, so early steps run fast.
DEFAULT_SKIP_STEPS = 5
# ... and never longer than this, whichever comes first: a slow loop still ends its window.
DEFAULT_SECONDS = 120.0
# Replay is off unless asked for: its extra steps train the user's model on repeated batches.
DEFAULT_REPLAY = 0
# The summary figures made of a sample's rows: empty (None) where a loader has no rows, never 0.
ROW_FIGURES = ("pipeline_ms_per_sample", "cpu_ms_per_sample", "worker_capacity_samples_per_s",
               "cpu_capacity_samples_per_s")
# The key of a loader's creation site in its name (`loader=train.py:57`), the one pair every name has.
SITE_KEY = "loader"
# The key of the library's line that created the loader on the user's behalf (`via=loader.py:467`).
VIA_KEY = "via"


@dataclass(frozen=True)
class WatchWindow:
    """Which steps are measured: `skip_steps` after each run's first batch, then at most `steps`
    steps or `seconds` of them, whichever ends first."""

    steps: int = DEFAULT_STEPS
    skip_steps: int = DEFAULT_SKIP_STEPS
    seconds: float = DEFAULT_SECONDS
    # After the window: this many batches are kept as they pass and fed again to the step.
    replay: int = DEFAULT_REPLAY

    def __post_init__(self) -> None:
        if self.steps < 1 or self.skip_steps < 0 or not self.seconds > 0 or self.replay < 0:
            raise ValueError("a watch window needs steps >= 1, skip_steps >= 0, seconds > 0 and replay >= 0, "
                             f"not {self}")


def batch_samples(batch: Any, fallback: Optional[int]) -> int:
    """Samples in a batch: a tensor's dim 0; a mapping's or a sequence's first item, read the same
    way, where a list/tuple of tensors as that item (per-sample tensors, uncollated) counts its
    length; the loader's batch_size where nothing says (0 when it has none)."""
    if isinstance(batch, torch.Tensor):
        return int(batch.shape[0]) if batch.dim() else (fallback or 0)
    if isinstance(batch, Mapping) and batch:
        return batch_samples(next(iter(batch.values())), fallback)
    if isinstance(batch, (list, tuple)) and batch:
        first = batch[0]
        if isinstance(first, (list, tuple)) and first and all(isinstance(t, torch.Tensor) for t in first):
            return len(first)
        if isinstance(first, torch.Tensor) and first.dim() == 0:
            return len(batch)
        return batch_samples(first, fallback)
    return fallback or 0


@dataclass(frozen=True)
class LoaderIdentity:
    """What tells a script's loaders apart, as its job's KEY=VALUE pairs: where it was created
    (`loader`), where it was first iterated (`iterated`), its dataset's class and length
    (`dataset`), and its place among the DataLoaders the script created (`created`, from 1). A
    factory makes timm's train and eval loaders at one line; the rest tells them apart. A loader
    wrapped by `pipebench.watch` has no iteration site or order of its own (None). Sites are in the
    user's own code; a library's line that created the loader for it is `via` (`library_at`)."""

    created_at: str
    dataset: str
    iterated_at: Optional[str] = None
    order: Optional[int] = None
    library_at: Optional[str] = None

    def pairs(self) -> Dict[str, str]:
        """KEY -> VALUE in the label's order; None fields left out."""
        pairs = {SITE_KEY: self.created_at, VIA_KEY: self.library_at, "iterated": self.iterated_at,
                 "dataset": self.dataset, "created": None if self.order is None else str(self.order)}
        return {key: value for key, value in pairs.items() if value is not None}

    @property
    def label(self) -> str:
        """The job's name: `loader=train.py:57,iterated=train.py:80,dataset=ImageFolder[1000],created=1`."""
        return ",".join(f"{key}={value}" for key, value in self.pairs().items())


@dataclass
class _EpochLog:
    """One epoch's measured steps as they arrive (mutable: the user's loop is still running)."""

    number: int
    first_batch_s: float
    skipped: int = 0
    steps: List[StepSample] = field(default_factory=list)


class LoaderWatch:
    """The measurement of one loader: its epochs go through `epoch`, which times them.

    Not frozen: it collects steps as the user's loop runs; `figures` and `passes` are built from them
    when asked. While the window (and the replay) lasts, the loader's samples are timed
    (`watch_stages.timed_any`); `close` restores it, and the watch closes itself once both are over.
    `gpu_clock()` gives the clock that puts the measured steps on the GPU's own timeline where the
    loop runs on CUDA when the window opens (pipebench.attach.watch_clock; tests pass a fake)."""

    def __init__(self, loader: DataLoader, window: WatchWindow = WatchWindow(),
                 site: Union[str, CallSite, None] = None, gpu_clock: Callable[[], Optional[GpuWatchClock]] = cuda_watch_clock,
                 export: bool = False, built_with: Optional[BuiltWith] = None, iterated_at: Optional[str] = None,
                 order: Optional[int] = None) -> None:
        self.window = window
        called = CallSite(site) if isinstance(site, str) else site or call_site(sys._getframe(), DataLoader)
        self.site, self.via = called.user, called.library
        # A loader of another kind (any iterable of batches) is timed in the main loop only: named by
        # its own class, with no dataset, workers or recipe to look into.
        dataset = getattr(loader, "dataset", None) if isinstance(loader, DataLoader) else None
        self.dataset_class = type(subset_base(dataset) if dataset is not None else loader).__name__
        self.samples_per_epoch = _sized(dataset)
        length = "" if self.samples_per_epoch is None else f"[{self.samples_per_epoch}]"
        self.identity = LoaderIdentity(self.site, self.dataset_class + length, iterated_at, order, self.via)
        self.workers = int(getattr(loader, "num_workers", 0)) if dataset is not None else 0
        self.batch_size = getattr(loader, "batch_size", None)
        # Read before the recipe is replaced by its timed copy: the user's own steps (a DataLoader's).
        self.exported: Optional[ExportedPipeline] = (export_pipeline(loader, built_with)
                                                     if export and dataset is not None else None)
        self.persistent = bool(getattr(loader, "persistent_workers", False)) and self.workers > 0
        self.batches_per_epoch = _sized(loader)
        self._logs: List[_EpochLog] = []
        self.first_batch_s: List[float] = []
        self.epochs = 0
        self._skipped = 0
        self._measured = 0
        self._window_start: Optional[int] = None
        self.done = False
        # The measured batches' timings as they rode in (sample wall and CPU ns, collate wall and CPU
        # ns; never the batch, which is the user's to free); `sink` stacks them when asked, off the loop.
        self._timings: List[Tuple[np.ndarray, np.ndarray, int, int]] = []
        self.replay_ns: List[int] = []
        self._replayed = window.replay == 0
        self._restore = contextlib.ExitStack()
        timing = self._restore.enter_context(timed_any(loader)) if dataset is not None else None
        self.timing = timing if timing is not None and timing.timed else None
        self.recipe: Optional[Recipe] = None if self.timing is None else self.timing.recipe
        self.rows_note = (timing.rows_note if timing is not None else
                          f"no transform rows: a {self.dataset_class} is no torch DataLoader, so its samples "
                          "cannot be looked into; its batches are timed in the main loop")
        self.batch_steps = collate_step(loader.collate_fn) if dataset is not None else []
        # Every worker this loader started, any epoch of the window (its iterator's, and each that
        # sends a Startup): the processes its memory meter reads beside this one.
        self.worker_pids: Set[int] = set()
        self.meters = WindowMeters(self.worker_pids if dataset is not None else None)
        # The first epoch's start (perf_counter_ns) and each process's Startup as its first batch
        # brings it; the dataset's pickle, taken once while the loader is alive (`_settle`).
        self._epoch_start_ns: Optional[int] = None
        self.startups: List[Startup] = []
        self.pickle: Optional[DatasetPickle] = None
        self._loader = weakref.ref(loader) if dataset is not None else (lambda: None)
        self._new_clock: Optional[Callable[[], Optional[GpuWatchClock]]] = gpu_clock
        self.gpu_clock: Optional[GpuWatchClock] = None
        # A recorder's (pipebench.attach.recorder): every batch's timings, the window's and after it;
        # while set, the samples stay timed after the window (close() still restores the loader).
        self.tap: Optional[Callable[[Tuple[np.ndarray, np.ndarray, int, int]], None]] = None

    def close(self) -> None:
        """Put the loader's recipe and collate back, end the window's meters (idempotent)."""
        self._settle(window_over=True)
        self._restore.close()

    def _settle(self, window_over: bool) -> None:
        """At an epoch's end, the window's or close: pickle the dataset once, while the loader is
        alive and no step is measured; the meters' last reading (`watch_meters.WindowMeters`)."""
        if window_over:
            self.meters.end(fresh=self.done)
        else:
            self.meters.mark_last()
        loader = self._loader()
        if self.pickle is None and loader is not None:
            self.pickle = dataset_pickle(loader)

    def _strip(self, batch: Any, measured: bool) -> Any:
        """The user's batch out of a Riding, its timings kept when the step is measured."""
        if not isinstance(batch, Riding):
            return batch
        if batch.startup is not None:
            if self.epochs == 1:
                self.startups.append(batch.startup)
            if batch.startup.started_ns is not None and not self.meters.ended:  # a worker's, in the window
                self.worker_pids.add(batch.startup.pid)
        kept = measured and len(batch.sample_ns)
        if kept or self.tap is not None:
            timings = (batch.sample_ns, batch.sample_cpu_ns, batch.collate_ns, batch.collate_cpu_ns)
            if kept:
                self._timings.append(timings)
            if self.tap is not None:
                self.tap(timings)
        return batch.batch

    @property
    def sink(self) -> TimingSink:
        """The measured samples' timings in the harness's form (`riding_sink`)."""
        return riding_sink(self._timings)

    def _after_window(self, iterator: Iterator[Any]) -> Iterator[Any]:
        """The batches after the window: first the replay, when asked for and not yet done, then
        every batch untouched (out of its Riding)."""
        if not self._replayed:
            cached: List[Any] = []
            for batch in iterator:
                batch = self._strip(batch, False)
                cached.append(batch)
                yield batch
                if len(cached) == self.window.replay:
                    break
            if cached:  # an epoch that ended at the window's end replays in the next one
                self._replayed = True
                for batch in cached:
                    delivered = time.perf_counter_ns()
                    yield batch
                    self.replay_ns.append(time.perf_counter_ns() - delivered)
        if self._replayed and self.tap is None:
            self.close()
        if self.timing is None:  # nothing rides on the batches: the rest of the run passes untouched
            yield from iterator
            return
        for batch in iterator:
            yield self._strip(batch, False)

    @property
    def loader(self) -> Optional[DataLoader]:
        """The watched DataLoader while it lives (None for a loader of another kind, or once freed)."""
        return self._loader()

    @property
    def iterated(self) -> bool:
        """Whether any epoch delivered a batch."""
        return bool(self.first_batch_s)

    def _wanted(self, before: int) -> bool:
        """Is the step whose next() starts at `before` inside the window? Counts it when it is."""
        if self._skipped < self.window.skip_steps:
            self._skipped += 1
            return False
        if self._window_start is None:
            self._window_start = before
            self.meters.begin()
        if self._measured >= self.window.steps or before - self._window_start >= self.window.seconds * NS_PER_S:
            self.done = True
            self._settle(window_over=True)
            return False
        self._measured += 1
        return True

    def _clock_boundary(self, wanted: bool) -> None:
        """The GPU clock's mark at a call of next(); the clock is chosen at the window's first step."""
        if wanted and self._new_clock is not None:
            self.gpu_clock, self._new_clock = self._new_clock(), None
        if self.gpu_clock is not None:
            self.gpu_clock.boundary(wanted)

    def epoch(self, open_epoch: Callable[[], Iterator[Any]]) -> Iterator[Any]:
        """One epoch of the loader (`open_epoch` opens it), timed while the window lasts."""
        try:
            yield from self._epoch(open_epoch)
        finally:
            self._settle(window_over=False)

    def _epoch(self, open_epoch: Callable[[], Iterator[Any]]) -> Iterator[Any]:
        self.epochs += 1
        number = self.epochs
        start = time.perf_counter_ns()
        if self._epoch_start_ns is None:
            self._epoch_start_ns = start
        iterator = open_epoch()
        if self.gpu_clock is not None:
            self.gpu_clock.cut()  # a step the loop left unfinished in the last epoch
        if self.done:
            yield from self._after_window(iterator)
            return
        if not self.meters.ended:  # the meters read these pids over the window alone: a week's epochs add none
            self.worker_pids.update(worker_pids(iterator))
        # The batch last handed to the user, when it is measured: its wait and samples, and when
        # it was delivered; its step ends at the next call of next().
        pending: Optional[Tuple[int, int, int]] = None
        # An epoch that starts inside the window goes on the window's pass, its first batch a step,
        # so window.py finds the restart in the cycle it starts (the epoch end's measured cost).
        log = self._logs[-1] if self._logs and self._window_start is not None else None
        wanted = log is not None and self._wanted(start)
        if log is not None:
            log.skipped += not wanted and not self.done
        self._clock_boundary(wanted)
        try:
            batch = next(iterator)
        except StopIteration:
            self._measured -= wanted  # an empty epoch: the step counted never came
            return
        if wanted and self.gpu_clock is not None:
            self.gpu_clock.delivered()
        delivered = time.perf_counter_ns()
        self.first_batch_s.append((delivered - start) / NS_PER_S)
        if log is None:
            log = _EpochLog(number, self.first_batch_s[-1])
            self._logs.append(log)
            self.meters.prepare()
        batch = self._strip(batch, wanted)
        if wanted:
            pending = (delivered - start, batch_samples(batch, self.batch_size), delivered)
        yield batch
        while not self.done:
            before = time.perf_counter_ns()
            if pending is not None:
                wait_ns, samples, delivered = pending
                log.steps.append(StepSample(gap_ns=0, wait_ns=wait_ns, h2d_ns=0, compute_ns=before - delivered,
                                            samples=samples, transfer_ns=0, worker_id=-1, ready=False, epoch=number))
                pending = None
            wanted = self._wanted(before)
            log.skipped += not wanted and not self.done
            self._clock_boundary(wanted)
            try:
                batch = next(iterator)
            except StopIteration:
                self._measured -= wanted  # the epoch's end, not a step: the window keeps its length
                return
            if wanted and self.gpu_clock is not None:
                self.gpu_clock.delivered()
            batch = self._strip(batch, wanted)
            delivered = time.perf_counter_ns()
            if wanted:
                pending = (delivered - before, batch_samples(batch, self.batch_size), delivered)
            yield batch
        yield from self._after_window(iterator)

    @property
    def passes(self) -> List[PassResult]:
        """Each epoch that holds measured steps, as the harness's PassResult (its steps so far; on
        the GPU's clock too where the loop runs on CUDA: this waits for the steps in flight)."""
        logs = [log for log in self._logs if log.steps]
        epochs = [list(log.steps) for log in logs]
        if self.gpu_clock is not None:
            epochs = on_gpu_clock(epochs, self.gpu_clock.splits())
        # Per worker of the first epoch (in the order their first batches came): s from iter() to its start.
        starts = {n: (s.started_ns - self._epoch_start_ns) / NS_PER_S
                  for n, s in enumerate(u for u in self.startups if u.started_ns is not None)}
        return [PassResult(first_batch_s=log.first_batch_s, warmup_steps=log.skipped, steps=steps,
                           wall_s=sum(s.step_ns for s in steps) / NS_PER_S, epochs=len({s.epoch for s in steps}),
                           worker_startup_s=starts if log is self._logs[0] else {}, start_epoch=log.number)
                for log, steps in zip(logs, epochs)]

    def first_batch_parts(self) -> Dict[str, Any]:
        """The run's first batch taken apart: the worker that made it started (s after iter()), its
        first sample's fetch, and the dataset's pickle; empty cells where not measured."""
        first = self.startups[0] if self.startups else None
        pickle = self.pickle or DatasetPickle(None, None, None, "the loader was gone before its dataset was pickled")
        return {
            "worker_start_s": None if first is None or first.started_ns is None
            else (first.started_ns - self._epoch_start_ns) / NS_PER_S,
            "first_fetch_s": None if first is None or first.first_fetch_ns is None else first.first_fetch_ns / NS_PER_S,
            "dataset_pickle_mb": pickle.mb,
            "dataset_pickle_s": pickle.seconds,
            "start_method": pickle.start_method,
            "first_batch_note": pickle.note,
        }

    def figures(self) -> Tuple[Dict[str, Any], List[TransformRow], Optional[Window]]:
        """The harness's summary row of the measured steps (`summarize.summary_row`, plus batches/s and
        its interval, the first batch's parts and the meters' cells) and the transform rows (none where
        nothing was timed), from one stacking of the timings; the window they read, cut once. ({}, [],
        None) when no step was measured."""
        passes = self.passes
        if not passes:
            return {}, [], None
        # The meters give figures once stopped: asked before the window is over, they stop at
        # their last reading (the last epoch end inside the window), and the rest goes unmetered.
        self.meters.end(fresh=False)
        sink = self.sink
        rows = [] if self.timing is None else transform_rows(sink, list(self.timing.names), self.batch_steps)
        # A DataLoader's worker processes: the cycle a pipebench job of these workers plans.
        window = split_window(passes, cycle_steps(self.workers))
        row = summary_row(window, rows, sink, self.workers, usable_cores(), 0, persistent=self.persistent,
                          samples_per_epoch=self.samples_per_epoch, batches_per_epoch=self.batches_per_epoch,
                          target_steps=self.window.steps)
        step_ns = np.array([s.step_ns for s in window.steps], dtype=np.float64)
        batches = rate_interval(window, np.ones_like(step_ns), step_ns)
        # summary_row gives the first batch of every pass; the run's own first batch is the first
        # epoch's, measured or not.
        step_ms = Summary.from_row(row).step_ms_mean
        row.update(first_batch_s=self.first_batch_s[0], batches_per_s=1000.0 / step_ms,
                   batches_per_s_ci_low=batches.low, batches_per_s_ci_high=batches.high, transforms_note=self.rows_note,
                   **self.first_batch_parts(), **self.meters.columns(), **self.meters.loader_columns(self.worker_pids))
        if not rows:
            row.update(dict.fromkeys(ROW_FIGURES))
        if self.replay_ns:
            replay_ms = float(np.mean(self.replay_ns)) / NS_PER_MS
            row.update(replay_steps=len(self.replay_ns), replay_step_ms=replay_ms,
                       headroom_x=step_ms / replay_ms if replay_ms > 0 else float("nan"))
        return row, rows, window

    def measured_batch_size(self) -> int:
        """The largest batch measured, or the loader's batch_size where that is larger."""
        seen = max((s.samples for p in self.passes for s in p.steps), default=0)
        return max(seen, self.batch_size or 0)


def riding_sink(timings: Sequence[Tuple[np.ndarray, np.ndarray, int, int]]) -> TimingSink:
    """Batches' timings as they rode in (sample wall and CPU ns, collate wall and CPU ns) in the
    harness's form: no worker ids, no file reads (a watched loader's workers are not told apart,
    and its reads are the storage meter's)."""
    sink = TimingSink()
    for sample_ns, sample_cpu_ns, collate_ns, collate_cpu_ns in timings:
        samples = len(sample_ns)
        sink.sample_ns.append(sample_ns)
        sink.batch_ns.append(np.array([collate_ns], np.int64))
        sink.sample_cpu_ns.append(sample_cpu_ns)
        sink.batch_cpu_ns.append(collate_cpu_ns)
        sink.worker_ids.append(-1)
        sink.sample_workers.append(np.full(samples, -1, np.int64))
        sink.sample_io.append(np.zeros((samples, len(IO_FIELDS)), np.int64))
    return sink


def _sized(value: Any) -> Optional[int]:
    try:
        return len(value)
    except TypeError:
        return None


@contextlib.contextmanager
def watching_loaders(window: WatchWindow = WatchWindow(), export: bool = False) -> Iterator[List[LoaderWatch]]:
    """Within the block, every DataLoader iterated is watched; yields the list of watches, in the
    order the loaders were first iterated. With `export`, each Dataset built in the block has its
    arguments recorded and each watch its pipeline exported (`LoaderWatch.exported`). The classes
    are restored on the way out, whatever happens."""
    original_init, original_iter = DataLoader.__init__, DataLoader.__iter__
    # loader -> (its creation site, its place in the order of creation, from 1); loader -> its watch.
    sites: "weakref.WeakKeyDictionary[DataLoader, Tuple[CallSite, int]]" = weakref.WeakKeyDictionary()
    created = itertools.count(1)
    by_loader: "weakref.WeakKeyDictionary[DataLoader, LoaderWatch]" = weakref.WeakKeyDictionary()
    watches: List[LoaderWatch] = []

    def __init__(self, *args, **kwargs):
        if self not in sites:  # once a loader: a subclass's super().__init__ is the same one
            sites[self] = (call_site(sys._getframe(), DataLoader), next(created))
        original_init(self, *args, **kwargs)

    def __iter__(self):
        watch = by_loader.get(self)
        if watch is None:  # made at its first iteration, whose site is part of its name
            site, order = sites.get(self, (CallSite(UNKNOWN_SITE), None))
            watch = by_loader[self] = LoaderWatch(self, window, site, export=export, built_with=built_with,
                                                  iterated_at=call_site(sys._getframe(), DataLoader).user,
                                                  order=order)
            watches.append(watch)
        return watch.epoch(lambda: original_iter(self))

    with contextlib.ExitStack() as stack:
        built_with = stack.enter_context(recording_datasets()) if export else None
        DataLoader.__init__, DataLoader.__iter__ = __init__, __iter__
        try:
            yield watches
        finally:
            DataLoader.__init__, DataLoader.__iter__ = original_init, original_iter
            for watch in watches:
                watch.close()
