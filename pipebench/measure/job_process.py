"""Entry point of one job process started by the pipebench_subprocess launcher.

    python -m pipebench.measure.job_process LAUNCHER_PID TASK_MODULE < pickled JobPayload

It ties its life to the launcher's first (pipebench.base.lifeline) and imports the task
function's module (torch with it: seconds) before it reads its job, so a process started ahead
of its job (pipebench.measure.job_spawn) is ready when the job comes. Then it reads the pickled
job from stdin and runs it through Hydra's own `run_job`, so the job folder, logging and callbacks
are exactly Hydra's. The exit status is the whole answer: 0 done, 2 a user error it has printed
and left in the job folder (pipebench.base.errors.ERROR_FILE), a file it could not write (a full
disk) included, 130 interrupted, anything else a crash.

Hydra's run_job saves the job's .hydra/*.yaml with a plain open(): through a link planted in a
shared results folder, and on a full disk with no file named. Here they are written as pipebench
writes every file (pipebench.base.io): a new file renamed over the old name.
"""

import importlib
import pickle
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Sequence

import hydra.core.utils
from hydra.core.singleton import Singleton
from hydra.core.utils import run_job, setup_globals
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, OmegaConf

from pipebench.base.errors import INTERRUPTED_EXIT_STATUS, USAGE_EXIT_STATUS, error_line, report_error
from pipebench.base.io import write_text_atomic
from pipebench.base.lifeline import die_with_parent, parent_is


@dataclass(frozen=True)
class JobPayload:
    hydra_context: HydraContext
    config: DictConfig
    task_function: TaskFunction
    singleton_state: Any


def save_hydra_file(cfg: Any, filename: str, output_dir: Path) -> None:
    """What Hydra's `_save_config` writes (`output_dir/filename`, the config as YAML), written atomically."""
    output_dir.mkdir(parents=True, exist_ok=True)
    write_text_atomic(output_dir / filename, OmegaConf.to_yaml(cfg))


def run_payload(payload: JobPayload) -> int:
    """Run the job through Hydra's run_job. A file it could not write (a full disk, a read-only
    folder) is one line naming it, left in the job folder where it fits, and exit status 2."""
    hydra.core.utils._save_config = save_hydra_file  # run_job looks it up when it runs
    try:
        run_job(
            hydra_context=payload.hydra_context,
            task_function=payload.task_function,
            config=payload.config,
            job_dir_key="hydra.sweep.dir",
            job_subdir_key="hydra.sweep.subdir",
        ).return_value  # re-raises a crash in the job, with its traceback
    except OSError as exc:
        if exc.filename is None:  # no file of the job's: a crash
            raise
        job_dir = OmegaConf.select(payload.config, "hydra.runtime.output_dir")  # run_job sets it first
        report_error(error_line(exc), None if job_dir is None else Path(job_dir))
        return USAGE_EXIT_STATUS
    return 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    launcher_pid, task_module = (sys.argv[1:] if argv is None else argv)[:2]
    die_with_parent(parent_is(int(launcher_pid)))
    try:
        importlib.import_module(task_module)
        payload: JobPayload = pickle.load(sys.stdin.buffer)
        setup_globals()
        resolvers = Singleton.get_state()["omegaconf_resolvers"]
        Singleton.set_state({**payload.singleton_state, "omegaconf_resolvers": resolvers})
        return run_payload(payload)
    except KeyboardInterrupt:  # only when sent to this process alone: the launcher says so
        return INTERRUPTED_EXIT_STATUS


if __name__ == "__main__":
    sys.exit(main())
