"""A `pipebench run` job's series.csv: its measured steps cut into windows, a row a window, as attach's recorder writes.

Read from the steps and timings a job keeps anyway, once its repeats are over, so the measured loop
does no more work. Steps are numbered from 1 over the repeats, a window never spans an epoch's end (a
repeat's first step starts one too), `epoch` counts the job's epochs from 1, and `t_end_s` is the
measured steps' own seconds up to the window's end (no warm-up, no time between repeats).
"""

from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence

import numpy as np

from pipebench.base.csv_cells import csv_text
from pipebench.base.errors import error_line, warn
from pipebench.base.io import write_text_atomic
from pipebench.base.typed_json import parse_all
from pipebench.measure.series_window import SERIES_COLUMNS, SERIES_CSV, WindowSums, new_sketch, series_cell, window_row
from pipebench.measure.steps import NS_PER_MS, TimingSink
from pipebench.record.sections import PassRecord

__all__ = ["SERIES_WINDOWS_A_PASS", "job_series", "series_window_steps", "sink_timings", "write_job_series"]

# A pass cut into about 20 windows: points enough to see a rate fall, each still several steps of a
# default job. Whole worker cycles a window, so a starved loop's windows hold the same phases.
SERIES_WINDOWS_A_PASS = 20


def series_window_steps(pass_steps: int, cycle: int) -> int:
    """Steps a window of a pass of `pass_steps` steps: whole cycles of `cycle` steps, about
    SERIES_WINDOWS_A_PASS windows a pass, at least one cycle."""
    cycle = max(cycle, 1)
    cycles = -(-pass_steps // (SERIES_WINDOWS_A_PASS * cycle))
    return max(cycles, 1) * cycle


def sink_timings(sink: TimingSink) -> List[np.ndarray]:
    """Each measured step's per-transform ns as [samples, sample steps + batch steps]: a batch step's
    time shared among the batch's samples, so a column's sum over a window is its time there."""
    timings = []
    for sample_ns, batch_ns in zip(sink.sample_ns, sink.batch_ns):
        samples = len(sample_ns)
        shares = np.broadcast_to(np.asarray(batch_ns, dtype=float) / max(samples, 1), (samples, len(batch_ns)))
        timings.append(np.hstack([np.asarray(sample_ns, dtype=float).reshape(samples, -1), shares]))
    return timings


def job_series(loader: str, rank: int, passes: Sequence[Mapping[str, Any]], cycle: int,
               step_names: Sequence[str] = (), timings: Optional[Sequence[np.ndarray]] = None) -> List[Dict[str, Any]]:
    """series.csv's rows of one job (or rank) named `loader`: its passes' per-step lists (result.json's
    `passes`) in windows of `series_window_steps`, cut at each epoch's end. `timings` (`sink_timings`,
    a step each over the passes in order, columns `step_names`) give each row its top steps; without
    them, or where their count is not the steps', the top-step cells stay empty."""
    records = parse_all(PassRecord, passes)
    total = sum(len(one.step_ms) for one in records)
    timed = timings is not None and len(timings) == total
    rows: List[Dict[str, Any]] = []
    run_sketch = new_sketch()
    step_number, epoch, t_ms = 0, 0, 0.0

    def close(window: WindowSums) -> None:
        if window.steps:
            run_sketch.merge(window.sketch)
            rows.append(window_row(loader, rank, window.figures(epoch, t_ms / 1000.0), step_names, run_sketch))

    for one in records:
        size = series_window_steps(len(one.step_ms), cycle)
        # The GPU's own idle time waiting for data, where the job ran on the GPU's clock (run.sync=async).
        waits = one.gpu_idle_data_ms or one.wait_ms
        window, last_epoch = WindowSums(step_number + 1, 0), None
        for samples, wait_ms, step_ms, loader_epoch in zip(one.samples, waits, one.step_ms, one.epoch):
            if loader_epoch != last_epoch or window.steps >= size:
                close(window)
                window = WindowSums(step_number + 1, 0)
                if loader_epoch != last_epoch:
                    epoch, last_epoch = epoch + 1, loader_epoch
            step_number += 1
            t_ms += step_ms
            window.step(step_number, round(wait_ms * NS_PER_MS), round((step_ms - wait_ms) * NS_PER_MS), samples)
            if timed:
                window.timings((timings[step_number - 1], None, 0, 0))
        close(window)
    return rows


def write_job_series(job_dir: Path, rows: Sequence[Mapping[str, Any]]) -> None:
    """series.csv in the job's folder, written whole (the job is over: nothing is appended after). A
    file it cannot write is one warning line, never the job's end: result.json, written next, holds
    every figure the series shows."""
    cells = [{column: series_cell(row.get(column)) for column in SERIES_COLUMNS} for row in rows]
    try:
        write_text_atomic(job_dir / SERIES_CSV, csv_text(cells, SERIES_COLUMNS))
    except OSError as exc:
        warn(f"series.csv not written: {error_line(exc)}")
