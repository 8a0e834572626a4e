"""`pipebench report DIR [DIR ...]`: the comparison table, plots and report.md, from saved result.json files.

`pipebench run` calls the same `write_report` on its invocation folder when it ends. The report
is a list of section builders (REPORT_SECTIONS), each ReportInputs -> markdown or None, so a new
section (e.g. a diagnosis) is one more function appended to that tuple.
"""

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from pipebench.base.errors import ConfigError
from pipebench.base.io import write_text_atomic
from pipebench.record.jobs import JobResult
from pipebench.record.results import RESULT_FILE, load_job_results, summary_rows
from pipebench.report.comparison import (
    HOST,
    ComparisonTable,
    build_table,
    comparison_csv,
    comparison_markdown,
    group_rows,
    watched,
)
from pipebench.report.diagnosis import diagnose, render_diagnosis, whole_chain_timed
from pipebench.report.gpu import gpu_markdown
from pipebench.report.plots import PlotOutcome, write_plots
from pipebench.report.recorded import recording_markdown
from pipebench.report.summary import LOADER_NOTES_TITLE, loader_notes, skipped_lines

COMPARISON_MD = "comparison.md"
COMPARISON_CSV = "comparison.csv"
REPORT_MD = "report.md"


@dataclass(frozen=True)
class LoadedRun:
    """One results folder and its finished jobs' result.json records, in job order."""

    folder: Path
    results: Tuple[JobResult, ...]


@dataclass(frozen=True)
class ReportInputs:
    """Everything a report section may draw on."""

    runs: Tuple[LoadedRun, ...]
    table: ComparisonTable
    plots: Tuple[PlotOutcome, ...]
    out_dir: Path


SectionBuilder = Callable[[ReportInputs], Optional[str]]


def load_runs(dirs: Sequence[str]) -> Tuple[LoadedRun, ...]:
    """Read each results folder; a missing folder or one without results is a ConfigError."""
    runs = []
    for name in dirs:
        folder = Path(name)
        if not folder.is_dir():
            raise ConfigError(f"{name}: not a folder")
        results = load_job_results(folder)
        if not results:
            raise ConfigError(f"{name}: no results (no */{RESULT_FILE}); pass a folder `pipebench run` "
                              "printed as `results:`")
        runs.append(LoadedRun(folder, tuple(results)))
    if len({run.folder.resolve() for run in runs}) < len(runs):
        raise ConfigError("the same results folder is named twice")
    return tuple(runs)


def sources_section(inputs: ReportInputs) -> str:
    lines = ["# pipebench report", ""]
    for run in inputs.runs:
        hosts = sorted({str(r.host.hostname) for r in run.results})
        lines.append(f"- `{run.folder}`: {len(run.results)} finished job runs on {', '.join(hosts)}")
    if HOST in inputs.table.axes:
        lines += ["", "The folders come from different machines (see the `host` column): compare rows across hosts "
                      "with care."]
    return "\n".join(lines) + "\n"


def comparison_section(inputs: ReportInputs) -> str:
    return "## Comparison\n\n" + comparison_markdown(inputs.table)


def plots_section(inputs: ReportInputs) -> str:
    lines = ["## Plots", ""]
    for plot in inputs.plots:
        lines.append(f"![{plot.title}]({plot.name})" if plot.written else f"- {plot.name}: {plot.note}")
    return "\n".join(lines) + "\n"


def diagnosis_section(inputs: ReportInputs) -> str:
    """The analytic model beside the measurement, and what to do; one diagnosis per machine, since the
    model's core budget is a machine's, and one per loader of an attached script unless the table
    ranks its loaders (`--compare-loaders`)."""
    by_host: Dict[str, List[JobResult]] = {}
    loaders: List[JobResult] = []
    untimed = 0
    for run in inputs.runs:
        for result in run.results:
            # The model starts from the whole chain's per-sample cost: a watched loader without its
            # load row has none, so it would overstate capacity.
            if not whole_chain_timed(result):
                untimed += 1
            elif watched(result) and not inputs.table.ranked:
                loaders.append(result)
            else:
                by_host.setdefault(str(result.host.hostname), []).append(result)
    note = (f"\n{untimed} job(s) left out of the model: a loader watched by `pipebench attach` or `pipebench.watch` "
            "whose dataset's own loading could not be timed (no `load` row: an IterableDataset, a dataset with its own "
            "__getitems__), or a job without per-transform timings.\n" if untimed else "")
    if not by_host and not loaders:
        return f"## diagnosis\n{note}"
    if len(by_host) == 1 and not loaders:
        return render_diagnosis(diagnose(next(iter(by_host.values())))) + note
    parts = [render_diagnosis(diagnose(results)).replace("## diagnosis", f"## diagnosis: host {host}", 1)
             for host, results in sorted(by_host.items())]
    parts += [render_diagnosis(diagnose([result])).replace("## diagnosis", f"## diagnosis: {result.job}", 1)
              for result in loaders]
    return "\n".join(parts) + note


