"""Entry point of one job process started by the pipebench_subprocess launcher.

It reads the pickled job from stdin and runs it through Hydra's own `run_job`, so the job
folder, logging and callbacks are exactly Hydra's. The exit status is the whole answer.
"""

import pickle
import sys
from dataclasses import dataclass
from typing import Any

from hydra.core.singleton import Singleton
from hydra.core.utils import run_job, setup_globals
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig

JOB_PROCESS_MODULE = "pipebench.measure.job_process"
# Status for Ctrl-C (128 + SIGINT), as shells report it.
INTERRUPTED_EXIT_STATUS = 130


@dataclass(frozen=True)
class JobPayload:
    hydra_context: HydraContext
    config: DictConfig
    task_function: TaskFunction
    singleton_state: Any


def main() -> int:
    payload: JobPayload = pickle.load(sys.stdin.buffer)
    setup_globals()
    resolvers = Singleton.get_state()["omegaconf_resolvers"]
    Singleton.set_state({**payload.singleton_state, "omegaconf_resolvers": resolvers})
    try:
        job_return = run_job(
            hydra_context=payload.hydra_context,
            task_function=payload.task_function,
            config=payload.config,
            job_dir_key="hydra.sweep.dir",
            job_subdir_key="hydra.sweep.subdir",
        )
        job_return.return_value  # re-raises a crash in the job, with its traceback
    except KeyboardInterrupt:
        return INTERRUPTED_EXIT_STATUS
    return 0


if __name__ == "__main__":
    sys.exit(main())
