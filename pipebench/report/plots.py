"""PNG plots of a comparison table: throughput and starvation against workers, per-transform cost, and
throughput across the measured window (samples/s window by window, epoch ends marked), where a rate that
falls or swings across an epoch shows: a shard stream's tail read by one worker alone, a store that slows.

Figures are built without pyplot, so no global backend or figure state is touched and nothing needs
a display. A plot the data cannot support is skipped with a
one-line note.
"""

import io
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple, Union

import numpy as np
from matplotlib import colormaps
from matplotlib.figure import Figure

from pipebench.base.io import write_bytes_atomic
from pipebench.record.jobs import JobResult
from pipebench.report.comparison import HOST, ComparisonRow, ComparisonTable, axis_title
from pipebench.report.job_sections import sections_of

THROUGHPUT_PNG = "throughput_vs_workers.png"
TRANSFORMS_PNG = "transform_costs.png"
EPOCH_PNG = "throughput_over_epoch.png"
THROUGHPUT_TITLE = "Throughput and starvation against DataLoader workers"
TRANSFORMS_TITLE = "Per-transform time per sample, by variant"
EPOCH_TITLE = "Throughput across the measured window, window by window"
# The windows a job's pass is cut into for the epoch plot: enough to show a rate that falls or swings
# across an epoch, few enough that each holds whole worker cycles (W workers' batches come in a burst,
# then all wait: a window of part of a cycle would show that sawtooth as a swing).
EPOCH_WINDOWS = 30
WORKERS = "workers"
# Inches and dots per inch: 800x600 px reads at a PR's width and stays a small file.
FIGURE_SIZE = (8.0, 6.0)
DPI = 100
# A qualitative palette of 20 distinct colours: a chain has fewer steps than that.
PALETTE = "tab20"
# Where each stage runs in a step, so stacks read bottom-up in pipeline order (sorted() is stable:
# within a stage, steps keep the order the chains list them).
STAGE_ORDER = ("load", "decode", "per_sample", "collate", "per_batch")
# Characters a legend line holds before it wraps: a legend as wide as a job's whole label (120 characters
# and more) left the axes no width, and matplotlib's constrained layout gave up ("axes sizes collapsed").
LEGEND_LINE_CHARS = 40


def _legend(label: str) -> str:
    """`label` wrapped to lines of LEGEND_LINE_CHARS, so no legend outgrows its figure."""
    return textwrap.fill(label, LEGEND_LINE_CHARS, break_on_hyphens=False)


@dataclass(frozen=True)
class PlotOutcome:
    """One plot: its file name and title, and whether it was written or why not."""

    name: str
    title: str
    written: bool
    note: str


def write_png(figure: Figure, path: Path) -> None:
    """The figure as a PNG at DPI, written whole."""
    png = io.BytesIO()
    figure.savefig(png, format="png", dpi=DPI)
    write_bytes_atomic(path, png.getvalue())


def _workers(row: ComparisonRow) -> int:
    return int(row.names[WORKERS])


def _transform(row: ComparisonRow) -> str:
    """The job's transform: the variant its bars and lines are named by."""
    return row.results[0].key.transform


def _axes_label(row: ComparisonRow, table: ComparisonTable, axes: Sequence[str]) -> str:
    """The row's values of `axes`, as `title=value` pairs."""
    return ", ".join(f"{axis_title(a, table.axes)}={row.value(a)}" for a in axes)


def _line_label(row: ComparisonRow, table: ComparisonTable) -> str:
    """What tells this row's line apart: every axis but workers, or the variant name."""
    return _axes_label(row, table, [a for a in table.axes if a != WORKERS]) or _transform(row)


