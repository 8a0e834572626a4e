"""A recorded run read back (`attach --record`, or a `pipebench run` folder's jobs): the timeline, the
captures' table, each capture's report.md.

The recorder (pipebench.attach.recorder) writes data only (series.csv, events.csv, capture-N/); this
stage above it renders them for `pipebench report` and attach's own report: `timeline.png`, a line a
loader and rank, epochs and captures marked; the captures with their cause (the step that grew most
against the baseline); and `capture-N/report.md`. Files are read as CSV text, so a run killed mid-write
reads up to its last whole row. A run folder's jobs' series.csv (pipebench.measure.job_series) are drawn
by the same timeline, `job_series.png`, with each job's rate over the first and second half of its windows.
"""
import csv
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

from matplotlib.figure import Figure

from pipebench.base.io import write_text_atomic
from pipebench.base.tables import markdown_table
from pipebench.base.typed_json import parse, parse_all
from pipebench.report.plots import write_png

__all__ = ["JOB_SERIES_PNG", "TIMELINE_PNG", "RecordedRow", "RecorderShare", "capture_cause", "job_series_section",
           "recorder_share", "recording_markdown", "write_recording"]

# The recorder's and each job's file (pipebench.measure.series_window, which imports torch: this module, read by
# `pipebench report`, does not), and the recorder's events.
SERIES_CSV, EVENTS_CSV = "series.csv", "events.csv"
TIMELINE_PNG = "timeline.png"
# A run folder's jobs' timeline; `job_series-2.png` and on for the second folder of a report and on.
JOB_SERIES_PNG = "job_series{suffix}.png"
JOB_SERIES_GLOB = f"job-*/{SERIES_CSV}"
JOB_SERIES_COLUMNS = ("job", "rank", "windows", "first_half_samples_per_s", "second_half_samples_per_s", "change_pct")
RECORDED_TITLE = "The recorded run, window by window"
RECORDED_XLABEL = "step (dotted: an epoch starts; shaded: a captured stall)"
JOBS_TITLE = "Each job's measured steps, window by window"
JOBS_XLABEL = "measured step, over the job's repeats (dotted: an epoch, or a repeat, starts)"
CAPTURE_GLOB = "capture-*"
CAPTURE_TABLE_COLUMNS = ("capture", "kind", "loader", "rank", "steps", "lost_s", "starvation_pct",
                         "baseline_starvation_pct", "cause")


@dataclass(frozen=True)
class RecordedRow:
    """A row of series.csv (a window) or events.csv (a stall's end, an epoch start): the text cells the
    report reads, empty where the file has no such column, None where a row cut short has no cell."""

    loader: Optional[str] = ""
    rank: Optional[str] = ""
    kind: Optional[str] = ""
    epoch: Optional[str] = ""
    first_step: Optional[str] = ""
    last_step: Optional[str] = ""
    samples: Optional[str] = ""
    samples_per_s: Optional[str] = ""
    starvation_pct: Optional[str] = ""
    recorder_pct: Optional[str] = ""
    capture: Optional[str] = ""


@dataclass(frozen=True)
class CapturedStep:
    """A capture's transforms.csv row as its cause reads it: the step, its ms a sample and the baseline's."""

    transform: Optional[str] = "?"
    ms_per_sample: Optional[str] = None
    baseline_ms_per_sample: Optional[str] = None


def _csv(path: Path) -> List[Dict[str, str]]:
    if not path.is_file():
        return []
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def _rows(path: Path) -> List[RecordedRow]:
    """The file's whole rows: a row a run killed mid-write cut short (no last step) left out."""
    return [row for row in parse_all(RecordedRow, _csv(path)) if row.last_step]


def _number(value: Any) -> Optional[float]:
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def _fmt(value: Any) -> str:
    number = _number(value)
    return "" if number is None else f"{number:.1f}"


