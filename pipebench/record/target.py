"""The stopping rule of a sweep with a target (`run.stop_at_target`, `pipebench explore --target`):
did a finished job keep its consumer busy at least `run.target_accel_util_pct` of the time?"""

from pathlib import Path
from typing import Optional

from pipebench.base.errors import PipebenchError
from pipebench.record.jobs import JobResult
from pipebench.record.results import RESULT_FILE, read_result


def reached_target(job_dir: Path, target_pct: float) -> Optional[float]:
    """The job's accel_util_pct when it reached `target_pct`; None when it did not, or left no
    sound result (a failed job never stops a sweep early)."""
    path = job_dir / RESULT_FILE
    if not path.is_file():
        return None
    try:
        value = JobResult.from_stored(read_result(path)).summary.accel_util_pct
    except PipebenchError:
        return None
    return value if value is not None and value >= target_pct else None
