"""Result files: result.json per job, and the invocation's summary.csv / transforms.csv.

The invocation files are rebuilt from the job folders after every job, so an interrupted
sweep always leaves every finished row on disk. summary.md is the report stage's
(`pipebench.report.summary`). Every reader of result.json or calibration.json goes through
`read_result` / `read_calibration` (pipebench.record.stored): a damaged file is named, never
skipped in silence, and a row whose figures contradict each other counts as damaged.
"""

import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Mapping, Sequence, Tuple

from pipebench.base.csv_cells import csv_text
from pipebench.base.errors import warn
from pipebench.base.io import write_json_atomic, write_text_atomic
from pipebench.base.typed_json import parse, required_fields
from pipebench.record.figures import SUMMARY_COLUMNS, TEXT_SUMMARY_COLUMNS
from pipebench.record.jobs import JobResult, StoredResult
from pipebench.record.sections import PassRecord, TransformRow
from pipebench.record.stored import (
    NUMBER,
    OBJECT,
    TEXT,
    TEXTS,
    WHOLE,
    DamagedFile,
    Malformed,
    check_fields,
    finite_positive,
    list_of,
    optional,
    read_stored,
    versioned,
)

RESULT_FILE = "result.json"
# The launcher names job folders job-<num> (conf/config.yaml, hydra.sweep.subdir); nothing else
# in an invocation folder is read as a result.
JOB_RESULT_GLOB = f"job-*/{RESULT_FILE}"
SUMMARY_CSV = "summary.csv"
SUMMARY_MD = "summary.md"
TRANSFORMS_CSV = "transforms.csv"
# Written at the invocation root by `calibrate=true`; read by compare and baseline update.
CALIBRATION_FILE = "calibration.json"

# The transforms.csv columns a thread profile fills (empty for a step not profiled).
PROFILE_COLUMNS = ("profile_threads", "thread_speedup", "thread_speedups", "off_cpu_pct_1t", "off_cpu_pct_nt",
                   "thread_verdict")
PROFILE_TEXT_COLUMNS = ("thread_speedups", "thread_verdict")
TRANSFORM_COLUMNS = [
    "job", "stage", "transform", "calls", "ms_per_call_mean", "ms_per_call_median", "ms_per_sample", "share_pct",
    # The step's thread-scaling profile (pipebench.measure.thread_profile); empty where none ran.
    *PROFILE_COLUMNS,
]
# What a job prints of its rows: the timings, and the profile's speed-up and verdict where it ran.
PRINTED_TRANSFORM_COLUMNS = TRANSFORM_COLUMNS[1:TRANSFORM_COLUMNS.index(PROFILE_COLUMNS[0])]
PRINTED_PROFILE_COLUMNS = ("profile_threads", "thread_speedup", "off_cpu_pct_nt", "thread_verdict")


def printed_transform_columns(rows: Sequence[Mapping[str, Any]]) -> List[str]:
    """The columns a job prints: the profile's only when some row has them."""
    profiled = any(row.get(PROFILE_COLUMNS[0]) is not None for row in rows)
    return [*PRINTED_TRANSFORM_COLUMNS, *(PRINTED_PROFILE_COLUMNS if profiled else ())]


NUMERIC_SUMMARY = {**{column: optional(NUMBER) for column in SUMMARY_COLUMNS if column not in TEXT_SUMMARY_COLUMNS},
                   "ranks": optional(WHOLE)}
# What the readers of result.json index without a default (report, diagnosis, compare, explore, resume).
RESULT_FIELDS = {"job": TEXT, "job_num": WHOLE, "overrides": TEXTS, "config": OBJECT, "summary": OBJECT,
                 "transforms": list_of(OBJECT), "passes": list_of(OBJECT), "fingerprint": OBJECT}
SUMMARY_FIELDS = {"job": TEXT, "workers": WHOLE, "batch_size": WHOLE, "steps": WHOLE,
                  **{key: NUMBER for key in ("samples_per_s", "samples_per_s_ci_low", "samples_per_s_ci_high",
                                             "step_ms_mean", "starvation_pct", "transfer_ms_median",
                                             "ready_next_ms_median")},
                  # Empty (null) for a watched loader without transform rows (`transforms_note` says why).
                  **{key: optional(NUMBER) for key in ("cpu_ms_per_sample", "pipeline_ms_per_sample")}}
FINGERPRINT_FIELDS = {"usable_cores": WHOLE}
# Every field a TransformRow requires, so a row the readers cannot type is a damaged file, named on one line.
TRANSFORM_FIELDS = {name: TEXT if name in ("stage", "transform") else NUMBER for name in required_fields(TransformRow)}
NUMERIC_TRANSFORM = {column: TEXT if column in PROFILE_TEXT_COLUMNS else NUMBER for column in TRANSFORM_COLUMNS[3:]}
# A pass's per-step lists that readers use (compare's rates, the diagnosis's consumer time, the checks below).
PASS_FIELDS = {key: list_of(NUMBER) for key in ("samples", "step_ms", "wait_ms", "compute_ms", "h2d_ms")}
# The summary is computed from the same float64 step times result.json stores in `passes`, so the
# two agree to rounding (3e-16 measured on the committed nightly baseline); a millionth leaves room
# for the JSON round trip and still catches any hand edit of a figure.
AGREEMENT = 1e-6
# The flag a stored row carries when its interval leaves out its own rate (see _interval_flagged).
INTERVAL_EXCLUDES_NOTE = "the stored interval excludes samples_per_s (written before intervals held their estimate)"


