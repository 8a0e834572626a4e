"""The comparison table: one row a job, a column a swept axis, samples/s with its spread, speedup against
a baseline job, starvation, and the best row marked; when `loader.backend` is swept, the figures a
backend is chosen by stand beside them (BACKEND_COLUMNS).

A job's rounds (`rounds=N`) make one row: their median samples/s and its spread, by the one rule every
ranking reader uses (pipebench.model.judging). ★ marks the best row and ≈ a row that rule puts within
its noise. Figures are rounded to what that noise supports (pipebench.base.noise_figures).

Loaders watched by `pipebench attach` are one row each, never pooled (a watched run has no rounds), and
are not ranked against each other (a train and an eval loader are not competing setups) unless the
report is asked to (`compare_loaders`, `pipebench report --compare-loaders`).

Naming a job (for `--baseline`): comma-separated KEY=VALUE pairs that together match exactly one
row, e.g. `workers=0` or `transform=yuv_mask,workers=0`. Keys are the job's overrides, their short
names (`batch_size`, `start_method`), the fields every job has (IDENTITY_FIELDS), and `host` / `run`
(the results folder's name) when reports merge several folders.
"""
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from pipebench.base.csv_cells import csv_table
from pipebench.base.errors import ConfigError
from pipebench.base.noise_figures import MAX_SIGNIFICANT_FIGURES, format_column, ratio_figures, significant_figures
from pipebench.base.tables import markdown_table
from pipebench.config.specs import USER_STEP
from pipebench.model.judging import WITHIN_NOISE, Spread, judged, rate_spread
from pipebench.record.figures import nan_if_none
from pipebench.record.jobs import JobResult, canonical, canonical_text, override_pairs, varying_keys

# Columns whose override key reads better under another name (the DataLoader calls it a
# multiprocessing context; users call it the start method).
AXIS_NAMES = {"loader.multiprocessing_context": "start_method"}
# Fields every job's summary has, and the override keys that set each: a field becomes a column
# when it differs between rows and no override column already shows it (e.g. merged folders).
IDENTITY_FIELDS = {
    "dataset": ("dataset",),
    "transform": ("transform",),
    "workers": ("workers",),
    "batch_size": ("loader.batch_size", "loader"),
    "consumer": ("consumer", "consumer.kind"),
}
HOST, RUN = "host", "run"
# Starvation is a share of step time; between two runs of one job it moves by more than a tenth
# of a point on any shared machine, so one decimal is all it can carry.
STARVATION_DECIMALS = 1
BEST_MARK, NEAR_BEST_MARK = "★", "≈"
# Fingerprint fields that tell two hosts apart in a merged report.
HOST_FIELDS = ("hostname", "cpu_model", "usable_cores", "gpu")
CSV_FIXED = ("host", "run", "job", "rounds", "samples_per_s", "spread_low", "spread_high", "spread_kind",
             "significant_figures", "speedup", "starvation_pct", "best", "near_best", "baseline", "ranks",
             "straggler_ratio", "collective_wait_ms_mean")
# Multi-rank figures the table shows when any job ran several ranks (distributed.nproc > 1):
# summary key -> (column title, decimals). A straggler ratio past 1.1 is visible at 2 decimals.
RANK_COLUMNS = {"straggler_ratio": ("straggler", 2), "collective_wait_ms_mean": ("all-reduce wait ms", 1)}
# The axis whose rows get BACKEND_COLUMNS.
BACKEND_AXIS = "loader.backend"
# What tells loader backends apart beyond samples/s, shown when BACKEND_AXIS is swept (the median
# over rounds): summary key -> (column title, decimals). CPU ms a sample to hundredths (per-sample
# timings move by a few percent between runs), memory in whole MiB, the first batch in hundredths
# of a second. Always in comparison.csv.
BACKEND_COLUMNS = {
    "cpu_ms_per_sample": ("chain cpu ms/sample", 2),
    "process_cpu_ms_per_sample": ("process cpu ms/sample", 2),
    "rss_mb_peak": ("peak RSS MiB", 0),
    "pss_mb_peak": ("summed PSS MiB", 0),
    "first_batch_s": ("first batch s", 2),
}