@dataclass(frozen=True)
class Capture:
    """One capture folder: its capture.json read once into fields (a key it lacks reads as None) and its
    transform rows."""

    path: Path
    transforms: Tuple[Dict[str, str], ...]
    kind: Optional[str] = None
    loader: Optional[str] = None
    rank: Optional[int] = None
    epoch: Optional[int] = None
    first_step: Optional[int] = None
    last_step: Optional[int] = None
    lost_s: Optional[float] = None
    starvation_pct: Optional[float] = None
    baseline_starvation_pct: Optional[float] = None
    samples_per_s: Optional[float] = None
    baseline_samples_per_s: Optional[float] = None
    storage_read_mb: Optional[float] = None
    storage_read_mb_per_s: Optional[float] = None
    # An epoch start's: whether the workers persist, how many, and how long the start waited.
    persistent_workers: Optional[bool] = None
    workers: Optional[int] = None
    wait_s: Optional[float] = None

    @classmethod
    def read(cls, path: Path) -> "Capture":
        record = json.loads((path / "capture.json").read_text())
        return parse(cls, {**record, "path": path, "transforms": _csv(path / "transforms.csv")})


def captures(folder: Path) -> List[Capture]:
    """Each capture folder's record and transform rows, in number order (top folder and ranks' own)."""
    paths = sorted(folder.glob(CAPTURE_GLOB)) + sorted(folder.glob(f"ranks/*/{CAPTURE_GLOB}"))
    return [Capture.read(path) for path in paths if (path / "capture.json").is_file()]


def capture_cause(capture: Capture) -> str:
    """One phrase: what the stall is made of, read from its kind and its rows against the baseline's."""
    if capture.kind == "epoch_start":
        return (f"an epoch start waited {float(capture.wait_s or 0):.1f} s" +
                ("" if capture.persistent_workers or not capture.workers else
                 ": the workers restart each epoch (persistent_workers=False)"))
    grown = []
    for step in parse_all(CapturedStep, capture.transforms):
        now, base = _number(step.ms_per_sample), _number(step.baseline_ms_per_sample)
        if now is not None:
            grown.append((now - (base or 0.0), step.transform, now, base))
    if not grown:
        return ("the rate fell while no step inside the loader was timed slower: the training step, not the data"
                if capture.kind == "rate" else "no per-transform rows: the loader's samples were not timed")
    delta, name, now, base = max(grown)
    if delta <= 0:
        return "no step inside the loader grew: the training step or the host, not the data"
    was = f" (baseline {base:.2f})" if base is not None else ""
    return f"{name}: {now:.2f} ms a sample{was}"


def _draw(series: Sequence[RecordedRow], events: Sequence[RecordedRow], out_dir: Path, name: str,
          title: str, xlabel: str) -> List[str]:
    """The timeline of `series`, a line a loader and rank, written as `name` in out_dir; the report's
    lines that show it."""
    lines: Dict[str, List[RecordedRow]] = {}
    for row in series:
        lines.setdefault(f"{row.loader.split(',')[0]} rank {row.rank}", []).append(row)
    if not lines:
        return []
    figure = Figure(figsize=(10, 6), layout="constrained")
    rate, starved = figure.subplots(2, 1, sharex=True)
    for label, rows in lines.items():
        steps = [int(r.last_step) for r in rows]
        rate.plot(steps, [_number(r.samples_per_s) for r in rows], label=label)
        starved.plot(steps, [_number(r.starvation_pct) for r in rows], label=label)
        epochs = [int(r.first_step) for a, r in zip(rows, rows[1:]) if r.epoch != a.epoch]
        for step in epochs:
            for axis in (rate, starved):
                axis.axvline(step, color="grey", linestyle=":", linewidth=0.8)
    for event in events:
        if event.capture:
            for axis in (rate, starved):
                axis.axvspan(int(event.first_step), int(event.last_step) + 1, color="red", alpha=0.15)
            starved.annotate(f"capture-{event.capture}", (int(event.first_step), 0), fontsize=8)
    rate.set_ylabel("samples/s")
    starved.set_ylabel("starvation %")
    starved.set_xlabel(xlabel)
    rate.legend(fontsize=8)
    rate.set_title(title)
    write_png(figure, out_dir / name)
    return [f"![{title}]({name})", ""]