@dataclass(frozen=True)
class Calibration:
    """calibration.json, as pipebench.measure.calibration times it and compare reads it: seconds a
    repetition, the median (`score_s`) and every timed repetition, and what it was timed on (its
    workload, plan and host; empty in a file that names none)."""

    score_s: float
    samples_s: Tuple[float, ...]
    fingerprint: Mapping[str, Any] = field(default_factory=dict)


def write_calibration(invocation_dir: Path, calibration: Calibration) -> Path:
    """Store a calibration at the invocation root."""
    path = invocation_dir / CALIBRATION_FILE
    write_json_atomic(path, versioned(asdict(calibration)))
    return path


def _check_calibration(data: Dict[str, object]) -> None:
    check_fields(data, {"score_s": NUMBER, "samples_s": list_of(NUMBER)})
    figures = parse(Calibration, data)
    if not all(finite_positive(s) for s in (figures.score_s, *figures.samples_s)):
        raise Malformed("score_s and samples_s must be finite seconds above 0")


def read_calibration(path: Path) -> Calibration:
    """calibration.json, checked and typed: a positive score and its samples."""
    return parse(Calibration, read_stored(path, _check_calibration))


def _agree(value: float, expected: float) -> bool:
    return abs(value - expected) <= AGREEMENT * abs(expected)


def _pass_rates(result: JobResult) -> List[Sequence[Mapping[str, Any]]]:
    """The pass lists whose rates add up to samples_per_s: the job's, or one a rank (multi-rank)."""
    if (result.summary.ranks or 1) == 1:
        return [result.passes]
    check_fields(result.sections, {"rank_passes": OBJECT})
    ranks = result.rank_passes
    check_fields(ranks, {rank: list_of(OBJECT) for rank in ranks}, "rank_passes.")
    return list(ranks.values())


def _check_passes(passes: Sequence[Mapping[str, Any]], batch_size: int, where: str) -> float:
    """Each pass's step lists; returns the rate they give (samples/s)."""
    if not passes:
        raise Malformed(f"{where} holds no pass")
    records = []
    for i, one in enumerate(passes):
        check_fields(one, PASS_FIELDS, f"{where}.{i}.")
        if len({len(one[key]) for key in PASS_FIELDS}) > 1:
            raise Malformed(f"{where}.{i} has step lists of different lengths")
        record = parse(PassRecord, one)
        if any(not 0 <= n <= batch_size for n in record.samples):
            raise Malformed(f"{where}.{i}.samples holds a batch outside 0..batch_size ({batch_size})")
        if not finite_positive(sum(record.step_ms)):
            raise Malformed(f"{where}.{i}.step_ms add up to {sum(record.step_ms):g} ms: no time was measured")
        records.append(record)
    counted = [[bool(flag) for flag in one.steady_mask] for one in records]
    if any(len(flags) != len(one.samples) for flags, one in zip(counted, records)):
        raise Malformed(f"{where} has a steady list of another length than its steps")
    samples = sum(n for one, flags in zip(records, counted) for n, steady in zip(one.samples, flags) if steady)
    step_ms = sum(ms for one, flags in zip(records, counted) for ms, steady in zip(one.step_ms, flags) if steady)
    if not finite_positive(step_ms):
        raise Malformed(f"{where} marks no step as steady")
    return 1000.0 * samples / step_ms


def _check_row(result: JobResult) -> None:
    """The summary's own figures agree with each other and with the raw steps beside them."""
    summary = result.summary
    rate, low, high = summary.samples_per_s, summary.samples_per_s_ci_low, summary.samples_per_s_ci_high
    if not finite_positive(rate):
        raise Malformed(f"summary.samples_per_s is {rate!r}, not a finite number above 0")
    # Too few blocks for an interval leave both bounds NaN; the raw steps below still check the rate.
    if math.isnan(low) != math.isnan(high) or math.isinf(low) or math.isinf(high):
        raise Malformed(f"summary.samples_per_s's interval {low:g}..{high:g} is not two finite bounds or none")
    measured = sum(_check_passes(passes, summary.batch_size, "passes") for passes in _pass_rates(result))
    if not _agree(rate, measured):
        raise Malformed(f"summary.samples_per_s {rate:g} disagrees with its passes ({measured:g} samples/s)")
    all_steps = sum(len(one.step_ms) for one in result.pass_records)
    step_ms = [ms for one in result.pass_records for ms, steady in zip(one.step_ms, one.steady_mask) if steady]
    if summary.steps != all_steps or not _agree(summary.step_ms_mean, sum(step_ms) / len(step_ms)):
        raise Malformed(f"summary step stats (steps {summary.steps}, step_ms_mean {summary.step_ms_mean:g}) "
                        f"disagree with its passes ({len(step_ms)} steps)")