def identity(overrides: Sequence[str], fields: Mapping[str, object]) -> Dict[str, str]:
    """Every KEY -> VALUE a user can name a job by: its overrides, then the IDENTITY_FIELDS."""
    named = override_pairs(overrides)
    for name in IDENTITY_FIELDS:
        named.setdefault(name, canonical(fields.get(name)))
    return named


def measured_rate(results: Sequence[JobResult]) -> Spread:
    """The rounds' samples/s and spread, by the one rule (pipebench.model.judging.rate_spread)."""
    summaries = [r.summary for r in results]
    return rate_spread([nan_if_none(s.samples_per_s) for s in summaries],
                       [nan_if_none(s.samples_per_s_ci_low) for s in summaries],
                       [nan_if_none(s.samples_per_s_ci_high) for s in summaries])


@dataclass(frozen=True)
class ComparisonRow:
    """One job of one results folder, its rounds together."""

    label: str
    folder: Path
    host: str
    names: Mapping[str, str]
    rate: Spread
    starvation_pct: float
    results: Tuple[JobResult, ...] = field(repr=False)

    @property
    def rounds(self) -> int:
        return len(self.results)

    def summary_median(self, key: str, default: float) -> float:
        """The median over rounds of a summary figure; `default` for results written without it
        (or with an empty cell: a meter that could not read it)."""
        values = [float(default if r.summary.row.get(key) is None else r.summary.row[key]) for r in self.results]
        return float(np.median(values))

    def value(self, key: str) -> str:
        """This job's value of an override key, read from its config when it was not overridden."""
        if key in self.names:
            return self.names[key]
        first = self.results[0]
        if key in first.choices:
            return canonical(first.choices[key])
        node: object = first.config
        for part in key.split("."):
            if not isinstance(node, Mapping) or part not in node:
                return ""
            node = node[part]
        return canonical(node)


@dataclass(frozen=True)
class ComparisonTable:
    rows: Tuple[ComparisonRow, ...]
    axes: Tuple[str, ...]
    baseline: int
    best: int
    # False: the rows are a script's loaders, each described on its own (no speedup, best or baseline).
    ranked: bool = True

    def speedup(self, i: int) -> float:
        return self.rows[i].rate.value / self.rows[self.baseline].rate.value

    def near_best(self, i: int) -> bool:
        """Not the best, but within its noise by the one rule (pipebench.model.judging.judged): a row
        whose spread stops short of the best's samples/s, or that has no spread, is never marked."""
        return i != self.best and judged(self.rows[self.best].rate, self.rows[i].rate) == WITHIN_NOISE


def _host_labels(fingerprints: Sequence[Tuple[object, ...]]) -> Dict[Tuple[object, ...], str]:
    """hostname, or hostname/cores/cpu where two different machines share a hostname."""
    distinct = list(dict.fromkeys(fingerprints))
    names = [str(f[0]) for f in distinct]
    return {f: (str(f[0]) if names.count(str(f[0])) == 1 else f"{f[0]}/{f[2]}c/{f[1]}") for f in distinct}


def watched(result: JobResult) -> bool:
    """Whether a record is a loader watched in the user's own loop (`pipebench attach`, `pipebench.watch`)."""
    return result.key.consumer == USER_STEP


def _refuse_pooling(folder: Path, results: Sequence[JobResult]) -> None:
    """A ConfigError where `results`, grouped under one name, are not the rounds of one job: records
    that differ in what identifies a job, or watched loaders (which have no rounds)."""
    if len(results) < 2 or (len({r.key for r in results}) == 1 and not any(watched(r) for r in results)):
        return
    jobs = ", ".join(f"job-{r.job_num}" for r in results)
    why = ("different loaders, not rounds of one job (written by a pipebench attach from before loaders were told "
           "apart: run it again)" if any(watched(r) for r in results) else
           "not rounds of one job: they differ in dataset, transform, workers, batch size or consumer")
    raise ConfigError(f"{folder}: {jobs} share the name {results[0].job} but are {why}")


