"""A per-machine history of nights: one CSV row per job per session, appended, never rewritten.

Why CSV and not SQLite: a night adds a handful of rows, people read and diff the file, CI keeps it
as an artifact or commits it beside the machine's baseline, and every tool opens it. Crash safety
comes from how a row is written (`pipebench.base.io.append_lines`): a crash can leave at most a
torn last line; the loader keeps every whole row and names the rest (line number and why), it
never drops a file for one bad line.

Step detection (`find_steps`): binary segmentation on the series, the split that leaves the
least squared error of the log values, kept only where the two sides differ by the one rule of
`pipebench.base.significance` (significant and larger than the threshold), then each side
searched again. It names the first commit after each step.
"""

import csv
import io
import math
import os
from dataclasses import astuple, dataclass, fields
from datetime import datetime, timezone
from pathlib import Path
from typing import List, Sequence, Tuple

import numpy as np

from pipebench.base.csv_cells import csv_table
from pipebench.base.io import append_lines
from pipebench.base.significance import DOWN, MIN_SAMPLES, UP, measure_change
from pipebench.base.stats import distribution
from pipebench.model.judging import DEFAULT_THRESHOLD
from pipebench.regress.compare import load_run

# A step must hold for at least this many nights on each side (the rule's fewest samples): one odd
# night is not a level.
MIN_SEGMENT = MIN_SAMPLES


@dataclass(frozen=True)
class HistoryRow:
    """One job on one night: the head commit's figures (medians and quartiles over rounds) and its verdict."""

    date: str
    commit: str
    base_commit: str
    machine: str
    job: str
    rounds: int
    samples_per_s: float
    samples_per_s_p25: float
    samples_per_s_p75: float
    cpu_ms_per_sample: float
    cpu_ms_p25: float
    cpu_ms_p75: float
    verdict: str
    flagged_by: str


# history.csv's columns: a row's fields, in their order.
HISTORY_COLUMNS = tuple(f.name for f in fields(HistoryRow))


@dataclass(frozen=True)
class History:
    """The whole rows of a history file, and one line for each row that was not whole."""

    rows: Tuple[HistoryRow, ...]
    damaged: Tuple[str, ...]

    def jobs(self) -> List[str]:
        return list(dict.fromkeys(r.job for r in self.rows))


@dataclass(frozen=True)
class Step:
    """A level change of one job's series: the first commit on the new level, and the two levels."""

    job: str
    signal: str
    index: int
    commit: str
    date: str
    before: float
    after: float


def append_rows(path: Path, rows: Sequence[HistoryRow]) -> Path:
    """Append rows (and the header to a new file) in one write, then fsync (module docstring)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    table = csv_table(HISTORY_COLUMNS, (astuple(r) for r in rows))
    fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        size = os.fstat(fd).st_size
        body = table if size == 0 else table.split("\n", 1)[1]
        # A row torn by an earlier crash has no line end: end it, so this write's rows stay whole.
        if size and os.pread(fd, 1, size - 1) != b"\n":
            body = "\n" + body
        append_lines(fd, body)
    finally:
        os.close(fd)
    return path


def _quartiles(values: Sequence[float]) -> Tuple[float, float, float]:
    finite = distribution([v for v in values if math.isfinite(v)])
    return finite.median, finite.p25, finite.p75


def session_rows(session, machine: str, date: str) -> List[HistoryRow]:
    """One row a job of an A/B session (pipebench.regress.ab.Session): the head side's figures."""
    base, head = session.sides
    measured = load_run(*map(str, session.folders[head.name]))
    return [HistoryRow(date, head.commit, base.commit, machine, job.job, len(runs.rounds),
                       *_quartiles(runs.round_samples_per_s), *_quartiles(runs.cpu_ms_per_sample),
                       job.verdict, job.flagged_by)
            for job in session.comparison.jobs if (runs := measured.jobs.get(job.full_job)) is not None]


def append_session(path: Path, session, machine: str = "", date: str = "") -> Path:
    """Append an A/B session's rows; the machine defaults to the history's folder name."""
    stamp = date or datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    return append_rows(path, session_rows(session, machine or path.parent.name, stamp))


def _parse(cells: Sequence[str]) -> HistoryRow:
    """A row of whole cells, each converted by its field's type; an empty figure is NaN."""
    row = HistoryRow(*(math.nan if f.type is float and not cell else f.type(cell)
                       for f, cell in zip(fields(HistoryRow), cells)))
    if not row.commit or not row.job:
        raise ValueError("empty commit or job")
    return row


def load_history(path: Path) -> History:
    """Every whole row of a history file; each line that is not one is named in `damaged`. A last
    line without its line end is a write cut short: named, never parsed."""
    text = path.read_text(encoding="utf-8", errors="replace")
    torn = []
    if text and not text.endswith("\n"):
        kept, _, cut = text.rpartition("\n")
        torn.append(f"{path}: line {kept.count(chr(10)) + 2 if kept else 1}: torn ({len(cut)} characters "
                    "without a line end: a write cut short)")
        text = kept + "\n" if kept else ""
    reader = csv.reader(io.StringIO(text))
    header = next(reader, None)
    if header is None or tuple(header) != HISTORY_COLUMNS:
        return History((), (f"{path}: line 1: not a pipebench history header", *torn))
    rows, damaged = [], []
    for cells in filter(None, reader):
        try:
            if len(cells) != len(HISTORY_COLUMNS):
                raise ValueError(f"{len(cells)} cells, {len(HISTORY_COLUMNS)} expected")
            rows.append(_parse(cells))
        except ValueError as exc:
            damaged.append(f"{path}: line {reader.line_num}: {exc}")
    return History(tuple(rows), (*damaged, *torn))


def _best_split(values: np.ndarray) -> int:
    """The split index (first of the new level) with the least summed squared error, or -1."""
    logs = np.log(values)
    cost = {i: i * logs[:i].var() + (len(logs) - i) * logs[i:].var()
            for i in range(MIN_SEGMENT, len(values) - MIN_SEGMENT + 1)}
    return min(cost, key=cost.get, default=-1)


def _segment_steps(values: np.ndarray, offset: int, threshold: float) -> List[int]:
    split = _best_split(values)
    if split < 0:
        return []
    change = measure_change(values[:split], values[split:], threshold)
    if change.direction(change.p_value) not in (UP, DOWN):
        return []
    return [*_segment_steps(values[:split], offset, threshold), offset + split,
            *_segment_steps(values[split:], offset + split, threshold)]


def find_steps(history: History, signal: str = "cpu_ms_per_sample",
               threshold: float = DEFAULT_THRESHOLD) -> List[Step]:
    """Per job, each level change of `signal` (a HistoryRow figure) of at least `threshold` (relative),
    and the first commit after it."""
    steps = []
    for job in history.jobs():
        series = [r for r in history.rows if r.job == job and math.isfinite(getattr(r, signal))]
        values = np.array([getattr(r, signal) for r in series])
        for i in _segment_steps(values, 0, threshold):
            steps.append(Step(job, signal, i, series[i].commit, series[i].date, float(np.median(values[:i])),
                              float(np.median(values[i:]))))
    return steps
