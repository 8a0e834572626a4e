"""One window of series.csv: its steps' sums, its waits' streaming quantiles, its steps' time a sample; its row.

series.csv has two writers, the flight recorder (`pipebench attach --record`) and every `pipebench
run` job (`pipebench.measure.job_series`): both fill a `WindowSums` and write its `window_row`, so
`pipebench report` draws either with one function. A window keeps sums, a DDSketch of its waits and
at most KEPT_BATCHES batches' raw timings (for a stall's capture), so it costs the same memory at
10 steps or a million.

Why DDSketch: its quantiles carry a *relative*-error guarantee (1% here), which holds in the sparse
tail a stall lives in (a wait that jumps from 2 ms to 5 s), where a rank-error sketch (KLL,
t-digest) can be far off; its collapsing store caps its bins (SKETCH_BIN_LIMIT).
"""

from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np
from ddsketch import LogCollapsingLowestDenseDDSketch

from pipebench.measure.steps import NS_PER_MS, NS_PER_S

__all__ = ["KEPT_BATCHES", "SERIES_COLUMNS", "SERIES_CSV", "SKETCH_BIN_LIMIT", "SKETCH_RELATIVE_ACCURACY", "TOP_STEPS",
           "WindowFigures", "WindowSums", "new_sketch", "quantiles_ms", "series_cell", "top_steps", "window_row"]

# A quantile is within 1% of the true value: finer than the run-to-run noise of a data wait.
SKETCH_RELATIVE_ACCURACY = 0.01
# At 1% accuracy, 2048 bins span a factor of e^(2048 * 0.02) ~ 10^17 between the smallest and the
# largest wait kept apart: 1 ns to years. Beyond it the lowest bins collapse (the fastest waits, which
# no one reads a quantile of). A dense store of 2048 counts is ~16 KiB.
SKETCH_BIN_LIMIT = 2048
# The quantiles series.csv writes, a window's and the whole run's.
QUANTILES = (0.50, 0.95, 0.99)
# The chain's costliest steps named in each row of series.csv, with their ms a sample.
TOP_STEPS = 3
SERIES_CSV = "series.csv"
# A row a window of one loader (or job) on one rank. The recorder alone fills the last four: what the
# process tree read from storage, the recorder's own share of the loop's time, and the stall the
# window was part of with its capture.
SERIES_COLUMNS = (
    "loader", "rank", "first_step", "last_step", "epoch", "t_end_s", "steps", "samples", "samples_per_s",
    "starvation_pct", "wait_p50_ms", "wait_p95_ms", "wait_p99_ms", "run_wait_p50_ms", "run_wait_p95_ms",
    "run_wait_p99_ms", *(f"top_step_{n}{unit}" for n in range(1, TOP_STEPS + 1) for unit in ("", "_ms")),
    "storage_read_mb_per_s", "recorder_pct", "stall", "capture",
)
# Raw timings kept a window for a capture's transform rows: 256 batches of a chain's ~6 columns at
# batch 256 is ~3 MiB at most, and enough samples for a step's median.
KEPT_BATCHES = 256


def new_sketch() -> LogCollapsingLowestDenseDDSketch:
    """An empty sketch of waits in ms, bounded (SKETCH_BIN_LIMIT)."""
    return LogCollapsingLowestDenseDDSketch(SKETCH_RELATIVE_ACCURACY, bin_limit=SKETCH_BIN_LIMIT)


def quantiles_ms(sketch: LogCollapsingLowestDenseDDSketch) -> Tuple[float, ...]:
    """p50, p95, p99 of the sketch; NaN where it is empty."""
    if sketch.count == 0:
        return tuple(float("nan") for _ in QUANTILES)
    return tuple(float(sketch.get_quantile_value(q)) for q in QUANTILES)


# The raw timings of one batch as they ride back: sample wall ns [samples, columns], sample CPU
# ns [samples], collate wall and CPU ns.
BatchTimings = Tuple[np.ndarray, np.ndarray, int, int]


@dataclass(frozen=True)
class WindowFigures:
    """What a closed window says: its steps, its rate and starvation, its waits' quantiles, and
    each timed column's ms a sample (None where nothing was timed)."""

    first_step: int
    last_step: int
    epoch: int
    t_end_s: float
    steps: int
    samples: int
    span_s: float
    wait_s: float
    wait_ms: Tuple[float, ...]
    column_ms: Optional[Tuple[float, ...]]
    collate_ms: Optional[float]

    @property
    def samples_per_s(self) -> float:
        return self.samples / self.span_s if self.span_s > 0 else float("nan")

    @property
    def starvation_pct(self) -> float:
        return 100.0 * self.wait_s / self.span_s if self.span_s > 0 else float("nan")