def group_rows(runs: Sequence[Tuple[Path, Sequence[JobResult]]]) -> List[ComparisonRow]:
    """Rows from (folder, result records) pairs: rounds of one job in one folder make one row; the
    records of different loaders never do (`_refuse_pooling`)."""
    grouped: Dict[Tuple[Path, str], List[JobResult]] = {}
    for folder, results in runs:
        for result in results:
            grouped.setdefault((folder, result.key.label), []).append(result)
    fingerprint = {key: tuple(rs[0].fingerprint.get(f) for f in HOST_FIELDS) for key, rs in grouped.items()}
    hosts = _host_labels(list(fingerprint.values()))
    rows = []
    for (folder, label), results in grouped.items():
        _refuse_pooling(folder, results)
        names = identity(results[0].overrides, results[0].summary.row)
        host = hosts[fingerprint[(folder, label)]]
        names.update({HOST: host, RUN: folder.name})
        rows.append(ComparisonRow(label, folder, host, names, measured_rate(results),
                                  float(np.median([nan_if_none(r.summary.starvation_pct) for r in results])),
                                  tuple(results)))
    return rows


def swept_axes(rows: Sequence[ComparisonRow]) -> Tuple[str, ...]:
    """The override keys whose values differ between rows, in the order the overrides name them;
    then `host` / `run` where needed to keep rows apart, and identity fields no column shows yet."""
    keys = [k for row in rows for k in row.results[0].pairs]
    axes = [k for k in dict.fromkeys(keys) if len({row.value(k) for row in rows}) > 1]
    for name, setters in IDENTITY_FIELDS.items():
        if not any(s in axes for s in setters) and len({row.names[name] for row in rows}) > 1:
            axes.append(name)
    if len({row.host for row in rows}) > 1:
        axes.insert(0, HOST)
    if len({(row.host, row.label) for row in rows}) < len(rows):
        axes.insert(0, RUN)
    return tuple(axes)


def _split_pairs(selector: str) -> List[Tuple[str, str]]:
    """KEY=VALUE pairs split on the commas outside brackets (values may be lists)."""
    parts, depth, start = [], 0, 0
    for i, char in enumerate(selector):
        depth += (char in "[(") - (char in "])")
        if char == "," and depth == 0:
            parts.append(selector[start:i])
            start = i + 1
    parts.append(selector[start:])
    pairs = []
    for part in parts:
        key, sep, value = part.strip().partition("=")
        if not sep or not key:
            raise ConfigError(f"--baseline {selector!r}: name a job by KEY=VALUE pairs, e.g. workers=0")
        pairs.append((key.lstrip("+~"), canonical_text(value)))
    return pairs


def _names_match(names: Mapping[str, str], key: str, value: str) -> bool:
    return any(v == value and key in (k, k.split(".")[-1], AXIS_NAMES.get(k)) for k, v in names.items())


def select_job(selector: Optional[str], named: Sequence[Mapping[str, str]]) -> int:
    """Index of the one job the selector names (0 when there is no selector); ConfigError otherwise."""
    if selector is None:
        return 0
    pairs = _split_pairs(selector)
    hits = [i for i, names in enumerate(named) if all(_names_match(names, k, v) for k, v in pairs)]
    if len(hits) != 1:
        keys = varying_keys(named)  # each job as the KEY=VALUE pairs that tell it apart
        raise ConfigError(f"--baseline {selector!r} matches {len(hits)} jobs, not 1; jobs: "
                          + "; ".join(",".join(f"{k}={names.get(k, '')}" for k in keys) or "default"
                                      for names in named))
    return hits[0]


