"""The job process a sweep's jobs run from, and the one `pipebench run` starts ahead of its first job.

A fresh interpreter costs seconds of imports before it can run a job (2.8 s on the 2-core
machine), so a sweep pays them once: its job process (pipebench.measure.job_process) imports them,
then forks each job into a session of its own and answers with the child's pid and exit status.
Each job still starts from the imports and nothing else: the job process never unpickles or runs
anything of a job, and imports on request only the torchvision and pipebench modules the chains
name (`warm`). `pipebench run` starts it ahead of its own imports and config checks, so the two
import side by side, and builds its jobs for the check in a child of it (sweep.build_check).

Processes are plain pids, not Popen objects: the launcher gets the one started ahead as numbers
(`hydra.launcher.ahead=[pid,stdin,status]`) and owns it from then on. A process still this
process's unreaped child was never run (the launcher reaps its job process), so only that one is
the starter's to end. No side kills a pid it has reaped or closes a descriptor it has handed on; a
job's child stays unreaped, its group killed, so its pid names its group while the launcher may
still kill it.
"""

import os
import signal
from contextlib import suppress
from dataclasses import dataclass
from typing import Any, Iterable, List, Mapping, Optional, Sequence

from pipebench.config.target_node import TargetNode

__all__ = ["JOB_PROCESS_MODULE", "WAITS_UNREAPED", "JobProcess", "discard", "forking_job_process",
           "imported_modules", "kill_group", "read_frame", "read_number", "run_job", "serving", "start_job_process",
           "take", "warm"]

JOB_PROCESS_MODULE = "pipebench.measure.job_process"
# What subprocess.Popen(restore_signals=True) resets in a child: Python ignores SIGPIPE and
# SIGXFSZ, and an exec'd process would inherit that.
RESTORED_SIGNALS = (signal.SIGPIPE, signal.SIGXFSZ)
PROC_FDS = "/proc/self/fd"
# waitid (not on macOS) waits for a child without reaping it, and tells this process's unreaped
# children from the rest: what keeps a job's pid, and so its group, from reuse before the group is
# killed, and the two owners of a process started ahead apart. Without it, none is started ahead.
WAITS_UNREAPED = hasattr(os, "waitid")
# A job's pickle on the job process's stdin follows its length in this many bytes (big-endian).
FRAME_HEADER_BYTES = 8
# A frame that starts with these bytes is no job: it names modules, one a line, for the job process
# itself to import before the jobs that use them, and gets no answer (`warm`).
IMPORT_FRAME = b"\0import\n"
# The only packages whose modules a job process imports on request: their import runs no user code
# (a user's module is imported in each job's child), and torchvision's costs every job that names
# it 1.6 s on the 2-core machine (torch._dynamo with it).
WARMED_PACKAGES = ("torchvision", "pipebench")


@dataclass(frozen=True)
class JobProcess:
    """A job process waiting for jobs: its pid (its session and process group too), the write end of
    its stdin, and the read end of the pipe it answers on."""

    pid: int
    stdin_fd: int
    status_fd: int


def _inherited_fds(keep: int) -> List[int]:
    """Descriptors above stderr a child would inherit, but `keep`: closed in it, as Popen's close_fds does."""
    try:
        fds = [int(name) for name in os.listdir(PROC_FDS)]
    except OSError:
        return []
    kept = []
    for fd in fds:
        with suppress(OSError):  # the listing's own descriptor, closed by now
            if fd > 2 and fd != keep and os.get_inheritable(fd):
                kept.append(fd)
    return kept


def start_job_process(python: str, launcher_pid: int, warm: str) -> JobProcess:
    """Start a job process in a session of its own that dies with `launcher_pid` and imports `warm`
    (the task function's module) while it waits: its stdin a pipe this process writes, and an
    answer pipe this process reads."""
    read_fd, write_fd = os.pipe()
    answer_read, answer_write = os.pipe()
    os.set_inheritable(answer_write, True)
    actions = [(os.POSIX_SPAWN_DUP2, read_fd, 0), *((os.POSIX_SPAWN_CLOSE, fd) for fd in _inherited_fds(answer_write))]
    try:
        command = [python, "-m", JOB_PROCESS_MODULE, str(launcher_pid), warm, str(answer_write)]
        pid = os.posix_spawnp(python, command, os.environ, file_actions=actions, setsid=True,
                              setsigdef=RESTORED_SIGNALS)
    except BaseException:
        os.close(write_fd)
        os.close(answer_read)
        raise
    finally:
        os.close(read_fd)
        os.close(answer_write)
    return JobProcess(pid, write_fd, answer_read)


def _write_frame(fd: int, payload: bytes) -> None:
    os.write(fd, len(payload).to_bytes(FRAME_HEADER_BYTES, "big"))
    view = memoryview(payload)
    while view:
        view = view[os.write(fd, view):]