def _check_result(data: Dict[str, object]) -> None:
    check_fields(data, RESULT_FIELDS)
    summary = parse(StoredResult, data).summary
    check_fields(summary, SUMMARY_FIELDS, "summary.")
    check_fields(summary, NUMERIC_SUMMARY, "summary.", required=False)
    result = JobResult.from_stored(data)  # its summary's cells are of their columns' kinds now
    check_fields(result.fingerprint, FINGERPRINT_FIELDS, "fingerprint.")
    for i, row in enumerate(result.transforms):
        check_fields(row, TRANSFORM_FIELDS, f"transforms.{i}.")
        check_fields(row, NUMERIC_TRANSFORM, f"transforms.{i}.", required=False)
    _check_row(result)


def _interval_flagged(data: Dict[str, object]) -> Dict[str, object]:
    """`data`, its summary's `ci_note` saying so where the interval leaves out the rate. Not damage: the
    rate agrees with the raw steps (`_check_row`), and pipebench itself wrote such intervals once."""
    summary = JobResult.from_stored(data).summary
    rate, low, high = summary.samples_per_s, summary.samples_per_s_ci_low, summary.samples_per_s_ci_high
    if math.isnan(low) or low * (1 - AGREEMENT) <= rate <= high * (1 + AGREEMENT):
        return data
    note = f"{INTERVAL_EXCLUDES_NOTE} ({low:g}..{high:g})"
    return {**data, "summary": {**summary.row, "ci_note": note}}


def read_result(path: Path) -> Dict[str, object]:
    """One job's result.json, checked (pipebench.record.stored). Raises DamagedFile or NewerFile."""
    return _interval_flagged(read_stored(path, _check_result))


def write_result(job_dir: Path, result: Mapping[str, object]) -> None:
    write_json_atomic(job_dir / RESULT_FILE, versioned(result))


@dataclass(frozen=True)
class ResultScan:
    """An invocation folder's results in job order, and the files that were damaged."""

    results: Tuple[JobResult, ...]
    damaged: Tuple[DamagedFile, ...]


def scan_job_results(invocation_dir: Path) -> ResultScan:
    """Every job's result.json; damaged ones apart. A newer file raises NewerFile."""
    results, damaged = [], []
    for path in sorted(invocation_dir.glob(JOB_RESULT_GLOB)):
        try:
            results.append(JobResult.from_stored(read_result(path)))
        except DamagedFile as exc:
            damaged.append(exc)
    return ResultScan(tuple(sorted(results, key=lambda r: r.job_num)), tuple(damaged))


def load_job_results(invocation_dir: Path) -> List[JobResult]:
    """Every finished job's result.json in job order; the first damaged one raises DamagedFile."""
    scan = scan_job_results(invocation_dir)
    if scan.damaged:
        raise scan.damaged[0]
    return list(scan.results)


def flat_config(value: object, prefix: str = "") -> Dict[str, object]:
    """A resolved config as dotted keys (`transform.per_sample.1.size`) to plain values; an empty
    list stays a value, an empty mapping has no keys."""
    if isinstance(value, Mapping):
        items = [(str(k), v) for k, v in value.items()]
    elif isinstance(value, list) and value:
        items = [(str(i), v) for i, v in enumerate(value)]
    else:
        return {prefix.rstrip("."): value}
    flat: Dict[str, object] = {}
    for key, item in items:
        flat.update(flat_config(item, f"{prefix}{key}."))
    return flat


def summary_rows(results: Sequence[JobResult]) -> List[Dict[str, object]]:
    """Each job's summary row, with its samples/s relative to the first job's (`speedup`)."""
    if not results:
        return []
    base_rate = float(results[0].summary.samples_per_s) or float("nan")
    return [{**r.summary.row, "speedup": float(r.summary.samples_per_s) / base_rate} for r in results]


def write_invocation_tables(invocation_dir: Path) -> List[Dict[str, object]]:
    """Rebuild summary.csv and transforms.csv from the job folders; the summary rows. A damaged result a
    resumed sweep has yet to run again is left out of the tables, with a line saying so."""
    scan = scan_job_results(invocation_dir)
    for damaged in scan.damaged:
        warn(f"{damaged}; left out of {SUMMARY_CSV} until its job runs again")
    rows = summary_rows(scan.results)
    write_text_atomic(invocation_dir / SUMMARY_CSV, csv_text(rows, SUMMARY_COLUMNS))
    transforms = [{"job": r.summary.job, **t} for r in scan.results for t in r.transforms]
    write_text_atomic(invocation_dir / TRANSFORMS_CSV, csv_text(transforms, TRANSFORM_COLUMNS))
    return rows