def row_label(row: ComparisonRow, axes: Sequence[str]) -> str:
    """The row as KEY=VALUE pairs: its axis values, or its whole job label when nothing was swept."""
    if not axes:
        return row.label
    return ",".join(f"{axis_title(a, axes)}={row.value(a)}" for a in axes)


def build_table(rows: Sequence[ComparisonRow], baseline: Optional[str] = None,
                compare_loaders: bool = False) -> ComparisonTable:
    """The table over rows, with the baseline the selector names (default: the first row); rows of
    watched loaders are ranked only with `compare_loaders`."""
    if not rows:
        raise ConfigError("no finished jobs to compare")
    ranked = compare_loaders or not any(watched(r) for row in rows for r in row.results)
    if baseline is not None and not ranked:
        raise ConfigError(f"--baseline {baseline!r} ranks the rows against one, and these are a script's loaders, "
                          "each described on its own: add --compare-loaders to compare them")
    axes = swept_axes(rows)
    base = select_job(baseline, [r.names for r in rows])
    rates = [r.rate.value if math.isfinite(r.rate.value) else -math.inf for r in rows]
    return ComparisonTable(tuple(rows), axes, base, int(np.argmax(rates)), ranked)


def axis_title(key: str, axes: Sequence[str]) -> str:
    """A column's header: AXIS_NAMES, else the key's last part unless two axes share it."""
    if key in AXIS_NAMES:
        return AXIS_NAMES[key]
    short = key.split(".")[-1]
    return short if sum(a.split(".")[-1] == short for a in axes) == 1 else key


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _relative(spread: Spread) -> float:
    return spread.half_width / spread.value if spread.value else float("nan")


def _speedup_cells(table: ComparisonTable) -> List[str]:
    base = table.rows[table.baseline].rate
    speedups = [table.speedup(i) for i in range(len(table.rows))]
    figures = [MAX_SIGNIFICANT_FIGURES if i == table.baseline else ratio_figures(s, [_relative(r.rate), _relative(base)])
               for i, (s, r) in enumerate(zip(speedups, table.rows))]
    return format_column(speedups, figures)[0]


