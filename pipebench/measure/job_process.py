"""Entry point of one job process started by the pipebench_subprocess launcher.

    python -m pipebench.measure.job_process LAUNCHER_PID TASK_MODULE < pickled JobPayload

It ties its life to the launcher's first (pipebench.base.lifeline) and imports the task
function's module (torch with it: seconds) before it reads its job, so a process started ahead
of its job (pipebench.measure.job_spawn) is ready when the job comes. Then it reads the pickled
job from stdin and runs it through Hydra's own `run_job`, so the job folder, logging and callbacks
are exactly Hydra's. The exit status is the whole answer: 0 done, 2 a user error it has printed
and left in the job folder (pipebench.base.errors.ERROR_FILE), 130 interrupted, anything else a crash.
"""

import importlib
import pickle
import sys
from dataclasses import dataclass
from typing import Any, Optional, Sequence

from hydra.core.singleton import Singleton
from hydra.core.utils import run_job, setup_globals
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig

from pipebench.base.errors import INTERRUPTED_EXIT_STATUS
from pipebench.base.lifeline import die_with_parent, parent_is


@dataclass(frozen=True)
class JobPayload:
    hydra_context: HydraContext
    config: DictConfig
    task_function: TaskFunction
    singleton_state: Any


def main(argv: Optional[Sequence[str]] = None) -> int:
    launcher_pid, task_module = (sys.argv[1:] if argv is None else argv)[:2]
    die_with_parent(parent_is(int(launcher_pid)))
    try:
        importlib.import_module(task_module)
        payload: JobPayload = pickle.load(sys.stdin.buffer)
        setup_globals()
        resolvers = Singleton.get_state()["omegaconf_resolvers"]
        Singleton.set_state({**payload.singleton_state, "omegaconf_resolvers": resolvers})
        job_return = run_job(
            hydra_context=payload.hydra_context,
            task_function=payload.task_function,
            config=payload.config,
            job_dir_key="hydra.sweep.dir",
            job_subdir_key="hydra.sweep.subdir",
        )
        job_return.return_value  # re-raises a crash in the job, with its traceback
    except KeyboardInterrupt:  # only when sent to this process alone: the launcher says so
        return INTERRUPTED_EXIT_STATUS
    return 0


if __name__ == "__main__":
    sys.exit(main())
