"""The flight recorder: a watched run measured from its first batch to its last, a row a window.

`pipebench attach --record` and `pipebench.watch(loader, record=True)` keep measuring after the
bounded window (`watch.LoaderWatch`) ends. Per loader, a `LoaderRecorder` times the wait in `next()`
and the step after it, and the per-transform timings keep riding in (the watch's `tap`). Every
`every_s` seconds (or `every_steps` steps) the window closes: one row goes to `series.csv`, appended
and fsynced (`recorder_files.AppendedCsv`), to the sinks, and to the stall rule
(`recorder_stalls.Baseline`). A stall opens a capture (`capture-N/`); its end is a row of
`events.csv`, as is every epoch start with its cost. `close()` writes each loader's partial window.

The recorder's own time in the user's loop is a column of its own (`recorder_pct`, a share of the
window's span): the bookkeeping before each `next()` (a window's close included), the tap inside it
and an epoch start's after it. It counts in the window open while it ran, so a window's close counts
in the next window. It is no data wait: a step's wait is its time in `next()` less the tap's. The
timing inside the workers is not in it: that is the benchmark's to measure
(`benchmarks/recorder_check.py`).

Memory is bounded whatever the run's length: a window is sums and a DDSketch
(`pipebench.measure.series_window`), the baseline the last 20 windows' figures, and a capture's raw
timings at most KEPT_BATCHES batches a window.
"""

import contextlib
import time
import weakref
from collections import deque
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Deque, Dict, Iterable, Iterator, List, Mapping, Optional, Protocol, Sequence, Tuple

from torch.utils.data import DataLoader

from pipebench.base.typed_json import parse
from pipebench.attach.recorder_files import DEFAULT_MAX_CAPTURES, AppendedCsv, Captures
from pipebench.attach.recorder_stalls import EPOCH_START, Baseline, StallRule, Verdict
from pipebench.attach.watch import LoaderWatch, batch_samples, riding_sink
from pipebench.measure.meter import FIRST_MEASURED, LAST_MEASURED
from pipebench.measure.series_window import (
    KEPT_BATCHES,
    SERIES_COLUMNS,
    SERIES_CSV,
    BatchTimings,
    WindowFigures,
    WindowSums,
    new_sketch,
    window_row,
)
from pipebench.measure.steps import NS_PER_S
from pipebench.measure.storage_io import StorageReadMeter
from pipebench.measure.summarize import rows_as_dicts, transform_rows
from pipebench.pipeline.timed_chain import StepName
from pipebench.record.figures import Summary

__all__ = ["DEFAULT_EVERY_S", "EVENTS_CSV", "EVENT_COLUMNS", "SERIES_COLUMNS", "SERIES_CSV", "LoaderRecorder",
           "RecordSettings", "Recorder", "recording_loaders"]

# A window every 30 s: 2,880 rows a day a loader (a few hundred KiB), fine enough to see a stall of
# a minute, long enough that a window holds many worker cycles.
DEFAULT_EVERY_S = 30.0
EVENTS_CSV = "events.csv"
EVENT_COLUMNS = ("loader", "rank", "kind", "epoch", "first_step", "last_step", "t_end_s", "lost_s",
                 "starvation_pct", "samples_per_s", "baseline_starvation_pct", "baseline_samples_per_s",
                 "capture")


@dataclass(frozen=True)
class RecordSettings:
    """How a run is recorded: a window every `every_steps` steps when set, else every `every_s`
    seconds; the stall rule; at most `max_captures` capture folders."""

    every_steps: Optional[int] = None
    every_s: float = DEFAULT_EVERY_S
    rule: StallRule = field(default_factory=StallRule)
    max_captures: int = DEFAULT_MAX_CAPTURES

    def __post_init__(self) -> None:
        if (self.every_steps is not None and self.every_steps < 1) or not self.every_s > 0 or self.max_captures < 0:
            raise ValueError(f"recording needs --every-steps >= 1, --every-s > 0 and --max-captures >= 0, not "
                             f"every_steps={self.every_steps}, every_s={self.every_s}, max_captures={self.max_captures}")

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "RecordSettings":
        """The settings from their `asdict` form, as attach hands them to each rank (RECORD_ENV)."""
        settings = parse(cls, data)
        return replace(settings, rule=parse(StallRule, settings.rule))


class Sink(Protocol):
    """Where rows go beside the files (`sinks.sink_set.SinkSet`): called with ("window" | "event", row)."""

    def __call__(self, kind: str, row: Dict[str, Any]) -> None: ...

    def close(self) -> None: ...


