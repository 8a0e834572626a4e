"""A job's summary row: its one column table, and the typed `Summary` built from it.

`SUMMARY_TABLE` holds every summary column once: its name, the type of its cell, its unit and the
section of docs/results-schema.md that says what it means. summary.csv's column order
(`SUMMARY_COLUMNS`), the stored check's text columns, the fields of `Summary` and the docs check
(tests/test_docs.py) are all read from it. `Summary.from_row` reads a stored row tolerantly: a column an
older pipebench did not write reads as None, so old result folders still load. Cells no column names
(a watched loader's `batches_per_s`, a merge's `starvation_pct_max`) stay readable in `extra`.
"""

import math
import statistics
from dataclasses import dataclass, make_dataclass
from typing import Any, Callable, Dict, Mapping, NamedTuple, Optional, Sequence, Tuple


__all__ = ["SUMMARY_COLUMNS", "SUMMARY_TABLE", "TEXT_SUMMARY_COLUMNS", "Column", "Summary", "nan_if_none"]


class Column(NamedTuple):
    """One summary column: its name, what its cell holds, its unit and its section in the docs."""

    name: str
    kind: type
    unit: str
    section: str


T, B, I, F = str, bool, int, float
# summary.csv's order: identity first, then the figures a reader compares, then the detail.
_SECTIONS: Dict[str, Tuple[Tuple[str, type, str], ...]] = {
    "Identity": (
        ("job", T, "text"), ("dataset", T, "text"), ("transform", T, "text"), ("workers", I, "count"),
        ("batch_size", I, "samples"), ("consumer", T, "text"),
    ),
    "Throughput": (
        ("samples_per_s", F, "samples/s"), ("samples_per_s_ci_low", F, "samples/s"),
        ("samples_per_s_ci_high", F, "samples/s"), ("speedup", F, "ratio"), ("ci_blocks", I, "count"),
        ("ci_note", T, "text"), ("samples_per_s_epoch", F, "samples/s"), ("epoch_restart_s", F, "s"),
        ("epoch_restart_source", T, "text"), ("epoch_boundaries_in_window", I, "count"),
    ),
    "Step time and wait": (
        ("step_ms_mean", F, "ms"), ("step_ms_var", F, "ms²"), ("step_ms_median", F, "ms"), ("step_ms_iqr", F, "ms"),
        ("step_ms_p99", F, "ms"), ("wait_ms_mean", F, "ms"), ("wait_ms_median", F, "ms"), ("wait_ms_p99", F, "ms"),
        ("starvation_pct", F, "%"), ("accel_util_pct", F, "%"), ("au_pct", F, "%"), ("step_sync", T, "text"),
        ("starvation_other_pct", F, "%"),
    ),
    "Delivery": (
        ("h2d_ms_median", F, "ms"), ("transfer_ms_median", F, "ms"), ("ready_next_ms_median", F, "ms"),
        ("batch_mb_median", F, "MB"), ("on_device_ms_median", F, "ms"), ("ready_steps_pct", F, "%"),
    ),
    "Pipeline cost and capacity": (
        ("pipeline_ms_per_sample", F, "ms/sample"), ("cpu_ms_per_sample", F, "ms/sample"),
        ("process_cpu_ms_per_sample", F, "ms/sample"), ("reference_cpu_ms", F, "ms"),
        ("reference_version", I, "version"), ("worker_capacity_samples_per_s", F, "samples/s"),
        ("cpu_capacity_samples_per_s", F, "samples/s"),
    ),
    "Start-up and memory": (
        ("first_batch_s", F, "s"), ("worker_startup_s_max", F, "s"), ("rss_mb_peak", F, "MiB"),
        ("pss_mb_peak", F, "MiB"), ("worker_pss_growth_mb", F, "MiB"), ("shm_mb_peak", F, "MiB"),
        ("loader_workers_pss_mb", F, "MiB"), ("loader_worker_pss_growth_mb", F, "MiB"), ("worker_start_s", F, "s"),
        ("first_fetch_s", F, "s"), ("dataset_pickle_mb", F, "MiB"), ("dataset_pickle_s", F, "s"),
        ("start_method", T, "text"), ("first_batch_note", T, "text"), ("first_batch_open_s", F, "s"),
        ("first_batch_fill_s", F, "s"), ("first_batch_decode_s", F, "s"), ("storage_read_mb", F, "MiB"),
        ("storage_read_mb_per_s", F, "MiB/s"), ("host_other_cpu_cores", F, "cores"), ("host_steal_pct", F, "%"),
    ),
    "Storage I/O": (
        ("cache_mode", T, "text"), ("read_bytes_per_sample", F, "bytes/sample"),
        ("read_files_per_sample", F, "files/sample"), ("read_requests_per_sample", F, "requests/sample"),
        ("read_ms_per_sample", F, "ms/sample"), ("read_mb_per_s", F, "MiB/s"), ("read_speed_mb_per_s", F, "MiB/s"),
        ("io_share_of_load_pct", F, "%"), ("storage_latency_ms", F, "ms"), ("storage_mb_per_s", F, "MiB/s"),
        ("storage_note", T, "text"),
    ),
    "Counts": (
        ("steps", I, "count"), ("repeats", I, "count"), ("skipped_samples", I, "count"), ("epochs", I, "count"),
    ),
    "GPU-side truth": (
        ("pin_memory", B, "bool"), ("consumer_ms_median", F, "ms"), ("h2d_gpu_ms_median", F, "ms"),
        ("gpu_util_pct", F, "%"), ("syncs_per_step", F, "syncs/step"), ("sync_ops", T, "text"),
        ("sync_wait_ms_per_step", F, "ms/step"), ("gpu_busy_pct", F, "%"), ("trace_accel_util_pct", F, "%"),
        ("idle_host_wait_pct", F, "% of idle"), ("idle_kernel_wait_pct", F, "% of idle"),
        ("idle_other_pct", F, "% of idle"), ("reserved_mb_peak", F, "MiB"), ("alloc_retries", I, "count"),
        ("device_frees", I, "count"), ("reserved_oscillating", B, "bool"), ("gpu_notes", T, "text"),
    ),
    "Multi-rank and coverage": (
        ("ranks", I, "count"), ("straggler_ratio", F, "ratio"), ("collective_wait_ms_mean", F, "ms/step"),
        ("duplicate_samples", I, "count"), ("missed_samples", I, "count"), ("dropped_last_samples", I, "count"),
        ("window_note", T, "text"), ("transforms_note", T, "text"),
    ),
}
SUMMARY_TABLE: Tuple[Column, ...] = tuple(Column(name, kind, unit, section) for section, rows in _SECTIONS.items()
                                          for name, kind, unit in rows)
