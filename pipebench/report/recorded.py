"""A recorded run read back (`attach --record`): the timeline, the captures' table, each capture's report.md.

The recorder (pipebench.attach.recorder) writes data only: series.csv, events.csv and
capture-N/ (capture.json, transforms.csv). This module, a stage above it, renders them for
`pipebench report` (and attach's own report at the run's end): `timeline.png`, samples/s and
starvation over steps, a line a loader and rank, epochs and captures marked; a table of the
captures with their cause (the step that grew most against the baseline); and `capture-N/report.md`,
the diagnosis of one stall and the command to run. Files are read as CSV text, so a run killed
mid-write reads up to its last whole row.
"""

import csv
import io
import json
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from pipebench.base.io import write_bytes_atomic, write_text_atomic
from pipebench.base.tables import markdown_table

__all__ = ["TIMELINE_PNG", "capture_cause", "recording_markdown", "write_recording"]

SERIES_CSV, EVENTS_CSV = "series.csv", "events.csv"
TIMELINE_PNG = "timeline.png"
CAPTURE_GLOB = "capture-*"
DPI = 100
CAPTURE_TABLE_COLUMNS = ("capture", "kind", "loader", "rank", "steps", "lost_s", "starvation_pct",
                         "baseline_starvation_pct", "cause")


def _rows(path: Path) -> List[Dict[str, str]]:
    if not path.is_file():
        return []
    with open(path, newline="") as f:
        return [row for row in csv.DictReader(f) if row.get("last_step")]


def _number(value: Any) -> Optional[float]:
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def _fmt(value: Any) -> str:
    number = _number(value)
    return "" if number is None else f"{number:.1f}"


def captures(folder: Path) -> List[Dict[str, Any]]:
    """Each capture folder's record and transform rows, in number order (top folder and ranks' own)."""
    found = []
    for path in sorted(folder.glob(CAPTURE_GLOB)) + sorted(folder.glob(f"ranks/*/{CAPTURE_GLOB}")):
        record_file = path / "capture.json"
        if not record_file.is_file():
            continue
        record = json.loads(record_file.read_text())
        found.append({"path": path, "record": record, "transforms": _rows_any(path / "transforms.csv")})
    return found


def _rows_any(path: Path) -> List[Dict[str, str]]:
    if not path.is_file():
        return []
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def capture_cause(record: Mapping[str, Any], transforms: Sequence[Mapping[str, str]]) -> str:
    """One phrase: what the stall is made of, read from its kind and its rows against the baseline's."""
    if record.get("kind") == "epoch_start":
        persistent = record.get("persistent_workers")
        return (f"an epoch start waited {float(record.get('wait_s') or 0):.1f} s" +
                ("" if persistent or not record.get("workers") else
                 ": the workers restart each epoch (persistent_workers=False)"))
    grown = []
    for row in transforms:
        now, base = _number(row.get("ms_per_sample")), _number(row.get("baseline_ms_per_sample"))
        if now is not None:
            grown.append((now - (base or 0.0), row.get("transform", "?"), now, base))
    if not grown:
        return ("the rate fell while no step inside the loader was timed slower: the training step, not the data"
                if record.get("kind") == "rate" else "no per-transform rows: the loader's samples were not timed")
    delta, name, now, base = max(grown)
    if delta <= 0:
        return "no step inside the loader grew: the training step or the host, not the data"
    was = f" (baseline {base:.2f})" if base is not None else ""
    return f"{name}: {now:.2f} ms a sample{was}"