class Recorder:
    """One process's recording: series.csv and events.csv (appended), its captures, its sink (closed
    with it). `clock` is perf_counter_ns; tests pass a fake."""

    def __init__(self, folder: Path, settings: RecordSettings = RecordSettings(), rank: int = 0,
                 sink: Optional[Sink] = None, captures_folder: Optional[Path] = None,
                 clock: Callable[[], int] = time.perf_counter_ns) -> None:
        self.folder = Path(folder)
        self.settings = settings
        self.rank = rank
        self.sink = sink
        self.clock = clock
        self.start_ns = clock()
        self.series = AppendedCsv(self.folder / SERIES_CSV, SERIES_COLUMNS)
        self.events = AppendedCsv(self.folder / EVENTS_CSV, EVENT_COLUMNS)
        self.captures = Captures(captures_folder or self.folder, settings.max_captures)
        self.loaders: List[LoaderRecorder] = []
        self._closed = False

    def loader(self, name: str, sample_steps: Sequence[StepName] = (), batch_steps: Sequence[StepName] = (),
               context: Optional[Dict[str, Any]] = None) -> "LoaderRecorder":
        """The recorder of one loader, named `name` in every row; its timed columns' names."""
        recorder = LoaderRecorder(self, name, list(sample_steps), list(batch_steps), context or {})
        self.loaders.append(recorder)
        return recorder

    def seconds(self, now_ns: int) -> float:
        return (now_ns - self.start_ns) / NS_PER_S

    def emit(self, kind: str, row: Dict[str, Any]) -> None:
        """A row to its file, then to the sinks (which never stop the run: sinks.SinkSet)."""
        (self.series if kind == "window" else self.events).append(row)
        if self.sink is not None:
            self.sink(kind, row)

    def close(self) -> None:
        """Each loader's partial window and open stall written; the files closed (idempotent)."""
        if self._closed:
            return
        self._closed = True
        for loader in self.loaders:
            loader.finish()
        self.series.close()
        self.events.close()
        if self.sink is not None:
            self.sink.close()


@dataclass
class _Stall:
    """A stall while it lasts: its capture (None where K worse ones are kept), its windows summed
    (no list of them: a stall that never ends, a step slow for good, lasts to the run's end)."""

    verdict: Verdict
    capture: Optional[int]
    first_step: int
    epoch: int
    last: Optional[WindowFigures] = None
    windows: int = 0
    span_s: float = 0.0
    wait_s: float = 0.0
    samples: int = 0
    kept: List[BatchTimings] = field(default_factory=list)
    lost_s: float = 0.0
    # What the process tree read from storage over the stalled windows (None: no counters here).
    storage_mb: Optional[float] = 0.0

    def add(self, window: WindowFigures) -> None:
        self.last = window
        self.windows += 1
        self.span_s += window.span_s
        self.wait_s += window.wait_s
        self.samples += window.samples

    @property
    def starvation_pct(self) -> Optional[float]:
        return 100 * self.wait_s / self.span_s if self.span_s else None

    @property
    def samples_per_s(self) -> Optional[float]:
        return self.samples / self.span_s if self.span_s else None