def throughput_figure(table: ComparisonTable) -> Union[Figure, str]:
    """samples/s (with its spread) and starvation % against workers, one line per variant."""
    counts = sorted({_workers(r) for r in table.rows})
    if len(counts) < 2:
        return f"skipped: needs at least two worker counts, the jobs all ran workers={counts[0]}"
    lines: Dict[str, List[ComparisonRow]] = {}
    for row in table.rows:
        lines.setdefault(_line_label(row, table), []).append(row)
    figure = Figure(figsize=FIGURE_SIZE, layout="constrained")
    rate_axes, starvation_axes = figure.subplots(2, 1, sharex=True)
    for label, rows in lines.items():
        rows = sorted(rows, key=_workers)
        x = [_workers(r) for r in rows]
        y = np.array([r.rate.value for r in rows])
        error = np.array([[max(v - r.rate.low, 0), max(r.rate.high - v, 0)] for v, r in zip(y, rows)]).T
        rate_axes.errorbar(x, y, yerr=error, marker="o", capsize=3, label=_legend(label))
        starvation_axes.plot(x, [r.starvation_pct for r in rows], marker="o", label=_legend(label))
    rate_axes.set_ylabel("throughput (samples/s)")
    rate_axes.set_ylim(bottom=0)
    rate_axes.legend(fontsize="small")
    rate_axes.grid(alpha=0.3)
    starvation_axes.set_ylabel("starvation (% of step time)")
    starvation_axes.set_ylim(0, 100)
    starvation_axes.set_xlabel("DataLoader workers (num_workers)")
    starvation_axes.set_xticks(counts)
    starvation_axes.grid(alpha=0.3)
    figure.suptitle(THROUGHPUT_TITLE)
    return figure


def _variant(row: ComparisonRow, table: ComparisonTable) -> str:
    return f"{_transform(row)} ({row.host})" if HOST in table.axes else _transform(row)


def transform_costs(table: ComparisonTable) -> Tuple[Dict[str, Dict[str, float]], Dict[str, int]]:
    """Per variant: ms per sample of each `stage/transform` step (median over the chosen jobs'
    rounds), from its lowest-worker jobs (workers=0 when there are any); and that worker count."""
    by_variant: Dict[str, List[ComparisonRow]] = {}
    for row in table.rows:
        by_variant.setdefault(_variant(row, table), []).append(row)
    costs, basis = {}, {}
    for variant, rows in by_variant.items():
        fewest = min(_workers(r) for r in rows)
        samples: Dict[str, List[float]] = {}
        for row in (r for r in rows if _workers(r) == fewest):
            for result in row.results:
                for step in result.transform_rows:
                    samples.setdefault(f"{step.stage}/{step.transform}", []).append(float(step.ms_per_sample))
        if samples:
            costs[variant] = {step: float(np.median(v)) for step, v in samples.items()}
            basis[variant] = fewest
    return costs, basis


def transforms_figure(table: ComparisonTable) -> Union[Figure, str]:
    """Stacked ms per sample of each transform step, one bar per variant."""
    costs, basis = transform_costs(table)
    if not costs:
        return "skipped: no per-transform timings in these results"
    steps = sorted(dict.fromkeys(step for per_step in costs.values() for step in per_step),
                   key=lambda step: STAGE_ORDER.index(step.split("/")[0]) if step.split("/")[0] in STAGE_ORDER
                   else len(STAGE_ORDER))
    variants = list(costs)
    figure = Figure(figsize=FIGURE_SIZE, layout="constrained")
    axes = figure.subplots()
    palette = colormaps[PALETTE]
    bottom = np.zeros(len(variants))
    for i, step in enumerate(steps):
        heights = np.array([costs[v].get(step, 0.0) for v in variants])
        axes.bar(variants, heights, bottom=bottom, label=_legend(step), color=palette(i % palette.N))
        bottom += heights
    counts = sorted(set(basis.values()))
    axes.set_title(f"from workers={','.join(map(str, counts))} jobs"
                   + ("" if counts == [0] else " (workers share cores: costs include contention)"),
                   fontsize="small")
    axes.set_ylabel("time per sample (ms)")
    axes.set_xlabel("variant (transform)")
    axes.tick_params(axis="x", labelrotation=20)
    axes.legend(fontsize="x-small", loc="upper left", bbox_to_anchor=(1.01, 1.0))
    figure.suptitle(TRANSFORMS_TITLE)
    return figure


