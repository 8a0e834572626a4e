"""User-facing errors: each one becomes a single line on stderr and exit status 2.

Stopping from outside is no error but ends the same way, in one line: Ctrl-C exits 130 and
SIGTERM 143 (128 + the signal's number, as shells report a process a signal ended).
"""

import atexit
import errno
import logging
import os
import re
import shutil
import sys
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, List, Optional, Tuple

from pipebench.base.io import write_text_atomic

# Exit status for a user mistake (bad config, bad data), as argparse uses.
USAGE_EXIT_STATUS = 2
# Every one-line error starts so; the Python API reads the lines back by it.
ERROR_PREFIX = "pipebench: error: "
# A job's user error, one line, beside where its result.json would be; the launcher reads it
# back to list the failed jobs when the sweep ends.
ERROR_FILE = "error.txt"
# Exit status of a sweep with a job that crashed or was killed, rather than one the user can fix.
CRASH_EXIT_STATUS = 1
INTERRUPTED_EXIT_STATUS = 128 + 2
TERMINATED_EXIT_STATUS = 128 + 15


class PipebenchError(Exception):
    """A problem the user can fix; printed as one line, never as a traceback."""


class ConfigError(PipebenchError):
    """A config key is unknown, missing or holds an impossible value."""


class DatasetError(PipebenchError):
    """A dataset cannot be built: missing path, no images, unreadable corpus."""


class SampleError(PipebenchError):
    """A sample failed to load or transform and the error policy is `fail`."""


class BatchStepError(PipebenchError):
    """A step on a whole batch after the copy (transform.on_device) failed: a corrupt JPEG that the
    GPU decode meets, say. No policy can drop one sample there, so the job stops with one line."""


class WorkerError(PipebenchError):
    """A DataLoader worker died or stayed silent past loader.timeout_s."""


class StuckThreadError(WorkerError):
    """A thread backend's worker thread gave no batch within loader.timeout_s. A thread cannot be
    killed, so the process that holds it ends without waiting for it (`exit_leaving_threads`)."""


# Control characters: a file or folder name, or a value read from a damaged file, may hold a newline.
CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def printable(text: str) -> str:
    """`text` with control characters escaped (a newline shows as \\n), so it stays one line."""
    return CONTROL.sub(lambda found: repr(found.group())[1:-1], text)


def warn(message: str) -> None:
    """One line on stderr about something pipebench works around (a damaged file it will not use)."""
    print(f"pipebench: {printable(message)}", file=sys.stderr, flush=True)


# A write refused for want of space (a full disk, a used-up quota): its line says how much the folder had.
NO_SPACE = (errno.ENOSPC, errno.EDQUOT)
SIZE_UNITS = ("B", "KiB", "MiB", "GiB", "TiB")


def _size(count: float) -> str:
    """A byte count as a person reads it: 0 B, 12.0 KiB, 3.5 GiB."""
    unit = 0
    while count >= 1024 and unit < len(SIZE_UNITS) - 1:
        count, unit = count / 1024, unit + 1
    return f"{count:.0f} B" if unit == 0 else f"{count:.1f} {SIZE_UNITS[unit]}"


def space_left(path: str) -> str:
    """How much space the folder of `path` has, as ` (0 B free of 4.0 MiB in FOLDER)`; '' if unknown.
    A folder removed since (a run that could not start leaves none) is measured at its nearest parent."""
    folder = os.path.dirname(path) or "."
    measured = Path(folder)
    while not measured.exists() and measured != measured.parent:
        measured = measured.parent
    try:
        usage = shutil.disk_usage(measured)
    except OSError:
        return ""
    return f" ({_size(usage.free)} free of {_size(usage.total)} in {folder})"


def error_line(exc: Exception) -> str:
    """A user-facing error as one line; an OSError (read-only folder, a file where a folder belongs)
    names its file(s) and what the system said, and a full disk how much space the folder had."""
    if isinstance(exc, OSError) and exc.strerror:
        names = " -> ".join(str(name) for name in (exc.filename, exc.filename2) if name is not None)
        line = f"{names}: {exc.strerror}" if names else exc.strerror
        if exc.errno in NO_SPACE and exc.filename is not None:
            line += space_left(str(exc.filename))
        return printable(line)
    return printable(str(exc))