class LoaderRecorder:
    """One loader's windows, its whole-run quantiles, its baseline and its stall in progress."""

    def __init__(self, recorder: Recorder, name: str, sample_steps: List[StepName], batch_steps: List[StepName],
                 context: Dict[str, Any]) -> None:
        self.recorder = recorder
        self.name = name
        self.sample_steps = sample_steps
        self.batch_steps = batch_steps
        self.step_names = [s.name for s in sample_steps] + [s.name for s in batch_steps]
        self.context = context
        self.baseline = Baseline(recorder.settings.rule)
        self.baseline_columns: Deque[Tuple[float, ...]] = deque(maxlen=self.baseline.windows.maxlen)
        self.run_sketch = new_sketch()
        self.epoch_number = 0
        self.step_number = 0
        self.window = WindowSums(1, recorder.clock())
        # What the process tree (the loop, every loader's workers) reads from storage from now on
        # (Linux's per-process counters: a read the page cache serves adds nothing).
        self.storage = StorageReadMeter()
        self.storage.mark(FIRST_MEASURED)
        self.stall: Optional[_Stall] = None
        # The recorder's own ns in the loop while the open window lasts, and the clock as the tap began
        # (None: no tap since the last batch came).
        self.own_ns = 0
        self._tap_ns: Optional[int] = None

    # The loop's side: epochs, steps and the timings that ride in.

    def epoch(self, batches: Iterable[Any], batch_size: Optional[int] = None) -> Iterator[Any]:
        """One epoch of the user's batches, each step timed: the wait in next(), the step after; and
        the recorder's own time in between (`own_ns`): the last step's bookkeeping before next(), the
        tap inside it, an epoch start's after it. The wait is next()'s time less the tap's; the
        step's time holds the recorder's, so a step's wait and time still add up to its span."""
        clock = self.recorder.clock
        self.epoch_number += 1
        iterator = iter(batches)
        # (wait, samples, delivered, the recorder's ns before and in next()) of the last batch
        pending: Optional[Tuple[int, int, int, int]] = None
        first = True
        self._tap_ns = None
        while True:
            ready = before = clock()
            if pending is not None:
                wait_ns, samples, delivered, own_ns = pending
                self.step(wait_ns, before - delivered + own_ns, samples, before)
                pending = None
                ready = clock()
                self.own_ns += ready - before  # a close's cost counts in the window it opened
            try:
                batch = next(iterator)
            except StopIteration:
                return
            delivered = clock()
            tap_ns = 0 if self._tap_ns is None else delivered - self._tap_ns
            self._tap_ns = None
            self.own_ns += tap_ns
            self.step_number += 1
            if first:
                first = False
                self.epoch_started(delivered - ready - tap_ns, delivered)
                self.own_ns += clock() - delivered  # no step's span holds it: it counts all the same
            else:
                pending = (delivered - ready - tap_ns, batch_samples(batch, batch_size), delivered,
                           ready - before + tap_ns)
            yield batch

    def timings(self, timings: BatchTimings) -> None:
        """A batch's per-transform timings (the watch's tap, inside next(): its time runs to the batch's
        delivery, which `epoch` reads anyway)."""
        self._tap_ns = self.recorder.clock()
        self.window.timings(timings)

    def step(self, wait_ns: int, step_ns: int, samples: int, now_ns: int) -> None:
        """One step ended at `now_ns`; the window closes when it is full."""
        window = self.window
        window.step(self.step_number, wait_ns, step_ns, samples)
        every = self.recorder.settings
        full = (window.steps >= every.every_steps if every.every_steps is not None
                else now_ns - window.start_ns >= every.every_s * NS_PER_S)
        if full:
            self.close_window(now_ns, partial=False)

    # The window's side: its row, its verdict, its capture.

    def close_window(self, now_ns: int, partial: bool) -> None:
        window, self.window = self.window, WindowSums(self.step_number + 1, now_ns)
        if window.steps == 0:
            return
        own_ns, self.own_ns = self.own_ns, 0
        self.storage.mark(LAST_MEASURED)
        storage, self.storage = Summary.from_row(self.storage.columns()), self.storage.following()
        figures = window.figures(self.epoch_number, self.recorder.seconds(now_ns))
        self.run_sketch.merge(window.sketch)
        verdict = None if partial else self.baseline.judge(figures)
        if verdict is None and not partial and figures.column_ms is not None:
            self.baseline_columns.append(figures.column_ms)
        if verdict is not None:
            self._stalled(verdict, figures, window.kept, storage.storage_read_mb)
        elif self.stall is not None:
            self._stall_ended()
        stall = self.stall if verdict is not None else None
        self.recorder.emit("window", {**self._row(figures, verdict, stall),
                                      "storage_read_mb_per_s": storage.storage_read_mb_per_s,
                                      "recorder_pct": 100.0 * own_ns / window.span_ns if window.span_ns else None})

    def _row(self, figures: WindowFigures, verdict: Optional[Verdict], stall: Optional[_Stall]) -> Dict[str, Any]:
        return {**window_row(self.name, self.recorder.rank, figures, self.step_names, self.run_sketch),
                "stall": "" if verdict is None else verdict.kind,
                "capture": "" if stall is None or stall.capture is None else stall.capture}

    def _stalled(self, verdict: Verdict, figures: WindowFigures, kept: List[BatchTimings],
                 storage_mb: Optional[float]) -> None:
        stall = self.stall
        if stall is None or stall.verdict.kind != verdict.kind:
            if stall is not None:
                self._stall_ended()
            stall = self.stall = _Stall(verdict, self.recorder.captures.open(verdict.lost_s), figures.first_step,
                                        figures.epoch)
        stall.add(figures)
        stall.lost_s += verdict.lost_s
        stall.storage_mb = None if storage_mb is None or stall.storage_mb is None else stall.storage_mb + storage_mb
        stall.kept.extend(kept[:max(KEPT_BATCHES - len(stall.kept), 0)])
        if stall.capture is not None and self.recorder.captures.held(stall.capture):
            self._write_capture(stall)

    def _stall_row(self, stall: _Stall) -> Dict[str, Any]:
        """What a stall's event and its capture both say of it."""
        verdict, last = stall.verdict, stall.last
        return {"kind": verdict.kind, "loader": self.name, "rank": self.recorder.rank, "epoch": stall.epoch,
                "first_step": stall.first_step, "last_step": last.last_step, "t_end_s": last.t_end_s,
                "lost_s": stall.lost_s, "starvation_pct": stall.starvation_pct,
                "samples_per_s": stall.samples_per_s,
                "baseline_starvation_pct": verdict.baseline_starvation_pct,
                "baseline_samples_per_s": verdict.baseline_samples_per_s}

    def _write_capture(self, stall: _Stall) -> None:
        mb = stall.storage_mb
        record = {**self._stall_row(stall), "windows": stall.windows, "storage_read_mb": mb,
                  "storage_read_mb_per_s": None if mb is None or not stall.span_s else mb / stall.span_s,
                  **self.context}
        self.recorder.captures.write(stall.capture, stall.lost_s, record, self._capture_rows(stall.kept))

    def _capture_rows(self, kept: Sequence[BatchTimings]) -> List[Dict[str, Any]]:
        """The kept batches' transform rows, as `pipebench run` writes them, with the baseline's ms a sample."""
        if not kept or not self.sample_steps:
            return []
        steps = transform_rows(riding_sink(kept), self.sample_steps, self.batch_steps)
        baseline = zip(self.sample_steps, zip(*self.baseline_columns))
        base = {step.name: sum(ms) / len(ms) for step, ms in baseline}
        return [{"job": self.name, **row, "baseline_ms_per_sample": base.get(step.transform)}
                for step, row in zip(steps, rows_as_dicts(steps))]

    def _stall_ended(self) -> None:
        stall, self.stall = self.stall, None
        held = stall.capture is not None and self.recorder.captures.held(stall.capture)
        self.recorder.emit("event", {**self._stall_row(stall), "capture": stall.capture if held else ""})

    def epoch_started(self, wait_ns: int, now_ns: int) -> None:
        """An epoch's first batch came after `wait_ns`: an event with its cost, a capture when it is a stall."""
        if self.epoch_number == 1:  # the run's first batch: start-up, kept apart as every job keeps it
            return
        wait_s = wait_ns / NS_PER_S
        cost, stalled = self.baseline.epoch_start(wait_s)
        starvation, rate, _ = self.baseline.medians()
        capture = self.recorder.captures.open(cost) if stalled else None
        row = {"kind": EPOCH_START, "loader": self.name, "rank": self.recorder.rank,
               "epoch": self.epoch_number, "first_step": self.step_number, "last_step": self.step_number,
               "t_end_s": self.recorder.seconds(now_ns), "lost_s": cost,
               "baseline_starvation_pct": starvation, "baseline_samples_per_s": rate}
        if capture is not None:
            record = {**row, "windows": 0, "wait_s": wait_s, **self.context}
            self.recorder.captures.write(capture, cost, record, self._capture_rows(self.window.kept[-1:]))
        self.recorder.emit("event", {**row, "capture": "" if capture is None else capture})

    def finish(self) -> None:
        """The run ended: the partial window's row, and the open stall's end."""
        self.close_window(self.recorder.clock(), partial=True)
        if self.stall is not None:
            self._stall_ended()


