"""The Hydra task function: one job, one folder, one result.json, and the sweep's tables refreshed.

`run_job_task` runs in a job process's child (the pipebench_subprocess launcher) or on a cluster
node (submitit). Launchers pickle it by reference, so it stays importable by name and carries no
state, and the command that plans the sweep imports this module: it imports no torch itself. The
job's modules are imported when a job runs, or ahead of it by the job process, which imports a
task module's `WARM_MODULES` while it waits for its first job (pipebench.measure.job_process).
"""

from omegaconf import DictConfig

__all__ = ["WARM_MODULES", "run_job_task"]

# What a job imports (torch with it: seconds), for a job process to import before its first job.
WARM_MODULES = ("pipebench.sweep.one_job",)


def run_job_task(cfg: DictConfig) -> None:
    """Hydra task function: one job, one folder (pipebench.sweep.one_job)."""
    # Imported here, not with this module: see the module's docstring.
    from pipebench.sweep.one_job import run_one_job

    run_one_job(cfg)
