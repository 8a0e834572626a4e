"""Stored baselines: the results a nightly run is compared with, committed under results/baselines/.

A baseline changes only when someone runs `pipebench baseline update` and commits the result,
so a slow night can never quietly become the new normal.
"""

import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Tuple

from pipebench.base.errors import ConfigError
from pipebench.record.results import (
    CALIBRATION_FILE,
    JOB_RESULT_GLOB,
    SUMMARY_CSV,
    load_job_results,
    read_calibration,
)

# Relative to the working directory: the repository root in CI. The repo's .gitignore ignores
# results/* but not results/baselines/, so what lands here can be committed.
BASELINES_DIR = "results/baselines"
DEFAULT_BASELINE_NAME = "nightly"


@dataclass(frozen=True)
class BaselineUpdate:
    """What `update_baseline` did: where the baseline is, what it holds, whether one was replaced."""

    target: Path
    files: Tuple[str, ...]
    replaced: bool


def _files_to_copy(results: Path) -> Tuple[str, ...]:
    if not (results / SUMMARY_CSV).is_file():
        raise ConfigError(f"{results}: no {SUMMARY_CSV}; pass the folder a `pipebench run` printed as `results:`")
    jobs = sorted(str(p.relative_to(results)) for p in results.glob(JOB_RESULT_GLOB))
    if not jobs:
        raise ConfigError(f"{results}: no {JOB_RESULT_GLOB}; no job finished in that run")
    if not (results / CALIBRATION_FILE).is_file():
        raise ConfigError(f"{results}: no {CALIBRATION_FILE}; baselines need a run with calibrate=true "
                          "(suite=nightly sets it)")
    # A damaged file must not become what every later night is compared with.
    load_job_results(results)
    read_calibration(results / CALIBRATION_FILE)
    return (SUMMARY_CSV, CALIBRATION_FILE, *jobs)


def update_baseline(results: Path, baselines_dir: Path, name: str) -> BaselineUpdate:
    """Replace `baselines_dir/name` with the compare inputs of the results folder `results`, assembled
    beside the old baseline and swapped in, so a failure midway leaves the old one whole."""
    if not name or Path(name).name != name or name.startswith("."):
        raise ConfigError(f"--name must be a plain folder name, got {name!r}")
    files = _files_to_copy(results)
    target = baselines_dir / name
    baselines_dir.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=baselines_dir))
    try:
        for rel in files:
            (staging / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(results / rel, staging / rel)
        replaced = target.exists()
        if replaced:
            shutil.rmtree(target)
        os.replace(staging, target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return BaselineUpdate(target=target, files=files, replaced=replaced)
