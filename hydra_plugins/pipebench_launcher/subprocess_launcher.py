"""pipebench's default Hydra launcher: each job of a sweep in a process of its own, one at a time.

Each job runs in a child the sweep's job process forks after its imports and nothing else
(pipebench.measure.job_spawn), so page cache, allocator and thread state never leak between jobs,
as in a fresh interpreter, and no job but the first waits for torch's imports;
running them one at a time keeps jobs from competing for the same cores (docs/multirank-and-clusters.md, the launchers table).
Hydra's BasicLauncher runs every job in one process, and submitit_local starts them all at
once, so neither fits a benchmark. Swap in `hydra/launcher=submitit_slurm` for a cluster.

Every process dies with its sweep: each job process runs in a process group of its own, which
this launcher kills on the way out however it leaves (Ctrl-C, SIGTERM, an error), and the job
process and its workers die by the kernel's parent-death signal if `pipebench` is killed
outright (pipebench.base.lifeline). A terminal's Ctrl-C therefore reaches only `pipebench`,
which prints the one line. A job that fails does not end the sweep unless
`run.on_job_error=stop`: a job killed by a signal gets one line naming the job, the signal and
its usual cause, and when the sweep ends `SweepIncomplete` lists every job that did not finish.
pipebench launches a sweep as one batch; under `hydra.sweeper.max_batch_size` a batch with a
failure ends the sweep. With a `deadline` (a time on `time.monotonic`'s clock, which tune's stages
set), no job starts once it has passed: the one running finishes, and the jobs left out are named in
one line, as a sweep that was told when to stop, not one that failed. Under an A/B session's round
gate (pipebench.measure.round_gate), each round's first job waits until the session says go, so
two sides' runs take turns a round at a time.
"""

import logging
import os
import pickle
import signal
import sys
import time
from pathlib import Path
from typing import Callable, List, Optional, Sequence, Tuple

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

from pipebench.base.errors import (
    ERROR_FILE,
    INTERRUPTED_EXIT_STATUS,
    USAGE_EXIT_STATUS,
    JobFailure,
    SweepIncomplete,
    printable,
)
from pipebench.config.schema import register_launcher_config
from pipebench.measure.job_process import JobPayload
from pipebench.measure.job_spawn import JobProcess, discard, run_job, serving, start_job_process, take, warm
from pipebench.measure.round_gate import gate_from_environ
from pipebench.record.resume import drop_links, job_already_done
from pipebench.record.target import reached_target

log = logging.getLogger(__name__)

# What usually sends each signal that ends a job process, for the job's one line.
SIGNAL_CAUSES = {
    signal.SIGKILL: "often the out-of-memory killer; check `dmesg` or `journalctl -k`",
    signal.SIGSEGV: "a crash in native code (a C extension, torch, or a library they load)",
    signal.SIGBUS: "often shared memory (/dev/shm) too small for the batches workers hand over",
    signal.SIGABRT: "native code aborted (a failed assertion in a C or C++ library)",
    signal.SIGTERM: "stopped by another process (a scheduler's time limit, or `kill`)",
    signal.SIGINT: "interrupted",
    signal.SIGXCPU: "a CPU time limit (`ulimit -t`)",
}


# Hydra's plugin scan imports this module; its config node must be stored by then.
register_launcher_config(ConfigStore.instance())


def signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def failure_reason(status: int, job_dir: Path) -> Tuple[str, bool]:
    """Why a job process exited with `status` (negative: the signal that killed it), and whether
    that is a user error the job named itself."""
    if status < 0:
        cause = SIGNAL_CAUSES.get(-status)
        return f"killed by {signal_name(-status)}" + (f": {cause}" if cause else ""), False
    if status == USAGE_EXIT_STATUS:
        try:
            reason = (job_dir / ERROR_FILE).read_text().strip()
        except OSError:
            reason = ""
        return printable(reason) or "a user error (exit status 2; its line is above)", True
    if status == INTERRUPTED_EXIT_STATUS:
        return "interrupted on its own (exit status 130)", False
    return f"exited with status {status}; its output above says why", False