def loader_notes_section(inputs: ReportInputs) -> Optional[str]:
    """What each watched loader's figures leave out (no transform rows, no interval), and why."""
    lines = loader_notes(summary_rows([r for run in inputs.runs for r in run.results]))
    return f"## {LOADER_NOTES_TITLE}\n\n" + "\n".join(lines) + "\n" if lines else None


def _skipped(inputs: ReportInputs) -> List[str]:
    return skipped_lines([r for run in inputs.runs for r in run.results])


def skipped_section(inputs: ReportInputs) -> Optional[str]:
    """The samples run.on_error=skip dropped, a line a job, when any were."""
    lines = _skipped(inputs)
    return "## skipped samples\n\n" + "\n".join(f"- {line}" for line in lines) + "\n" if lines else None


def recording_section(inputs: ReportInputs) -> Optional[str]:
    """A recorded run's timeline and captures (`attach --record`), and a run folder's jobs' series.csv as
    one timeline; their PNGs and each capture's report.md are written beside the report."""
    return recording_markdown([run.folder for run in inputs.runs], inputs.out_dir)


def gpu_section(inputs: ReportInputs) -> Optional[str]:
    """The masked-loss pair (syncs a step, step-time ratio) and what the GPU did, when the runs have them."""
    return gpu_markdown(summary_rows([r for run in inputs.runs for r in run.results])) or None


# In report order. Append a builder here to add a section to every report.
REPORT_SECTIONS: Tuple[SectionBuilder, ...] = (sources_section, comparison_section, skipped_section,
                                               loader_notes_section, plots_section, recording_section, gpu_section,
                                               diagnosis_section)


def build_report_markdown(inputs: ReportInputs, sections: Sequence[SectionBuilder] = REPORT_SECTIONS) -> str:
    """The whole report.md: every section that has something to say, in order."""
    return "\n".join(text for text in (build(inputs) for build in sections) if text)


def write_report(dirs: Sequence[str], out_dir: Path, baseline: Optional[str] = None,
                 compare_loaders: bool = False) -> ReportInputs:
    """Load the folders, then write comparison.md/.csv, the plots and report.md into out_dir. A script's
    loaders (`pipebench attach`) are ranked against each other only with `compare_loaders`."""
    runs = load_runs(dirs)
    table = build_table(group_rows([(run.folder, run.results) for run in runs]), baseline, compare_loaders)
    out_dir.mkdir(parents=True, exist_ok=True)
    write_text_atomic(out_dir / COMPARISON_MD, comparison_markdown(table))
    write_text_atomic(out_dir / COMPARISON_CSV, comparison_csv(table))
    inputs = ReportInputs(runs, table, write_plots(table, out_dir), out_dir)
    write_text_atomic(out_dir / REPORT_MD, build_report_markdown(inputs))
    return inputs


def print_summary(inputs: ReportInputs) -> None:
    """What the terminal shows: the comparison table, the loaders' notes, one line per plot, then the diagnosis."""
    print(comparison_markdown(inputs.table))
    for line in _skipped(inputs):
        print(f"pipebench: {line}", file=sys.stderr)
    notes = loader_notes_section(inputs)
    if notes:
        print(notes)
    for plot in inputs.plots:
        print(f"plot {plot.name}: {plot.note}")
    gpu = gpu_section(inputs)
    if gpu:
        print(f"\n{gpu}")
    print()
    print(diagnosis_section(inputs))
    print(f"report: {inputs.out_dir / REPORT_MD}")
