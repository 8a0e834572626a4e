"""Hand-built result.json records that pass the record stage's checks: a summary whose figures agree
with the raw passes beside it, as a job writes them (pipebench.record.results.read_result)."""

import json
from pathlib import Path
from typing import Mapping, Optional, Sequence

from pipebench.pipeline.stages import PER_SAMPLE_STAGE
from pipebench.record.results import RESULT_FILE

# The summary's interval around its rate: wide enough to hold it, as a real interval does.
INTERVAL = 0.01


def result_record(num: int, overrides: Sequence[str] = (), rates: Sequence[float] = (1000.0,), batch: int = 32,
                  steps: int = 8, starvation: float = 0.5, summary: Optional[Mapping[str, object]] = None,
                  config: Optional[Mapping[str, object]] = None, fingerprint: Optional[Mapping[str, object]] = None,
                  job: Optional[str] = None) -> dict:
    """One job: a pass a rate (steps of `batch` samples at that rate), its summary from those passes,
    then `summary`'s keys on top (a rate given there must agree with `rates`)."""
    passes = [{"samples": [batch] * steps, "step_ms": [batch * 1000.0 / rate] * steps,
               "wait_ms": [batch * 1000.0 / rate * starvation] * steps,
               "compute_ms": [batch * 1000.0 / rate * (1 - starvation)] * steps, "h2d_ms": [0.0] * steps}
              for rate in rates]
    step_ms = [ms for one in passes for ms in one["step_ms"]]
    rate = 1000.0 * batch * len(step_ms) / sum(step_ms)
    label = job if job is not None else ",".join(overrides) or "default"
    row = {"job": label, "dataset": "random_tensors", "transform": "chain", "workers": 0, "batch_size": batch,
           "consumer": "none", "samples_per_s": rate, "samples_per_s_ci_low": rate * (1 - INTERVAL),
           "samples_per_s_ci_high": rate * (1 + INTERVAL), "step_ms_mean": sum(step_ms) / len(step_ms),
           "starvation_pct": 100.0 * starvation, "steps": len(step_ms), "cpu_ms_per_sample": 1.0,
           "pipeline_ms_per_sample": 1.0, "transfer_ms_median": 0.0, "ready_next_ms_median": 0.0, **(summary or {})}
    return {"job": label, "job_num": num, "overrides": list(overrides), "config": dict(config or {}), "choices": {},
            "summary": row, "transforms": [], "passes": passes,
            "fingerprint": {"usable_cores": 2, **(fingerprint or {})}}


def write_record(folder: Path, record: Mapping[str, object]) -> Path:
    """record as folder/job-<job_num>/result.json; returns its path."""
    path = folder / f"job-{record['job_num']}" / RESULT_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record))
    return path


def transform_row(transform: str, ms_per_sample: float, share_pct: float = 100.0,
                  stage: str = PER_SAMPLE_STAGE) -> dict:
    """One row of result.json's `transforms` as a job writes it (one call a sample)."""
    return {"stage": stage, "transform": transform, "calls": 1, "ms_per_call_mean": ms_per_sample,
            "ms_per_call_median": ms_per_sample, "ms_per_sample": ms_per_sample, "share_pct": share_pct}
