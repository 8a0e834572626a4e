"""A job's guard, the same for the job process and each rank: the step watchdog on every step's own
work (run.step_timeout_s) and DataLoader's worker faults named in one line, entered together.
"""

from contextlib import contextmanager
from typing import Callable, Iterator, Optional

from pipebench.base.errors import WorkerError
from pipebench.base.watchdog import Watchdog
from pipebench.config.specs import JobSpec

__all__ = ["STEP_TIMEOUT_KEY", "job_guard", "worker_error", "worker_faults_named"]

# The setting a step's watchdog enforces, named in its error line.
STEP_TIMEOUT_KEY = "run.step_timeout_s"


def worker_error(exc: RuntimeError, timeout_s: float) -> Optional[WorkerError]:
    """DataLoader's own words for a worker that died, was killed or went silent past `timeout`, as
    one line; None for any other error."""
    text = str(exc)
    if not text.startswith(("DataLoader worker", "DataLoader timed out")):
        return None
    hint = (f"loader.timeout_s={timeout_s:g}" if text.startswith("DataLoader timed out") else
            "a worker that dies without a Python error was often killed for memory: check `dmesg`")
    return WorkerError(f"{text.splitlines()[0].rstrip('. ')} ({hint})")


@contextmanager
def worker_faults_named(timeout_s: float) -> Iterator[None]:
    """A dead or silent worker becomes one WorkerError line wherever the main thread is when torch
    reports it: blocked in next(), or anywhere else, as torch's SIGCHLD handler raises it in the
    middle of whatever runs (a consumer's sleep, a meter, the loop's bookkeeping)."""
    try:
        yield
    except RuntimeError as exc:
        error = worker_error(exc, timeout_s)
        if error is None:
            raise
        raise error from None


@contextmanager
def job_guard(spec: JobSpec, on_stuck: Callable[[str], None]) -> Iterator[Watchdog]:
    """The job's one guard, entered in the main thread: a worker that dies or goes silent, whenever
    it does, ends the job with one WorkerError line; a step whose own work runs past
    run.step_timeout_s, with one StepTimeoutError line (`on_stuck` leaves the line where the job
    looks when the step is stuck in native code). Yields the watchdog the step loops arm."""
    with worker_faults_named(spec.loader.timeout_s), \
            Watchdog(spec.run.step_timeout_s, STEP_TIMEOUT_KEY, on_stuck=on_stuck) as watchdog:
        yield watchdog