def capture_report(capture: Capture, folder: Path) -> str:
    """capture-N/report.md: the stall, its cause, its rows against the baseline, the command to run."""
    rows = capture.transforms
    lines = [f"# {capture.path.name}: {capture.kind} stall of {capture.loader}", "",
             f"- steps {capture.first_step}-{capture.last_step}, epoch {capture.epoch}, rank "
             f"{capture.rank}; time lost: {float(capture.lost_s or 0):.2f} s",
             f"- starvation {_fmt(capture.starvation_pct)} % against the run's baseline "
             f"{_fmt(capture.baseline_starvation_pct)} %; samples/s {_fmt(capture.samples_per_s)} "
             f"against {_fmt(capture.baseline_samples_per_s)}",
             f"- cause: {capture_cause(capture)}"]
    if capture.storage_read_mb is not None:
        lines.append(f"- storage: {_fmt(capture.storage_read_mb)} MB read from storage by the process tree over the "
                     f"stalled windows ({_fmt(capture.storage_read_mb_per_s)} MB/s; reads the page cache served "
                     "count nothing)")
    lines.append("")
    if rows:
        lines += ["## per-transform rows of the stalled windows", "",
                  markdown_table(rows, ("stage", "transform", "ms_per_sample", "ms_per_call_median",
                                        "baseline_ms_per_sample", "share_pct")), ""]
    lines += ["## what to do", ""]
    if capture.kind == "epoch_start" and not capture.persistent_workers:
        lines.append("- set `persistent_workers=True` on the loader, so its workers outlive the epoch")
    lines += ["- export the loader's pipeline, then let pipebench search it on the same data: the export prints "
              "this loader's `pipebench explore --config-dir ...` command (and `pipebench run`'s; `pipebench tune` "
              "takes the same groups)", "", "```",
              f"pipebench attach --export-config {folder / 'exported'} --steps 200 -- python YOUR_SCRIPT ARGS",
              "```", "", "(docs/attach.md, 'Recording a whole run')"]
    return "\n".join(lines) + "\n"


def write_recording(folder: Path, out_dir: Path) -> Optional[str]:
    """Draw the timeline and write each capture's report.md; the report's section (None when the
    folder holds no recording)."""
    series = _rows(folder / SERIES_CSV)
    if not series:
        return None
    events = _rows(folder / EVENTS_CSV)
    found = captures(folder)
    lines = [f"## Recorded run: `{folder}`", "",
             *_draw(series, events, out_dir, TIMELINE_PNG, RECORDED_TITLE, RECORDED_XLABEL),
             f"{len(series)} windows, {sum(1 for e in events if e.kind == 'epoch_start')} epoch starts, "
             f"{len(found)} captures."]
    own = recorder_share(series)
    if own is not None:
        lines.append(f"The recorder's own time in the loop: {own.pct:.2f}% over the run (time-weighted over "
                     f"{own.windows} windows), at most {own.worst_pct:.2f}% (steps {own.worst.first_step}-"
                     f"{own.worst.last_step}, {own.worst.loader.split(',')[0]} rank {own.worst.rank}).")
    table = []
    for capture in found:
        write_text_atomic(capture.path / "report.md", capture_report(capture, folder))
        table.append({"capture": capture.path.name, "kind": capture.kind,
                      "loader": str(capture.loader or "").split(",")[0], "rank": capture.rank,
                      "steps": f"{capture.first_step}-{capture.last_step}",
                      "lost_s": f"{float(capture.lost_s or 0):.2f}",
                      "starvation_pct": _fmt(capture.starvation_pct),
                      "baseline_starvation_pct": _fmt(capture.baseline_starvation_pct),
                      "cause": capture_cause(capture)})
    if table:
        lines += ["", markdown_table(table, CAPTURE_TABLE_COLUMNS)]
    return "\n".join(lines) + "\n"


