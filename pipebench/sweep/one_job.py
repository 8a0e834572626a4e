"""One job, one folder, one result.json, and the sweep's tables refreshed: what the Hydra task function
(pipebench.sweep.job_task) runs, in a job process's child or on a cluster node. Apart from the verbs, so
a job process imports only what a job needs, and from the task function, so the command that plans the
sweep imports none of it (torch: seconds).
"""

from pathlib import Path
from typing import NoReturn, Union

from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from pipebench.base.cores import usable_cores
from pipebench.base.errors import (
    USAGE_EXIT_STATUS,
    PipebenchError,
    StuckThreadError,
    error_line,
    exit_leaving_threads,
    report_error,
)
from pipebench.base.tables import markdown_table
from pipebench.config.specs import job_spec_from_config
from pipebench.measure.job import measure
from pipebench.record.jobs import JobIdentity, identity_columns
from pipebench.measure.setup import oversubscription_note, quiet_torch_output
from pipebench.record.results import (
    printed_transform_columns,
    write_invocation_tables,
    write_result,
)
from pipebench.report.summary import write_summary_markdown

__all__ = ["run_one_job"]


def _stop(exc: Union[PipebenchError, OSError], job_dir: Path) -> NoReturn:
    """End the job on a user error or a file it could not write (a full disk): one line, exit 2. An
    OSError that names no file is no file of the job's: it stays a crash, with its traceback."""
    if isinstance(exc, OSError):
        if exc.filename is None:
            raise exc
        report_error(error_line(exc), job_dir)
    else:
        report_error(str(exc), job_dir)
    if isinstance(exc, StuckThreadError):
        exit_leaving_threads(USAGE_EXIT_STATUS)
    raise SystemExit(USAGE_EXIT_STATUS) from None


def run_one_job(cfg: DictConfig) -> None:
    """One job, one folder. User errors, and files it cannot write, exit 2 with one line."""
    hydra_cfg = HydraConfig.get()
    job_dir = Path(hydra_cfg.runtime.output_dir)
    choices = dict(hydra_cfg.runtime.choices)
    name = hydra_cfg.job.override_dirname or "default"
    quiet_torch_output()
    try:
        spec = job_spec_from_config(cfg, choices)
        note = oversubscription_note(spec, usable_cores())
        if note:
            print(note, flush=True)
        measured = measure(spec, job_dir)
    except (PipebenchError, OSError) as exc:
        _stop(exc, job_dir)
    result = measured.identified(JobIdentity(
        job=name, job_num=int(hydra_cfg.job.num), overrides=tuple(hydra_cfg.overrides.task),
        config=OmegaConf.to_container(cfg, resolve=True), choices=choices, columns=identity_columns(spec)))
    try:
        write_result(job_dir, result.to_json())
        write_summary_markdown(job_dir.parent, write_invocation_tables(job_dir.parent))
    except OSError as exc:
        _stop(exc, job_dir)
    print(f"\n## {name}\n")
    print(markdown_table(result.transforms, printed_transform_columns(result.transforms)))
    if result.summary.window_note:
        print(f"note: {result.summary.window_note}")
