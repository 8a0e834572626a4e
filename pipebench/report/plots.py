"""PNG plots of a comparison table: throughput and starvation against workers, per-transform cost.

Figures are built on matplotlib's Agg canvas directly (no pyplot), so no global backend or figure
state is touched and nothing needs a display. A plot the data cannot support is skipped with a
one-line note.
"""

import io
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Tuple, Union

import numpy as np
from matplotlib import colormaps
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from pipebench.base.io import write_bytes_atomic
from pipebench.report.comparison import HOST, ComparisonRow, ComparisonTable, axis_title

THROUGHPUT_PNG = "throughput_vs_workers.png"
TRANSFORMS_PNG = "transform_costs.png"
THROUGHPUT_TITLE = "Throughput and starvation against DataLoader workers"
TRANSFORMS_TITLE = "Per-transform time per sample, by variant"
WORKERS = "workers"
# Inches and dots per inch: 800x600 px reads at a PR's width and stays a small file.
FIGURE_SIZE = (8.0, 6.0)
DPI = 100
# A qualitative palette of 20 distinct colours: a chain has fewer steps than that.
PALETTE = "tab20"
# Where each stage runs in a step, so stacks read bottom-up in pipeline order (sorted() is stable:
# within a stage, steps keep the order the chains list them).
STAGE_ORDER = ("load", "decode", "per_sample", "collate", "per_batch")


@dataclass(frozen=True)
class PlotOutcome:
    """One plot: its file name and title, and whether it was written or why not."""

    name: str
    title: str
    written: bool
    note: str


def _workers(row: ComparisonRow) -> int:
    return int(row.names[WORKERS])


def _line_label(row: ComparisonRow, table: ComparisonTable) -> str:
    """What tells this row's line apart: every axis but workers, or the variant name."""
    others = [a for a in table.axes if a != WORKERS]
    if not others:
        return row.names["transform"]
    return ", ".join(f"{axis_title(a, table.axes)}={row.value(a)}" for a in others)


def throughput_figure(table: ComparisonTable) -> Union[Figure, str]:
    """samples/s (with its spread) and starvation % against workers, one line per variant."""
    counts = sorted({_workers(r) for r in table.rows})
    if len(counts) < 2:
        return f"skipped: needs at least two worker counts, the jobs all ran workers={counts[0]}"
    lines: Dict[str, List[ComparisonRow]] = {}
    for row in table.rows:
        lines.setdefault(_line_label(row, table), []).append(row)
    figure = Figure(figsize=FIGURE_SIZE, layout="constrained")
    FigureCanvasAgg(figure)
    rate_axes, starvation_axes = figure.subplots(2, 1, sharex=True)
    for label, rows in lines.items():
        rows = sorted(rows, key=_workers)
        x = [_workers(r) for r in rows]
        y = np.array([r.rate.value for r in rows])
        error = np.array([[max(v - r.rate.low, 0), max(r.rate.high - v, 0)] for v, r in zip(y, rows)]).T
        rate_axes.errorbar(x, y, yerr=error, marker="o", capsize=3, label=label)
        starvation_axes.plot(x, [r.starvation_pct for r in rows], marker="o", label=label)
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
    return f"{row.names['transform']} ({row.host})" if HOST in table.axes else row.names["transform"]


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
                for step in result.get("transforms") or ():
                    samples.setdefault(f"{step['stage']}/{step['transform']}", []).append(float(step["ms_per_sample"]))
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
    FigureCanvasAgg(figure)
    axes = figure.subplots()
    palette = colormaps[PALETTE]
    bottom = np.zeros(len(variants))
    for i, step in enumerate(steps):
        heights = np.array([costs[v].get(step, 0.0) for v in variants])
        axes.bar(variants, heights, bottom=bottom, label=step, color=palette(i % palette.N))
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


PLOTS = ((THROUGHPUT_PNG, THROUGHPUT_TITLE, throughput_figure), (TRANSFORMS_PNG, TRANSFORMS_TITLE, transforms_figure))


def write_plots(table: ComparisonTable, out_dir: Path) -> Tuple[PlotOutcome, ...]:
    """Write every plot the data supports into out_dir as PNG; say why for each one skipped."""
    outcomes = []
    for name, title, build in PLOTS:
        figure = build(table)
        if isinstance(figure, str):
            outcomes.append(PlotOutcome(name, title, False, figure))
            continue
        png = io.BytesIO()
        figure.savefig(png, format="png", dpi=DPI)
        write_bytes_atomic(out_dir / name, png.getvalue())
        outcomes.append(PlotOutcome(name, title, True, f"written: {out_dir / name}"))
    return tuple(outcomes)