def window_rates(samples: Sequence[float], step_ms: Sequence[float], workers: int) -> Tuple[np.ndarray, np.ndarray]:
    """(each window's end in s since the measured window began, its samples/s): the steps cut into about
    EPOCH_WINDOWS windows of whole worker cycles, the last one whatever is left, so an epoch's end stays in."""
    cycle = max(workers, 1)
    size = max(cycle, len(samples) // EPOCH_WINDOWS // cycle * cycle)
    edges = [*range(size, len(samples), size), len(samples)]
    ends_s = np.cumsum(step_ms) / 1000.0
    rates = [sum(samples[start:end]) / (sum(step_ms[start:end]) / 1000.0)
             for start, end in zip([0, *edges[:-1]], edges)]
    return ends_s[np.array(edges) - 1], np.array(rates)


def _epochs_seen(result: JobResult, samples: Sequence[float]) -> Optional[float]:
    """The window's samples over an epoch's (the exactly-once check's length); None when not recorded."""
    coverage = sections_of(result).coverage_report
    return sum(samples) / coverage.length if coverage and coverage.length else None


def epoch_figure(table: ComparisonTable) -> Union[Figure, str]:
    """samples/s window by window over each job's first measured pass (its first round), epoch ends
    dotted, so a rate that falls or fluctuates across an epoch shows."""
    figure = Figure(figsize=FIGURE_SIZE, layout="constrained")
    axes = figure.subplots()
    palette = colormaps[PALETTE]
    drawn = 0
    for row in table.rows:
        result = row.results[0]
        record = next(iter(result.pass_records), None)
        if record is None or len(record.samples) < 2 * max(_workers(row), 1):
            continue  # fewer than two windows: no line to draw
        ends, rates = window_rates(record.samples, record.step_ms, _workers(row))
        seen = _epochs_seen(result, record.samples)
        colour = palette(drawn % palette.N)
        named = _axes_label(row, table, table.axes) or row.label
        label = named + (f" ({seen:.2g} epochs)" if seen is not None else "")
        axes.plot(ends, rates, marker=".", color=colour, label=_legend(label))
        epochs = record.epoch
        times = np.cumsum(record.step_ms) / 1000.0
        for step in (i for i in range(1, len(epochs)) if epochs[i] != epochs[i - 1]):
            axes.axvline(times[step - 1], color=colour, linestyle=":", alpha=0.7)
        drawn += 1
    if not drawn:
        return "skipped: no job measured enough steps for two windows of whole worker cycles"
    axes.set_title("dotted: an epoch's end; set run.steps to an epoch's batches or more to see it whole",
                   fontsize="small")
    axes.set_xlabel("time into the measured window (s)")
    axes.set_ylabel("throughput (samples/s)")
    axes.set_ylim(bottom=0)
    axes.grid(alpha=0.3)
    axes.legend(fontsize="x-small", loc="upper left", bbox_to_anchor=(1.01, 1.0))
    figure.suptitle(EPOCH_TITLE)
    return figure


PLOTS = ((THROUGHPUT_PNG, THROUGHPUT_TITLE, throughput_figure), (TRANSFORMS_PNG, TRANSFORMS_TITLE, transforms_figure),
         (EPOCH_PNG, EPOCH_TITLE, epoch_figure))


def write_plots(table: ComparisonTable, out_dir: Path) -> Tuple[PlotOutcome, ...]:
    """Write every plot the data supports into out_dir as PNG; say why for each one skipped."""
    outcomes = []
    for name, title, build in PLOTS:
        figure = build(table)
        if isinstance(figure, str):
            outcomes.append(PlotOutcome(name, title, False, figure))
            continue
        write_png(figure, out_dir / name)
        outcomes.append(PlotOutcome(name, title, True, f"written: {out_dir / name}"))
    return tuple(outcomes)
