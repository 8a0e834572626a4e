"""Where `pipebench run` builds its sweep's jobs before it measures any: in a child of the job
process it started ahead, or here when it has none.

The builds import torch and what the chains name (torchvision: seconds), which the job process
has imported already, so the command's own process imports no torch at all. The child runs the
check the way a job runs (pipebench.measure.job_process), answers 0 when every job builds, 2 with
the one-line error left in a file this side reads, and leaves the job process as it was for the
first job.
"""

import os
import pickle
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional, Sequence, Tuple, Type

from pipebench.base.errors import USAGE_EXIT_STATUS, ConfigError, PipebenchError, error_line
from pipebench.config.specs import JobSpec
from pipebench.measure.job_spawn import JobProcess, run_job, serving, warm

__all__ = ["BuildCheck", "check_builds", "ran_in_child"]


@dataclass(frozen=True)
class BuildCheck:
    """Every job of a sweep built once, in a forked child of a job process; user modules named by
    `_target_` resolve from the command's `cwd`."""

    specs: Tuple[JobSpec, ...]
    cwd: str
    error_file: str

    def __call__(self) -> int:
        # Imported here, in the job process's child, where torch is imported already.
        from pipebench.pipeline.sweep_check import check_sweep_builds

        if self.cwd not in sys.path:
            sys.path.insert(0, self.cwd)
        try:
            check_sweep_builds(self.specs)
        except (PipebenchError, OSError) as exc:
            Path(self.error_file).write_text(error_line(exc), encoding="utf-8")
            return USAGE_EXIT_STATUS
        return 0


def ran_in_child(process: JobProcess, task: Callable[[str], object], failed: Type[PipebenchError],
                 crashed: str) -> bool:
    """Run `task(error_file)` in a child of `process`: True when it ended well. Its one line (exit 2)
    raises as `failed`, a crash as `crashed`; False when the job process itself ended, so the caller
    runs it in its own process, whose imports name the cause."""
    handle, error_file = tempfile.mkstemp(prefix="pipebench-child-", suffix=".txt")
    os.close(handle)
    try:
        status = run_job(process, pickle.dumps(task(error_file)))
        line = Path(error_file).read_text(encoding="utf-8")
    finally:
        os.unlink(error_file)
    if status == USAGE_EXIT_STATUS:
        raise failed(line)
    if status != 0 and serving(process):  # its traceback is above; the job process is fine
        raise PipebenchError(f"{crashed} (exit status {status}); its traceback is above")
    return status == 0


def check_builds(specs: Sequence[JobSpec], ahead: Optional[JobProcess]) -> None:
    """Build every job once (a ConfigError for the first that does not), in a child of `ahead`
    while it serves, else in this process. A process that has imported torch already (a caller of
    `pipebench.cli.main.main`, a test) builds here: the child would spare it nothing, and it would
    wait for the job process's imports."""
    if serving(ahead) and "torch" not in sys.modules:
        assert ahead is not None
        # Imported by the job process itself first: the check and every job it forks then have them.
        warm(ahead, [node for spec in specs for node in (*spec.per_sample, *spec.per_batch, spec.dataset)])
        if ran_in_child(ahead, lambda error_file: BuildCheck(tuple(specs), os.getcwd(), error_file),
                        ConfigError, "checking the jobs crashed"):
            return
    # Imported here: torch, and torchvision where a chain names it, only when no job process has them.
    from pipebench.pipeline.sweep_check import check_sweep_builds

    check_sweep_builds(specs)