def _span_s(row: RecordedRow) -> Optional[float]:
    """The window's span in seconds, its samples over its rate (None where a window has no samples)."""
    samples, rate = _number(row.samples), _number(row.samples_per_s)
    return samples / rate if samples and rate else None


def _rate(rows: Sequence[RecordedRow]) -> Optional[float]:
    """samples/s over `rows`' windows together."""
    spans = [(_number(r.samples), span) for r in rows if (span := _span_s(r))]
    span = sum(s for _, s in spans)
    return sum(samples for samples, _ in spans) / span if span else None


@dataclass(frozen=True)
class RecorderShare:
    """The recorder's own time in the loop over a set of windows: its share of their spans together
    (time-weighted), and the window where it was largest."""

    pct: float
    windows: int
    worst_pct: float
    worst: RecordedRow


def recorder_share(rows: Sequence[RecordedRow]) -> Optional[RecorderShare]:
    """`recorder_pct` over `rows`, each window weighted by its span; None where no window holds it
    (a `pipebench run` job's series, a recording made before the column)."""
    held = [(row, pct, span) for row in rows
            if (pct := _number(row.recorder_pct)) is not None and (span := _span_s(row))]
    if not held:
        return None
    worst, worst_pct, _ = max(held, key=lambda item: item[1])
    total = sum(span for _, _, span in held)
    return RecorderShare(sum(pct * span for _, pct, span in held) / total, len(held), worst_pct, worst)


def _halves(job: str, rows: Sequence[RecordedRow]) -> Dict[str, Any]:
    """One job's and rank's rate over the first and the second half of its windows, and the change."""
    middle = len(rows) // 2
    first, second = _rate(rows[:middle]), _rate(rows[middle:])
    change = 100.0 * (second - first) / first if first and second is not None else None
    return {"job": job, "rank": rows[0].rank, "windows": len(rows), "first_half_samples_per_s":
            _fmt(first), "second_half_samples_per_s": _fmt(second), "change_pct": _fmt(change)}


def job_series_section(folder: Path, out_dir: Path, suffix: str = "") -> Optional[str]:
    """A run folder's jobs' series.csv (`pipebench run`) drawn as one timeline, a line a job and rank; the
    report's section (None when no job wrote one)."""
    # job-2 before job-10: by the name's length, then the name.
    paths = sorted(folder.glob(JOB_SERIES_GLOB), key=lambda path: (len(path.parent.name), path.parent.name))
    series = [row for path in paths for row in _rows(path)]
    if not series:
        return None
    lines = [f"## Job series: `{folder}`", "",
             *_draw(series, [], out_dir, JOB_SERIES_PNG.format(suffix=suffix), JOBS_TITLE, JOBS_XLABEL)]
    by_line: Dict[Tuple[str, str], List[RecordedRow]] = {}
    for row in series:
        by_line.setdefault((row.loader, row.rank), []).append(row)
    lines += ["samples/s over the first and the second half of each job's windows (series.csv in its folder: a "
              "row a window of its measured steps):", "",
              markdown_table([_halves(loader, rows) for (loader, _), rows in by_line.items()], JOB_SERIES_COLUMNS)]
    return "\n".join(lines) + "\n"


def recording_markdown(folders: Sequence[Path], out_dir: Path) -> Optional[str]:
    """The recorded folders' sections: one a folder that holds series.csv (attach's), one a run folder
    whose jobs wrote theirs."""
    parts = [text for number, folder in enumerate(folders, start=1)
             for text in (write_recording(folder, out_dir),
                          job_series_section(folder, out_dir, "" if number == 1 else f"-{number}")) if text]
    return "\n".join(parts) or None
