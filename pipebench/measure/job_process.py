"""Entry point of the job process started by the pipebench_subprocess launcher: a sweep's jobs run from it.

    python -m pipebench.measure.job_process LAUNCHER_PID TASK_MODULE ANSWER_FD < framed JobPayloads

It dies with the launcher (pipebench.base.lifeline) and imports the task function's module and its
`WARM_MODULES` (torch with them: seconds) before it reads a job, so every job of the sweep starts
without those seconds; an import frame names more (pipebench.measure.job_spawn.warm). Each job's
pickle runs in a forked child, in a session of its own, through Hydra's own `run_job` (so the job
folder, logging and callbacks are Hydra's), and this process stays as its imports left it. A
callable payload runs the same way (pipebench.sweep.build_check). It answers on ANSWER_FD with the
child's pid, then its exit status: 0 done, 2 a user error the job printed and left in its folder
(a file it could not write included), 130 interrupted, a negative signal number killed, else a crash.

Hydra's run_job saves .hydra/*.yaml with a plain open(), through a link planted in a shared results
folder and on a full disk with no file named; here they are written atomically (pipebench.base.io).
"""

import importlib
import os
import pickle
import sys
import traceback
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Sequence

import hydra.core.utils
from hydra.core.singleton import Singleton
from hydra.core.utils import run_job, setup_globals
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, OmegaConf

from pipebench.base.errors import (
    CRASH_EXIT_STATUS,
    INTERRUPTED_EXIT_STATUS,
    USAGE_EXIT_STATUS,
    error_line,
    exit_without_teardown,
    report_error,
)
from pipebench.base.io import write_text_atomic
from pipebench.base.lifeline import die_with_parent, parent_is
from pipebench.measure.job_spawn import WAITS_UNREAPED, imported_modules, kill_group, read_frame


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


def run_job_bytes(job: bytes) -> int:
    """Unpickle one job and run it, in the process that will end with it. A callable payload is a
    check run in a job's place (pipebench.sweep.build_check): called, its result the exit status."""
    try:
        payload = pickle.loads(job)
        if callable(payload):
            return payload()
        setup_globals()
        resolvers = Singleton.get_state()["omegaconf_resolvers"]
        Singleton.set_state({**payload.singleton_state, "omegaconf_resolvers": resolvers})
        return run_payload(payload)
    except KeyboardInterrupt:  # only when sent to this process alone: the launcher says so
        return INTERRUPTED_EXIT_STATUS
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else CRASH_EXIT_STATUS)
    except BaseException:
        traceback.print_exc()
        return CRASH_EXIT_STATUS


def _job_child(job: bytes, answer_fd: int, job_process_pid: int) -> None:
    """The forked child: a session of its own, tied to the job process, the job's; never returns."""
    code = CRASH_EXIT_STATUS
    try:
        os.setsid()
        die_with_parent(parent_is(job_process_pid))
        os.close(answer_fd)
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.close(devnull)
        code = run_job_bytes(job)
    finally:
        exit_without_teardown(code)  # a fresh interpreter's exit handlers (multiprocessing's clean-up), no more


def _ended_status(job: int) -> int:
    """Wait for the job's child to end; its exit status as Popen gives it, the child left unreaped
    where waitid can (pipebench.measure.job_spawn)."""
    if not WAITS_UNREAPED:
        return os.waitstatus_to_exitcode(os.waitpid(job, 0)[1])
    ended = os.waitid(os.P_PID, job, os.WEXITED | os.WNOWAIT)
    return ended.si_status if ended.si_code == os.CLD_EXITED else -ended.si_status


def _import_all(modules: Sequence[str]) -> None:
    """Import what the jobs to come will (pipebench.measure.job_spawn.warm); a module that fails
    is left for the job that names it to report."""
    for name in modules:
        with suppress(Exception):
            importlib.import_module(name)


def serve(answer_fd: int) -> int:
    """Run each job read from stdin in a child, one at a time, until the launcher closes the pipe;
    import the modules an import frame names, here."""
    job, me = None, os.getpid()
    while True:
        payload = read_frame(0)
        if job is not None and WAITS_UNREAPED:
            os.waitpid(job, 0)  # the launcher has read its status: its pid may go
            job = None
        if payload is None:
            return 0
        modules = imported_modules(payload)
        if modules is not None:
            _import_all(modules)
            continue
        job = os.fork()
        if job == 0:
            _job_child(payload, answer_fd, me)  # not getppid(): if this process died first, that is init
        os.write(answer_fd, f"{job}\n".encode())
        status = _ended_status(job)
        kill_group(job)  # what the job started ends with it
        os.write(answer_fd, f"{status}\n".encode())


def main(argv: Optional[Sequence[str]] = None) -> int:
    launcher_pid, task_module, answer_fd = (sys.argv[1:] if argv is None else argv)[:3]
    die_with_parent(parent_is(int(launcher_pid)))
    try:
        module = importlib.import_module(task_module)
        for name in getattr(module, "WARM_MODULES", ()):  # what its jobs import, before the first job
            importlib.import_module(name)
        return serve(int(answer_fd))
    except KeyboardInterrupt:  # only when sent to this process alone: the launcher says so
        return INTERRUPTED_EXIT_STATUS


if __name__ == "__main__":
    exit_without_teardown(main())