class SubprocessLauncher(Launcher):
    def __init__(self, python: Optional[str] = None, ahead: Optional[List[int]] = None,
                 deadline: Optional[float] = None, clock: Callable[[], float] = time.monotonic) -> None:
        self.python = python or sys.executable
        # No job starts once `clock()` has passed it (module doc); None: no deadline.
        self.deadline = deadline
        self.clock = clock
        # The job process `pipebench run` started before its own imports (pipebench.measure.job_spawn):
        # the first job to run takes it, and the sweep's later jobs run from it too.
        self.ahead = list(ahead) if ahead else None
        self.jobs: Optional[JobProcess] = None
        # The interleaved round (`run.round`) whose jobs `jobs` runs: each round has a job process of
        # its own, so rounds stay independent processes (address layout, hash seed, the imports'
        # heap) and the spread `compare` pools across them is a spread between processes.
        self.jobs_round: Optional[int] = None
        # An A/B session's pacing (pipebench.measure.round_gate): each round starts when the session
        # says, so one run of N rounds takes turns with the other side's. None: no waiting.
        self.gate = gate_from_environ(os.environ)
        self.config: Optional[DictConfig] = None
        self.task_function: Optional[TaskFunction] = None
        self.hydra_context: Optional[HydraContext] = None

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        self.config = config
        self.hydra_context = hydra_context
        self.task_function = task_function

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        """Run the jobs one after another; raise SweepIncomplete at the end if any did not finish.
        The sweep's job process ends with it, however it ends."""
        try:
            return self._launch_jobs(job_overrides, initial_job_idx)
        finally:
            discard(self.jobs, kill=False)  # between jobs it is reading its stdin: it ends at once
            self.jobs = None

    def _launch_jobs(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        assert self.config is not None and self.hydra_context is not None and self.task_function is not None
        setup_globals()
        configure_log(self.config.hydra.hydra_logging, self.config.hydra.verbose)
        sweep_dir = Path(str(self.config.hydra.sweep.dir))
        sweep_dir.mkdir(parents=True, exist_ok=True)
        total = initial_job_idx + len(job_overrides)
        runs: List[JobReturn] = []
        failures: List[JobFailure] = []
        not_run: List[str] = []
        past_deadline: List[str] = []
        stop_at_first = False
        target_met = False
        for offset, overrides in enumerate(job_overrides):
            idx = initial_job_idx + offset
            number, names = f"{idx + 1}/{total}", " ".join(filter_overrides(overrides)) or "defaults"
            job = f"{number} {names}"
            if stop_at_first:
                not_run.append(job)
                continue
            if target_met:  # not a failure: the sweep found what it was asked for
                continue
            sweep_config = self.hydra_context.config_loader.load_sweep_config(self.config, list(overrides))
            with open_dict(sweep_config):
                sweep_config.hydra.job.id = idx
                sweep_config.hydra.job.num = idx
            job_dir = sweep_dir / str(sweep_config.hydra.sweep.subdir)
            # A resumed sweep (pipebench.record.resume) skips the jobs an interrupted run already finished.
            done = job_already_done(job_dir, list(sweep_config.hydra.overrides.task), sweep_config)
            if not done and self.deadline is not None and self.clock() >= self.deadline:
                past_deadline.append(job)  # not a failure: the sweep was told when to stop
                continue
            print(f"[job {number}] {names}{' (already done, skipped)' if done else ''}", flush=True)
            if not done:  # no write of this job's (Hydra's own in-place ones included) goes through a link
                drop_links(job_dir)
            status = 0 if done else self._run_job_process(sweep_config)
            if status != 0:
                reason, user_error = failure_reason(status, job_dir)
                failures.append(JobFailure(job, reason, user_error))
                stop_at_first = sweep_config.run.on_job_error == "stop"
                if not user_error:  # a job that exited 2 has printed its own line
                    then = "stopping the sweep (run.on_job_error=stop)" if stop_at_first else "the sweep goes on"
                    print(f"pipebench: error: job {job}: {reason}; {then}", file=sys.stderr, flush=True)
                continue
            runs.append(JobReturn(overrides=list(overrides), cfg=sweep_config, status=JobStatus.COMPLETED,
                                  _return_value=None))
            if sweep_config.run.stop_at_target:
                target = float(sweep_config.run.target_accel_util_pct)
                reached = reached_target(job_dir, target)
                if reached is not None:
                    target_met = True
                    left = total - idx - 1
                    print(f"[job {number}] accel_util_pct {reached:.1f}% reached run.target_accel_util_pct={target:g}: "
                          f"stopping the sweep ({left} job{'s' if left != 1 else ''} not run; run.stop_at_target)",
                          flush=True)
        if past_deadline:
            print(f"pipebench: the sweep's deadline passed: {len(past_deadline)} job(s) not started: "
                  f"{'; '.join(past_deadline)}", flush=True)
        if failures:
            raise SweepIncomplete(tuple(failures), tuple(not_run), total)
        return runs

    def _run_job_process(self, sweep_config: DictConfig) -> int:
        """Run one job to completion in a process and process group of its own; return its exit status.

        Its results land in its job folder. However this returns or raises, the job's whole
        process group is killed first, so nothing the job started outlives it.
        """
        state = Singleton.get_state()
        # Resolvers are closures that pickle cannot carry; the job process registers Hydra's own.
        del state["omegaconf_resolvers"]
        payload = pickle.dumps(JobPayload(self.hydra_context, sweep_config, self.task_function, state))
        job_round = int(sweep_config.run.round)
        if self.gate is not None and job_round != self.jobs_round:
            self.gate.enter(job_round)  # before the round's job process starts: its imports are the round's
        if self.jobs is not None and (job_round != self.jobs_round or not serving(self.jobs)):
            # The last round's (between jobs it ends at once), or one that ended on its own (killed,
            # or its imports failed): reaped now.
            discard(self.jobs, kill=False)
            self.jobs = None
        if self.jobs is None:
            self.jobs, self.ahead = take(self.ahead), None
            if self.jobs is None:
                self.jobs = start_job_process(self.python, os.getpid(), self.task_function.__module__)
                warm(self.jobs, (*sweep_config.transform.per_sample, *sweep_config.transform.per_batch,
                                 sweep_config.dataset))
            self.jobs_round = job_round
        try:
            return run_job(self.jobs, payload)
        except BaseException:
            self.jobs = None  # run_job ended it
            raise