class WindowSums:
    """A window as it fills (mutable: the user's loop is still running)."""

    def __init__(self, first_step: int, start_ns: int) -> None:
        self.first_step = first_step
        self.start_ns = start_ns
        self.last_step = first_step - 1
        self.steps = 0
        self.samples = 0
        self.wait_ns = 0
        self.span_ns = 0
        self.sketch = new_sketch()
        self.column_ns: Optional[np.ndarray] = None
        self.timed_samples = 0
        self.collate_ns = 0
        self.kept: List[BatchTimings] = []

    def step(self, step_number: int, wait_ns: int, step_ns: int, samples: int) -> None:
        """One measured step: its wait in next(), the user's step after it, its samples."""
        if not self.steps:  # an epoch's first batch, kept apart, may have come first
            self.first_step = step_number
        self.last_step = step_number
        self.steps += 1
        self.samples += samples
        self.wait_ns += wait_ns
        self.span_ns += wait_ns + step_ns
        self.sketch.add(wait_ns / NS_PER_MS)

    def timings(self, timings: BatchTimings) -> None:
        """One batch's per-transform timings, summed by column; the first KEPT_BATCHES kept whole."""
        sample_ns, _, collate_ns, _ = timings
        if len(sample_ns) == 0:
            return
        sums = sample_ns.sum(axis=0)
        self.column_ns = sums if self.column_ns is None else self.column_ns + sums
        self.timed_samples += len(sample_ns)
        self.collate_ns += collate_ns
        if len(self.kept) < KEPT_BATCHES:
            self.kept.append(timings)

    def figures(self, epoch: int, t_end_s: float) -> WindowFigures:
        column_ms = collate_ms = None
        if self.column_ns is not None and self.timed_samples:
            column_ms = tuple(float(v) / self.timed_samples / NS_PER_MS for v in self.column_ns)
            collate_ms = self.collate_ns / self.timed_samples / NS_PER_MS
        return WindowFigures(self.first_step, self.last_step, epoch, t_end_s, self.steps, self.samples,
                             self.span_ns / NS_PER_S, self.wait_ns / NS_PER_S, quantiles_ms(self.sketch),
                             column_ms, collate_ms)


def top_steps(names: Sequence[str], figures: WindowFigures) -> List[Tuple[str, float]]:
    """The window's costliest steps a sample (the collate's share included), costliest first."""
    if figures.column_ms is None:
        return []
    costs = [(name, ms) for name, ms in zip(names, figures.column_ms) if ms > 0]
    if figures.collate_ms:
        costs.append((names[-1] if len(names) > len(figures.column_ms) else "collate", figures.collate_ms))
    return sorted(costs, key=lambda item: -item[1])[:TOP_STEPS]


def window_row(loader: str, rank: int, figures: WindowFigures, step_names: Sequence[str],
               run_sketch: LogCollapsingLowestDenseDDSketch) -> Dict[str, Any]:
    """A closed window's cells of series.csv, but for what the recorder alone writes (storage, its own
    share, stall, capture): `run_sketch` holds every wait up to this window's end, whence the run_wait_* quantiles."""
    run = quantiles_ms(run_sketch)
    row = {"loader": loader, "rank": rank, "first_step": figures.first_step, "last_step": figures.last_step,
           "epoch": figures.epoch, "t_end_s": figures.t_end_s, "steps": figures.steps, "samples": figures.samples,
           "samples_per_s": figures.samples_per_s, "starvation_pct": figures.starvation_pct,
           "wait_p50_ms": figures.wait_ms[0], "wait_p95_ms": figures.wait_ms[1], "wait_p99_ms": figures.wait_ms[2],
           "run_wait_p50_ms": run[0], "run_wait_p95_ms": run[1], "run_wait_p99_ms": run[2]}
    for n, (name, ms) in enumerate(top_steps(step_names, figures), start=1):
        row[f"top_step_{n}"], row[f"top_step_{n}_ms"] = name, ms
    return row


def series_cell(value: Any) -> Any:
    """A series.csv cell: empty for None or NaN (a window with nothing to say), a float to 4 decimals."""
    if value is None:
        return ""
    if isinstance(value, float):
        return "" if value != value else round(value, 4)
    return value
