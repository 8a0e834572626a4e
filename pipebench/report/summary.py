"""summary.md: the sweep's summary table as a person reads it, with the GPU tables under it.

Rebuilt after every job from the rows record wrote to summary.csv, so the two never disagree.
"""

import math
from dataclasses import dataclass
from pathlib import Path
from typing import List, Mapping, Sequence

from pipebench.base.io import write_text_atomic
from pipebench.base.tables import markdown_table
from pipebench.base.typed_json import parse_all
from pipebench.config.specs import USER_STEP
from pipebench.record.figures import Summary
from pipebench.record.jobs import JobResult
from pipebench.record.results import SUMMARY_MD
from pipebench.report.gpu import gpu_markdown
from pipebench.report.job_sections import sections_of

__all__ = ["FIRST_BATCH_COLUMNS", "LOADER_NOTES_TITLE", "PRINTED_COLUMNS", "PRINTED_MULTIRANK_COLUMNS",
           "first_batch_markdown", "loader_notes", "skipped_lines", "write_summary_markdown"]

# The printed comparison keeps to what fits a terminal; summary.csv has everything.
PRINTED_COLUMNS = [
    "job", "workers", "consumer", "samples_per_s", "speedup", "step_ms_median", "step_ms_p99", "starvation_pct",
    "transfer_ms_median", "ready_next_ms_median", "cpu_ms_per_sample", "process_cpu_ms_per_sample", "first_batch_s",
    "worker_startup_s_max", "rss_mb_peak", "pss_mb_peak", "skipped_samples",
]
# Printed after PRINTED_COLUMNS when any job of the invocation ran on several ranks.
PRINTED_MULTIRANK_COLUMNS = ["ranks", "straggler_ratio", "collective_wait_ms_mean"]
# A watched loader's first batch taken apart (`pipebench attach`, `pipebench.watch`).
FIRST_BATCH_COLUMNS = ["job", "first_batch_s", "worker_start_s", "first_fetch_s", "dataset_pickle_mb",
                       "dataset_pickle_s", "start_method", "first_batch_note"]


def first_batch_markdown(rows: Sequence[Mapping[str, object]]) -> str:
    """The first-batch table of the rows that took it apart (watched loaders); empty when none did."""
    watched = [row for row, cells in zip(rows, map(Summary.from_row, rows))
               if cells.first_fetch_s is not None or cells.first_batch_note]
    if not watched:
        return ""
    return "### first batch, taken apart\n\n" + markdown_table(watched, FIRST_BATCH_COLUMNS)


LOADER_NOTES_TITLE = "what the loaders' figures leave out"


def loader_notes(rows: Sequence[Mapping[str, object]]) -> List[str]:
    """One markdown item a note of a watched loader's row (`pipebench attach`, `pipebench.watch`): why
    its transform rows miss part of a sample, why it has no interval; none when nothing is left out."""
    lines = []
    for row in map(Summary.from_row, rows):
        if row.consumer != USER_STEP:
            continue
        low = row.samples_per_s_ci_low
        no_interval = row.ci_note if low is None or not math.isfinite(low) else None
        lines += [f"- `{row.job}`: {note}" for note in (row.transforms_note, no_interval) if note]
    return lines


@dataclass(frozen=True)
class SkippedSample:
    """A sample that raised and run.on_error=skip dropped: an entry of result.json's `skipped`
    (pipeline.timed_chain's `SampleFailure` as written)."""

    index: int
    where: str
    step: str
    message: str


def skipped_lines(results: Sequence[JobResult]) -> List[str]:
    """One line a job whose samples raised and were dropped under run.on_error=skip, naming the first
    (result.json's `skipped`), as dataset.on_bad_sample=skip names what it leaves out; none otherwise."""
    lines = []
    for result in results:
        count = result.summary.skipped_samples or 0
        first = next(iter(parse_all(SkippedSample, sections_of(result).skipped)), None)
        if not count:
            continue
        named = f": sample {first.index} ({first.where}) failed in {first.step}: {first.message}" if first else ""
        more = f"; and {count - 1} more" if first and count > 1 else ""
        lines.append(f"job-{result.job_num}: run.on_error=skip dropped {count} sample(s) that raised"
                     f"{named}{more}; the rates count only the samples that made it")
    return lines


def write_summary_markdown(invocation_dir: Path, rows: Sequence[Mapping[str, object]]) -> str:
    """Write summary.md from the invocation's summary rows; return the markdown."""
    multirank = any((Summary.from_row(r).ranks or 1) > 1 for r in rows)
    markdown = markdown_table(rows, PRINTED_COLUMNS + (PRINTED_MULTIRANK_COLUMNS if multirank else []))
    for extra in (first_batch_markdown(rows), gpu_markdown(rows)):
        if extra:
            markdown += "\n" + extra
    write_text_atomic(invocation_dir / SUMMARY_MD, markdown)
    return markdown