def record_watch(recorder: Recorder, watch: LoaderWatch) -> LoaderRecorder:
    """A recorder for a watched loader: named by its identity, fed every batch's timings (its tap);
    its context is what a capture's report needs of the loader."""
    context = {"workers": watch.workers, "batch_size": watch.batch_size,
               "persistent_workers": watch.persistent, "dataset_class": watch.dataset_class,
               "site": watch.site}
    timed = watch.timing is not None
    loader = recorder.loader(watch.identity.label, watch.timing.names if timed else (),
                             watch.batch_steps if timed else (), context)
    watch.tap = loader.timings
    return loader


@contextlib.contextmanager
def recording_loaders(watches: List[LoaderWatch], recorder: Recorder) -> Iterator[Recorder]:
    """Inside a `watching_loaders` block: every epoch of every watched loader is recorded too
    (DataLoader.__iter__ wrapped once more, restored on the way out); the recorder is closed at the
    end, so each loader's partial window is written whatever ended the block."""
    watched_iter = DataLoader.__iter__
    by_loader: "weakref.WeakKeyDictionary[DataLoader, LoaderRecorder]" = weakref.WeakKeyDictionary()

    def __iter__(self):
        epoch = watched_iter(self)
        loader = by_loader.get(self)
        if loader is None:
            watch = next(w for w in reversed(watches) if w.loader is self)
            loader = by_loader[self] = record_watch(recorder, watch)
        return loader.epoch(epoch, self.batch_size)

    DataLoader.__iter__ = __iter__
    try:
        yield recorder
    finally:
        DataLoader.__iter__ = watched_iter
        recorder.close()