def _timeline(series: Sequence[Mapping[str, str]], events: Sequence[Mapping[str, str]]) -> Optional[Figure]:
    lines: Dict[str, List[Mapping[str, str]]] = {}
    for row in series:
        lines.setdefault(f"{row['loader'].split(',')[0]} rank {row['rank']}", []).append(row)
    if not lines:
        return None
    figure = Figure(figsize=(10, 6), layout="constrained")
    FigureCanvasAgg(figure)
    rate, starved = figure.subplots(2, 1, sharex=True)
    for label, rows in lines.items():
        steps = [int(r["last_step"]) for r in rows]
        rate.plot(steps, [_number(r["samples_per_s"]) for r in rows], label=label)
        starved.plot(steps, [_number(r["starvation_pct"]) for r in rows], label=label)
        epochs = [int(r["first_step"]) for a, r in zip(rows, rows[1:]) if r["epoch"] != a["epoch"]]
        for step in epochs:
            for axis in (rate, starved):
                axis.axvline(step, color="grey", linestyle=":", linewidth=0.8)
    for event in events:
        if event.get("capture"):
            for axis in (rate, starved):
                axis.axvspan(int(event["first_step"]), int(event["last_step"]) + 1, color="red", alpha=0.15)
            starved.annotate(f"capture-{event['capture']}", (int(event["first_step"]), 0), fontsize=8)
    rate.set_ylabel("samples/s")
    starved.set_ylabel("starvation %")
    starved.set_xlabel("step (dotted: an epoch starts; shaded: a captured stall)")
    rate.legend(fontsize=8)
    rate.set_title("The recorded run, window by window")
    return figure


def capture_report(capture: Mapping[str, Any], folder: Path) -> str:
    """capture-N/report.md: the stall, its cause, its rows against the baseline, the command to run."""
    record, rows = capture["record"], capture["transforms"]
    cause = capture_cause(record, rows)
    lines = [f"# {capture['path'].name}: {record.get('kind')} stall of {record.get('loader')}", "",
             f"- steps {record.get('first_step')}-{record.get('last_step')}, epoch {record.get('epoch')}, rank "
             f"{record.get('rank')}; time lost: {float(record.get('lost_s') or 0):.2f} s",
             f"- starvation {_fmt(record.get('starvation_pct'))} % against the run's baseline "
             f"{_fmt(record.get('baseline_starvation_pct'))} %; samples/s {_fmt(record.get('samples_per_s'))} "
             f"against {_fmt(record.get('baseline_samples_per_s'))}",
             f"- cause: {cause}"]
    if record.get("storage_read_mb") is not None:
        lines.append(f"- storage: {_fmt(record['storage_read_mb'])} MB read from storage by the process tree over the "
                     f"stalled windows ({_fmt(record.get('storage_read_mb_per_s'))} MB/s; reads the page cache served "
                     "count nothing)")
    lines.append("")
    if rows:
        lines += ["## per-transform rows of the stalled windows", "",
                  markdown_table(rows, ("stage", "transform", "ms_per_sample", "ms_per_call_median",
                                        "baseline_ms_per_sample", "share_pct")), ""]
    lines += ["## what to do", ""]
    if record.get("kind") == "epoch_start" and not record.get("persistent_workers"):
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
    figure = _timeline(series, events)
    lines = [f"## Recorded run: `{folder}`", ""]
    if figure is not None:
        png = io.BytesIO()
        figure.savefig(png, format="png", dpi=DPI)
        write_bytes_atomic(out_dir / TIMELINE_PNG, png.getvalue())
        lines += [f"![The recorded run]({TIMELINE_PNG})", ""]
    lines.append(f"{len(series)} windows, {sum(1 for e in events if e.get('kind') == 'epoch_start')} epoch starts, "
                 f"{len(found)} captures.")
    table = []
    for capture in found:
        record = capture["record"]
        write_text_atomic(capture["path"] / "report.md", capture_report(capture, folder))
        table.append({"capture": capture["path"].name, "kind": record.get("kind"),
                      "loader": str(record.get("loader", "")).split(",")[0], "rank": record.get("rank"),
                      "steps": f"{record.get('first_step')}-{record.get('last_step')}",
                      "lost_s": f"{float(record.get('lost_s') or 0):.2f}",
                      "starvation_pct": _fmt(record.get("starvation_pct")),
                      "baseline_starvation_pct": _fmt(record.get("baseline_starvation_pct")),
                      "cause": capture_cause(record, capture["transforms"])})
    if table:
        lines += ["", markdown_table(table, CAPTURE_TABLE_COLUMNS)]
    return "\n".join(lines) + "\n"


def recording_markdown(folders: Sequence[Path], out_dir: Path) -> Optional[str]:
    """The recorded folders' sections, one a folder that holds series.csv."""
    parts = [text for text in (write_recording(folder, out_dir) for folder in folders) if text]
    return "\n".join(parts) if parts else None
