"""The calibration (`calibrate=true`) timed before a sweep's jobs: in a child of the job process
started ahead, or in the command's own process when it has none.

The workload needs torch, torchvision and the seed chain's modules (scipy with it), which the job
process has imported by the time the sweep's builds have been checked in a child of it
(pipebench.sweep.build_check). In a child, the job process is idle while the child times, and stays
as it was for the first job. The workload, its one thread and its figures are the same wherever it
runs (pipebench.measure.calibration).
"""

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from pipebench.base.errors import USAGE_EXIT_STATUS, PipebenchError, error_line
from pipebench.measure.job_spawn import JobProcess, discard, serving
from pipebench.record.results import write_calibration
from pipebench.sweep.build_check import ran_in_child

__all__ = ["TimedCalibration", "calibrate"]


@dataclass(frozen=True)
class TimedCalibration:
    """The calibration timed and written to `folder`'s calibration.json; a file it cannot write is
    one line in `error_file` and exit status 2 (run in a job process's child, as a job is)."""

    folder: str
    error_file: str = ""

    def __call__(self) -> int:
        # Imported here, in the job process's child, where torch is imported already.
        from pipebench.measure.calibration import run_calibration

        print("calibration: timing the fixed decode + transform workload", flush=True)
        calibration = run_calibration()
        try:
            path = write_calibration(Path(self.folder), calibration)
        except OSError as exc:
            if not self.error_file:
                raise
            Path(self.error_file).write_text(error_line(exc), encoding="utf-8")
            return USAGE_EXIT_STATUS
        print(f"calibration: {calibration.score_s * 1000:.1f} ms a repetition (median) -> {path}", flush=True)
        return 0


def calibrate(folder: Path, ahead: Optional[JobProcess]) -> Optional[JobProcess]:
    """Time the calibration into `folder`, in a child of `ahead` while it serves and its imports are
    done (the build check ran in it: this process imported no torch); else here, `ahead` ended
    first, since the timing must not run beside its imports. Returns the job process left for the
    first job: `ahead`, or None."""
    if serving(ahead) and "torch" not in sys.modules:
        assert ahead is not None
        if ran_in_child(ahead, lambda error_file: TimedCalibration(str(folder), error_file), PipebenchError,
                        "the calibration crashed"):
            return ahead
    discard(ahead)
    TimedCalibration(str(folder))()
    return None
