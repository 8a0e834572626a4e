"""Result files: result.json per job, and the invocation's summary.csv / transforms.csv.

The invocation files are rebuilt from the job folders after every job, so an interrupted
sweep always leaves every finished row on disk. summary.md is the report stage's
(`pipebench.report.summary`).
"""

import json
import re
from dataclasses import asdict
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence

from pipebench.base.csv_cells import csv_text
from pipebench.base.io import write_json_atomic, write_text_atomic

RESULT_FILE = "result.json"
SUMMARY_CSV = "summary.csv"
SUMMARY_MD = "summary.md"
TRANSFORMS_CSV = "transforms.csv"
# Written at the invocation root by `calibrate=true`; read by compare and baseline update.
CALIBRATION_FILE = "calibration.json"

# Identity columns first, then the figures a reader compares, then the detail.
SUMMARY_COLUMNS = [
    "job", "dataset", "transform", "workers", "batch_size", "consumer",
    "samples_per_s", "samples_per_s_ci_low", "samples_per_s_ci_high", "speedup",
    "step_ms_mean", "step_ms_var", "step_ms_median", "step_ms_iqr", "step_ms_p99",
    "wait_ms_mean", "wait_ms_median", "wait_ms_p99", "starvation_pct", "accel_util_pct",
    "h2d_ms_median", "transfer_ms_median", "ready_next_ms_median", "ready_steps_pct",
    "pipeline_ms_per_sample", "cpu_ms_per_sample", "worker_capacity_samples_per_s", "cpu_capacity_samples_per_s",
    "first_batch_s", "worker_startup_s_max", "rss_mb_peak", "worker_pss_growth_mb", "shm_mb_peak",
    "steps", "repeats", "skipped_samples", "epochs",
    # GPU-side truth (pipebench.measure.gpu.session): empty cells where not measured, `gpu_notes` says why.
    "pin_memory", "consumer_ms_median", "h2d_gpu_ms_median", "gpu_util_pct", "syncs_per_step", "sync_ops",
    "sync_wait_ms_per_step", "gpu_busy_pct", "idle_host_wait_pct", "idle_kernel_wait_pct", "idle_other_pct",
    "reserved_mb_peak", "alloc_retries", "device_frees", "reserved_oscillating", "gpu_notes",
    "ranks", "straggler_ratio", "collective_wait_ms_mean", "duplicate_samples", "missed_samples",
]
TRANSFORM_COLUMNS = [
    "job", "stage", "transform", "calls", "ms_per_call_mean", "ms_per_call_median", "ms_per_sample", "share_pct",
]
PRINTED_TRANSFORM_COLUMNS = TRANSFORM_COLUMNS[1:]


# A job label's `run.round=K` component: rounds of one job share everything else.
ROUND_COMPONENT = re.compile(r"(?:^|,)run\.round=\d+(?=,|$)")


def job_key(label: str) -> str:
    """The job label with any `run.round=K` component removed, so rounds group together."""
    return ROUND_COMPONENT.sub("", label).lstrip(",") or "default"


def write_calibration(invocation_dir: Path, calibration: Any) -> Path:
    """Store a calibration (a dataclass from pipebench.measure.calibration) at the invocation root."""
    path = invocation_dir / CALIBRATION_FILE
    write_json_atomic(path, asdict(calibration))
    return path


def load_job_results(invocation_dir: Path) -> List[Dict[str, object]]:
    """Every finished job's result.json under an invocation folder, in job order."""
    found = []
    for path in invocation_dir.glob(f"*/{RESULT_FILE}"):
        try:
            found.append(json.loads(path.read_text()))
        except (OSError, json.JSONDecodeError):
            continue  # a job killed mid-write leaves no row rather than a broken one
    return sorted(found, key=lambda r: r["job_num"])


def with_speedup(rows: List[Dict[str, object]], baseline: Optional[str] = None) -> List[Dict[str, object]]:
    """Add samples/s relative to the baseline job (default: the first)."""
    if not rows:
        return rows
    base = next((r for r in rows if r["job"] == baseline), rows[0])
    base_rate = float(base["samples_per_s"]) or float("nan")
    return [{**r, "speedup": float(r["samples_per_s"]) / base_rate} for r in rows]


def summary_rows(results: Sequence[Mapping[str, object]]) -> List[Dict[str, object]]:
    return with_speedup([dict(r["summary"]) for r in results])


def transform_table_rows(results: Sequence[Mapping[str, object]]) -> List[Dict[str, object]]:
    return [{"job": r["summary"]["job"], **t} for r in results for t in r["transforms"]]


def write_invocation_tables(invocation_dir: Path) -> List[Dict[str, object]]:
    """Rebuild summary.csv and transforms.csv from the job folders; return the summary rows."""
    results = load_job_results(invocation_dir)
    rows = summary_rows(results)
    write_text_atomic(invocation_dir / SUMMARY_CSV, csv_text(rows, SUMMARY_COLUMNS))
    write_text_atomic(invocation_dir / TRANSFORMS_CSV, csv_text(transform_table_rows(results), TRANSFORM_COLUMNS))
    return rows