SUMMARY_COLUMNS = [column.name for column in SUMMARY_TABLE]
# Summary cells that are not figures; every other summary column holds a number or null.
TEXT_SUMMARY_COLUMNS = tuple(column.name for column in SUMMARY_TABLE if column.kind in (str, bool))


def nan_if_none(value: Optional[float]) -> float:
    """A figure as a float; an empty cell (None) is nan."""
    return math.nan if value is None else float(value)


def _whole(value: Any) -> Optional[int]:
    # A count not measured may be stored as NaN: it reads as None, as a missing one does.
    return None if isinstance(value, float) and not math.isfinite(value) else int(value)


# How a stored cell becomes its field's type; None stays None.
_READ: Dict[type, Callable[[Any], Any]] = {str: str, bool: bool, int: _whole, float: float}


@dataclass(frozen=True, eq=False)
class _Row:
    """What every `Summary` has beside its columns' fields: the stored row, in its stored order."""

    row: Mapping[str, Any]

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> "Summary":
        """The typed view of a stored row; a missing column (an older file) reads as None."""
        return cls(row, **{c.name: None if row.get(c.name) is None else _READ[c.kind](row[c.name])
                           for c in SUMMARY_TABLE})

    @staticmethod
    def median(rounds: Sequence["Summary"], *columns: str) -> float:
        """The median over one job's rounds of the first of `columns` each round has a cell for, its
        non-finite figures left out: rounds merged into one figure, as torch.utils.benchmark's
        `Measurement.merge` merges repeats; nan when no round has one."""
        values = [next((float(getattr(r, c)) for c in columns if getattr(r, c) is not None), math.nan) for r in rounds]
        finite = [value for value in values if math.isfinite(value)]
        return statistics.median(finite) if finite else math.nan

    @property
    def extra(self) -> Dict[str, Any]:
        """The row's cells no column names, by name."""
        return {key: value for key, value in self.row.items() if key not in _FIELDS}


_FIELDS = frozenset(SUMMARY_COLUMNS)
# One summary row (result.json's `summary`, a summary.csv row): a field a column, None where the row has
# none, typed by the table; every cell still readable by its column name.
Summary = make_dataclass("Summary", [(c.name, Optional[c.kind]) for c in SUMMARY_TABLE], bases=(_Row,),
                         frozen=True, eq=False, namespace={"__module__": __name__})