class StepTimeoutError(PipebenchError):
    """A step in the main process (a transform at workers=0, a consumer step) ran past run.step_timeout_s."""


class Terminated(BaseException):
    """SIGTERM reached pipebench. It unwinds like Ctrl-C's KeyboardInterrupt, so no `except
    Exception` stops it and every `finally` (the job's process group kill) runs."""


def _stop_behind(exc: BaseException) -> Optional[BaseException]:
    """The Ctrl-C or SIGTERM in `exc`'s chain of causes and contexts, if one is there."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, (KeyboardInterrupt, Terminated)):
            return exc
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return None


@contextmanager
def stops_unmasked() -> Iterator[None]:
    """Within the block, an error raised while a Ctrl-C or SIGTERM unwinds is the stop again. A
    library's own clean-up can fail on the half-built state the signal left (omegaconf resets a flag
    on a node it had not finished building) and raise an error of its own, the stop only its context:
    the user pressed Ctrl-C and must read the one line, not that traceback."""
    try:
        yield
    except Exception as exc:
        stop = _stop_behind(exc)
        if stop is None:
            raise
        raise stop from None


@dataclass(frozen=True)
class JobFailure:
    """A job that did not finish: `job` names it (`2/3 workers=1`), `reason` says why in one line."""

    job: str
    reason: str
    # The job named a mistake the user can fix (it exited with USAGE_EXIT_STATUS).
    user_error: bool


class SweepIncomplete(SystemExit):
    """Jobs failed, and with run.on_job_error=stop the rest did not run. The exit status is 2 when
    every failure was a user error its job named, 1 when any job crashed or was killed.

    The launcher raises it and the CLI catches it; it lives here, not in the launcher, because
    Hydra's plugin scan loads the launcher module a second time, with classes of its own.
    """

    def __init__(self, failures: Tuple[JobFailure, ...], not_run: Tuple[str, ...], total: int) -> None:
        super().__init__(USAGE_EXIT_STATUS if all(f.user_error for f in failures) else CRASH_EXIT_STATUS)
        self.failures = failures
        self.not_run = not_run
        self.total = total

    def lines(self) -> List[str]:
        """The closing list: a headline, then one line a job."""
        head = f"pipebench: {len(self.failures)} of {self.total} jobs failed"
        if self.not_run:
            head += f" and {len(self.not_run)} did not run (run.on_job_error=stop)"
        return [f"{head}; the tables hold the jobs that finished, and the same command again retries the rest:",
                *(f"  job {f.job}: {f.reason}" for f in self.failures),
                *(f"  job {job}: not run" for job in self.not_run)]


def report_error(message: str, job_dir: Optional[Path] = None) -> None:
    """The one line on stderr (ERROR_PREFIX and `message`); in a job, also left in the job folder for
    the sweep's closing list when it can be (on a full disk it cannot, and the list points to the line
    instead)."""
    print(f"{ERROR_PREFIX}{message}", file=sys.stderr, flush=True)
    if job_dir is not None:
        with suppress(OSError):
            write_text_atomic(job_dir / ERROR_FILE, f"{message}\n")


def exit_without_teardown(status: int) -> None:
    """End this process with `status` as a normal exit would, its exit handlers run and its output
    flushed, but without tearing its modules down: torch's and matplotlib's teardown took 0.8 s of
    every `pipebench run`'s end on the 2-core VM, and each forked job would pay it again."""
    atexit._run_exitfuncs()  # multiprocessing's and logging's clean-up, temporary folders' finalizers
    _flushed_exit(status)


def exit_leaving_threads(status: int) -> None:
    """End this process now with `status`, its output flushed, without joining its threads: a
    thread stuck in a transform would hold a normal exit forever (Python joins the thread pools'
    threads at exit) or abort it (a daemon thread that wakes during shutdown)."""
    logging.shutdown()
    _flushed_exit(status)


def _flushed_exit(status: int) -> None:
    """os._exit(status) once stdout and stderr are flushed, as far as they still can be."""
    for stream in (sys.stdout, sys.stderr):
        with suppress(OSError, ValueError):  # a reader that went away, a stream already closed
            stream.flush()
    os._exit(status)