def comparison_markdown(table: ComparisonTable) -> str:
    """The table, then a few lines that say what the spread, speedup and marks mean. With nothing swept,
    a job is named by IDENTITY_FIELDS; a single job, or a table not ranked, has no speedup or best row."""
    rates = [r.rate for r in table.rows]
    figures = [significant_figures(r.value, r.half_width) for r in rates]
    rate_cells, decimals = format_column([r.value for r in rates], figures)
    kinds = {r.kind for r in rates}
    spread_title = f"spread ({kinds.pop()})" if len(kinds) == 1 else "spread"
    titles = {key: axis_title(key, table.axes) for key in table.axes} or {name: name for name in IDENTITY_FIELDS}
    compared = table.ranked and len(table.rows) > 1
    show_rounds = any(r.rounds > 1 for r in table.rows)
    show_ranks = any(r.summary_median("ranks", 1) > 1 for r in table.rows)
    show_backend = BACKEND_AXIS in table.axes
    speedups = _speedup_cells(table)
    cells = []
    for i, row in enumerate(table.rows):
        cell = {
            **{title: row.value(key) for key, title in titles.items()},
            "samples/s": rate_cells[i],
            spread_title: _spread_cell(row.rate, decimals),
            "speedup": speedups[i],
            "starvation %": f"{row.starvation_pct:.{STARVATION_DECIMALS}f}",
            "best": BEST_MARK if i == table.best else (NEAR_BEST_MARK if table.near_best(i) else ""),
        }
        if show_rounds:
            cell["rounds"] = str(row.rounds)
        if show_ranks:
            cell.update({title: f"{row.summary_median(key, 0.0):.{decimals_}f}"
                         for key, (title, decimals_) in RANK_COLUMNS.items()})
        if show_backend:
            cell.update({title: _figure_cell(row.summary_median(key, math.nan), decimals_)
                         for key, (title, decimals_) in BACKEND_COLUMNS.items()})
        cells.append(cell)
    rank_titles = [title for title, _ in RANK_COLUMNS.values()] if show_ranks else []
    backend_titles = [title for title, _ in BACKEND_COLUMNS.values()] if show_backend else []
    numeric = ["samples/s", spread_title, "speedup", "starvation %", "rounds", *rank_titles, *backend_titles]
    numeric += [title for title in titles.values() if all(_is_number(c[title]) for c in cells)]
    figures_shown = ["samples/s", spread_title, *(["speedup"] if compared else []), "starvation %"]
    columns = [*titles.values(), *figures_shown, *backend_titles, *rank_titles, *(["rounds"] if show_rounds else []),
               *(["best"] if compared else [])]
    notes = [
        "spread: the 95% CI of batch means over a job's whole worker cycles (the noise inside one run; "
        "rounds=N adds the run-to-run part), with two or three rounds the hull of their CIs, with more the "
        "IQR across rounds (samples/s is then the median round). Figures are rounded to the digits that noise supports, as "
        "torch.utils.benchmark.Compare does.",
    ]
    if show_backend:
        notes.append("chain cpu ms/sample: the thread CPU time of the chain's steps, wherever they ran; process cpu "
                     "ms/sample: the job's whole process tree (worker processes, or the worker, collate and prefetch "
                     "threads, and the main loop) over the measured window; summed PSS: main process and workers, "
                     "shared pages split (under thread backends the one process). Medians over rounds.")
    if not all(math.isfinite(r.low) for r in rates):
        notes.append("An empty spread: no interval that says anything (too few measured steps, or one too wide; "
                     "summary.csv's ci_note says why).")
    if not table.ranked and len(table.rows) > 1:
        notes.insert(0, "Each row is one loader of the script, described on its own: loaders that feed different "
                        "steps (train, eval) are not competing setups, so none is ranked against another "
                        "(`pipebench report --compare-loaders` ranks them).")
    if compared:
        base_label = row_label(table.rows[table.baseline], table.axes)
        notes.insert(0, f"speedup: samples/s against `{base_label}`. {BEST_MARK}: highest samples/s; {NEAR_BEST_MARK}: "
                        "its spread reaches the best's samples/s, so the difference is within the noise.")
    return markdown_table(cells, columns, right=numeric) + "\n" + "\n".join(notes) + "\n"


def _spread_cell(rate: Spread, decimals: int) -> str:
    """`low–high`; empty where the row has no interval."""
    return f"{rate.low:.{decimals}f}–{rate.high:.{decimals}f}" if math.isfinite(rate.low) else ""


def _figure_cell(value: float, decimals: int) -> str:
    """A figure to `decimals`; empty where no job measured it."""
    return f"{value:.{decimals}f}" if math.isfinite(value) else ""


def comparison_csv(table: ComparisonTable) -> str:
    """Every row at full precision, axis columns under their full override keys."""
    axes = [a for a in table.axes if a not in (HOST, RUN)]
    rows = []
    for i, row in enumerate(table.rows):
        # The speedup, best, near_best and baseline cells; empty where the table is not ranked.
        speedup, best, near_best, baseline = ((table.speedup(i), i == table.best, table.near_best(i),
                                               i == table.baseline) if table.ranked else (None,) * 4)
        rows.append([row.host, row.folder.name, *(row.value(a) for a in axes), row.label, row.rounds,
                     row.rate.value, row.rate.low, row.rate.high, row.rate.kind,
                     significant_figures(row.rate.value, row.rate.half_width), speedup, row.starvation_pct,
                     best, near_best, baseline, row.summary_median("ranks", 1),
                     row.summary_median("straggler_ratio", 1.0), row.summary_median("collective_wait_ms_mean", 0.0),
                     *(row.summary_median(key, math.nan) for key in BACKEND_COLUMNS)])
    return csv_table([*CSV_FIXED[:2], *axes, *CSV_FIXED[2:], *BACKEND_COLUMNS], rows)