def warm(process: JobProcess, nodes: Iterable[Mapping[str, Any]]) -> None:
    """Ask the job process to import, itself, the modules of these config nodes' `_target_`s (a
    job's chain steps and dataset) that belong to WARMED_PACKAGES, so every job forked after starts
    with them. One that has ended is left to the next job's hand-over to tell."""
    targets = [str(TargetNode.of(node).target or "") for node in nodes]
    modules = dict.fromkeys(target.rpartition(".")[0] for target in targets
                            if target.split(".", 1)[0] in WARMED_PACKAGES)
    if not modules:
        return
    with suppress(BrokenPipeError):
        _write_frame(process.stdin_fd, IMPORT_FRAME + "\n".join(modules).encode())


def imported_modules(payload: bytes) -> Optional[List[str]]:
    """The modules an import frame names; None for a job's frame."""
    if not payload.startswith(IMPORT_FRAME):
        return None
    return payload[len(IMPORT_FRAME):].decode().split("\n")


def _read_exactly(fd: int, size: int) -> Optional[bytes]:
    data = bytearray()
    while len(data) < size:
        chunk = os.read(fd, size - len(data))
        if not chunk:
            return None
        data += chunk
    return bytes(data)


def read_frame(fd: int) -> Optional[bytes]:
    """The next job's pickle, or None when the launcher closed the pipe (or died)."""
    header = _read_exactly(fd, FRAME_HEADER_BYTES)
    return None if header is None else _read_exactly(fd, int.from_bytes(header, "big"))


def read_number(fd: int) -> Optional[int]:
    """The next line's number on the answer pipe, or None once the job process has ended."""
    line = b""
    while not line.endswith(b"\n"):
        byte = os.read(fd, 1)
        if not byte:
            return None
        line += byte
    return int(line)


def forking_job_process() -> Optional[int]:
    """The pid of the job process this process was forked from, if it was (a job); else None."""
    parent = os.getppid()
    try:
        with open(f"/proc/{parent}/cmdline", "rb") as cmdline:
            words = cmdline.read().split(b"\0")
    except OSError:  # no /proc (macOS), or the parent is gone
        return None
    return parent if JOB_PROCESS_MODULE.encode() in words else None


def _child_running(pid: int) -> Optional[bool]:
    """True while `pid`, a child of this process, runs; False once it has ended unreaped; None when
    it is no unreaped child of this process (reaped already, or never one)."""
    try:
        return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None
    except ChildProcessError:
        return None


def serving(process: Optional[JobProcess]) -> bool:
    """Whether `process` still runs, so the next job may go to it."""
    return process is not None and bool(_child_running(process.pid))


def take(ahead: Optional[Sequence[int]]) -> Optional[JobProcess]:
    """The process started ahead (`[pid, stdin, status]`), if it is still running and this process's
    child; None otherwise (its starter then ends it)."""
    if not ahead:
        return None
    process = JobProcess(*(int(n) for n in ahead))
    return process if _child_running(process.pid) else None


def kill_group(pgid: int) -> None:
    with suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGKILL)


def _close(fd: int) -> None:
    with suppress(OSError):  # closed already, by an earlier end of the same process
        os.close(fd)


def _end(process: JobProcess, kill: bool = False) -> int:
    """End the job process, its group killed and it reaped; its exit status as Popen gives it.
    Closing its stdin asks it to end after its last job; `kill` ends it at once (an interrupted
    sweep), its job dying with it by the parent-death signal (pipebench.base.lifeline)."""
    _close(process.stdin_fd)
    status = None
    try:
        if kill:
            kill_group(process.pid)
        if WAITS_UNREAPED:
            os.waitid(os.P_PID, process.pid, os.WEXITED | os.WNOWAIT)
        else:
            _, status = os.waitpid(process.pid, 0)
    finally:
        kill_group(process.pid)
        if status is None:
            _, status = os.waitpid(process.pid, 0)
        _close(process.status_fd)
    return os.waitstatus_to_exitcode(status)


def run_job(process: JobProcess, payload: bytes) -> int:
    """Hand the job over and wait for its exit status (minus the signal that killed it). A job
    process that ends instead of answering is reaped, and its own status is the job's. However this
    raises, the job's group (its pid still unreaped) is killed and the job process ended."""
    job = None
    try:
        try:
            _write_frame(process.stdin_fd, payload)
        except BrokenPipeError:  # it died before reading the job; its exit status says how
            return _end(process)
        job = read_number(process.status_fd)
        status = None if job is None else read_number(process.status_fd)
        return _end(process) if status is None else status
    except BaseException:
        if job is not None:
            kill_group(job)
        # With its job killed, the job process reaps it and ends on its closed stdin (no zombie is left
        # to init); before it has named a job, it may still be importing, or forking the one written.
        _end(process, kill=job is None)
        raise


def discard(process: Optional[JobProcess], kill: bool = True) -> None:
    """End a job process still this process's unreaped child: one started ahead that no launcher ran
    (a config error, `--help`, every job already done), or a sweep's at its end (`kill=False`: it
    reaps its last job and exits). One its launcher has reaped already is left alone."""
    if process is None or _child_running(process.pid) is None:
        return
    _end(process, kill=kill)
