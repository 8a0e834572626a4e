"""pipebench's default Hydra launcher: each job of a sweep in a fresh Python process, one at a time.

Fresh processes keep page cache, allocator and thread state from leaking between jobs;
running them one at a time keeps jobs from competing for the same cores (DESIGN §2).
Hydra's BasicLauncher runs every job in one process, and submitit_local starts them all at
once, so neither fits a benchmark. Swap in `hydra/launcher=submitit_slurm` for a cluster.
"""

import logging
import pickle
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import List, Optional, Sequence

from hydra.core.config_store import ConfigStore
from hydra.core.singleton import Singleton
from hydra.core.utils import (
    JobReturn,
    JobStatus,
    configure_log,
    filter_overrides,
    setup_globals,
)
from hydra.plugins.launcher import Launcher
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, open_dict

from pipebench.measure.job_process import JOB_PROCESS_MODULE, JobPayload
from pipebench.record.resume import job_already_done

log = logging.getLogger(__name__)



@dataclass
class SubprocessLauncherConf:
    _target_: str = "hydra_plugins.pipebench_launcher.subprocess_launcher.SubprocessLauncher"
    # Interpreter for job processes; null means the one running pipebench.
    python: Optional[str] = None


ConfigStore.instance().store(
    group="hydra/launcher", name="pipebench_subprocess", node=SubprocessLauncherConf, provider="pipebench"
)


class JobProcessFailed(SystemExit):
    """A job process exited non-zero; it has already printed its own one-line reason."""


class SubprocessLauncher(Launcher):
    def __init__(self, python: Optional[str] = None) -> None:
        self.python = python or sys.executable
        self.config: Optional[DictConfig] = None
        self.task_function: Optional[TaskFunction] = None
        self.hydra_context: Optional[HydraContext] = None

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        self.config = config
        self.hydra_context = hydra_context
        self.task_function = task_function

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        assert self.config is not None and self.hydra_context is not None and self.task_function is not None
        setup_globals()
        configure_log(self.config.hydra.hydra_logging, self.config.hydra.verbose)
        sweep_dir = Path(str(self.config.hydra.sweep.dir))
        sweep_dir.mkdir(parents=True, exist_ok=True)
        total = initial_job_idx + len(job_overrides)
        runs: List[JobReturn] = []
        for offset, overrides in enumerate(job_overrides):
            idx = initial_job_idx + offset
            sweep_config = self.hydra_context.config_loader.load_sweep_config(self.config, list(overrides))
            with open_dict(sweep_config):
                sweep_config.hydra.job.id = idx
                sweep_config.hydra.job.num = idx
            # A resumed sweep (pipebench.record.resume) skips the jobs an interrupted run already finished.
            done = job_already_done(sweep_dir / str(sweep_config.hydra.sweep.subdir),
                                    list(sweep_config.hydra.overrides.task), sweep_config)
            print(f"[job {idx + 1}/{total}] {' '.join(filter_overrides(overrides)) or 'defaults'}"
                  f"{' (already done, skipped)' if done else ''}", flush=True)
            if not done:
                self._run_in_subprocess(sweep_config)
            runs.append(JobReturn(overrides=list(overrides), cfg=sweep_config, status=JobStatus.COMPLETED,
                                  _return_value=None))
        return runs

    def _run_in_subprocess(self, sweep_config: DictConfig) -> None:
        """Run one job to completion in a new interpreter; its results land in its job folder."""
        state = Singleton.get_state()
        # Resolvers are closures that pickle cannot carry; the job process registers Hydra's own.
        del state["omegaconf_resolvers"]
        payload = JobPayload(self.hydra_context, sweep_config, self.task_function, state)
        status = subprocess.run(
            [self.python, "-m", JOB_PROCESS_MODULE], input=pickle.dumps(payload), check=False
        ).returncode
        if status != 0:
            raise JobProcessFailed(status)
