"""Job processes as the launcher runs them, and the one `pipebench run` starts ahead of its first job.

A job process (pipebench.measure.job_process) costs seconds before it can run anything: Python,
Hydra and torch imports (2.8 s on the 2-core machine). `pipebench run` (and `explore`) spends
about as long on its own imports and config checks before its first job, so it starts that job's
process first: the two import side by side, and the job is handed over on the process's stdin
when its turn comes.

Processes are plain pids here, not Popen objects: the launcher receives the one started ahead as
numbers in its config (`hydra.launcher.ahead=[pid,fd]`) and owns it from then on. Which side ends
it follows from the kernel: a process still this process's unreaped child was never run (the
launcher reaps every job it runs before it returns), so only that one is the starter's to end.
Neither side ever kills a pid it has reaped, or closes a descriptor it has handed on.
"""

import os
import signal
from dataclasses import dataclass
from typing import List, Optional, Sequence

__all__ = ["JOB_PROCESS_MODULE", "WAITS_UNREAPED", "JobProcess", "discard", "job_process_command", "run_job",
           "start_job_process", "take"]

JOB_PROCESS_MODULE = "pipebench.measure.job_process"
# What subprocess.Popen(restore_signals=True) resets in a child: Python ignores SIGPIPE and
# SIGXFSZ, and an exec'd process would inherit that.
RESTORED_SIGNALS = (signal.SIGPIPE, signal.SIGXFSZ)
PROC_FDS = "/proc/self/fd"
# waitid (not on macOS) waits for a child without reaping it, and tells this process's unreaped
# children from the rest: what keeps a job's pid, and so its group, from reuse before the group is
# killed, and the two owners of a process started ahead apart. Without it, none is started ahead.
WAITS_UNREAPED = hasattr(os, "waitid")


@dataclass(frozen=True)
class JobProcess:
    """A job process waiting for its job: its pid (its session and process group too) and the
    write end of its stdin."""

    pid: int
    stdin_fd: int


def job_process_command(python: str, launcher_pid: int, warm: str) -> List[str]:
    """The command line of a job process that dies with `launcher_pid` and imports `warm` (the
    task function's module) while it waits for its job."""
    return [python, "-m", JOB_PROCESS_MODULE, str(launcher_pid), warm]


def _inherited_fds() -> List[int]:
    """Descriptors above stderr a child would inherit: closed in it, as Popen's close_fds does."""
    try:
        fds = [int(name) for name in os.listdir(PROC_FDS)]
    except OSError:
        return []
    kept = []
    for fd in fds:
        try:
            if fd > 2 and os.get_inheritable(fd):
                kept.append(fd)
        except OSError:  # the listing's own descriptor, closed by now
            continue
    return kept


def start_job_process(python: str, launcher_pid: int, warm: str) -> JobProcess:
    """Start a job process in a session of its own, its stdin a pipe this process writes."""
    read_fd, write_fd = os.pipe()
    actions = [(os.POSIX_SPAWN_DUP2, read_fd, 0), *((os.POSIX_SPAWN_CLOSE, fd) for fd in _inherited_fds())]
    try:
        pid = os.posix_spawnp(python, job_process_command(python, launcher_pid, warm), os.environ,
                              file_actions=actions, setsid=True, setsigdef=RESTORED_SIGNALS)
    except BaseException:
        os.close(write_fd)
        raise
    finally:
        os.close(read_fd)
    return JobProcess(pid, write_fd)


def _child_running(pid: int) -> Optional[bool]:
    """True while `pid`, a child of this process, runs; False once it has ended unreaped; None when
    it is no unreaped child of this process (reaped already, or never one)."""
    try:
        return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None
    except ChildProcessError:
        return None


def take(ahead: Optional[Sequence[int]]) -> Optional[JobProcess]:
    """The process started ahead (`[pid, fd]`), if it is still running and this process's child;
    None otherwise (its starter then ends it)."""
    if not ahead:
        return None
    pid, fd = (int(n) for n in ahead)
    return JobProcess(pid, fd) if _child_running(pid) else None


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def run_job(process: JobProcess, payload: bytes) -> int:
    """Hand the job over, wait for the process to end, kill its group, reap it; its exit status
    as Popen gives it (minus the signal that killed it).

    Where it can (`WAITS_UNREAPED`) it waits without reaping, so the pid naming the process group
    cannot be reused before the group is killed; however this returns or raises, nothing the job
    started outlives it.
    """
    status = None
    try:
        try:
            with open(process.stdin_fd, "wb") as stdin:
                stdin.write(payload)
        except BrokenPipeError:  # it died before reading its job; the exit status says how
            pass
        if WAITS_UNREAPED:
            os.waitid(os.P_PID, process.pid, os.WEXITED | os.WNOWAIT)
        else:
            _, status = os.waitpid(process.pid, 0)
    finally:
        _kill_group(process.pid)
        if status is None:
            _, status = os.waitpid(process.pid, 0)
    return os.waitstatus_to_exitcode(status)


def discard(process: Optional[JobProcess]) -> None:
    """End a process started ahead that no launcher ran (a config error, `--help`, every job
    already done); one that was run has been reaped by its launcher and is left alone."""
    if process is None or _child_running(process.pid) is None:
        return
    _kill_group(process.pid)
    os.waitpid(process.pid, 0)
    try:
        os.close(process.stdin_fd)
    except OSError:  # a launcher's run, cut short before its reap, closed it already
        pass
