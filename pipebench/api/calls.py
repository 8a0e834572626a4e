"""pipebench from Python: `run`, `load` and `compare`, for a notebook cell or a pytest gate.

`run` starts the `pipebench run` command in a child process, as pyperf's Runner starts its workers,
rather than running Hydra in the caller's: the caller's working directory, `sys.argv`, logging,
signal handlers and Hydra's global state stay as they were, and each job still runs in a process of
its own with the same sweeps, checks and results folder as the CLI. A mistake the CLI prints as one
line and exit status 2 raises `PipebenchError` with that line; nothing here calls `sys.exit`.
"""

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import IO, List, Optional, Sequence, Tuple, Union

from pipebench.base.command import CLI_MODULE, results_folder
from pipebench.base.errors import ERROR_PREFIX, INTERRUPTED_EXIT_STATUS, PipebenchError
from pipebench.record.jobs import JobResult
from pipebench.record.results import load_job_results
from pipebench.regress.compare import (
    DEFAULT_THRESHOLD,
    Comparison,
    Run,
    checked_comparison,
    load_run,
    run_of_records,
)

__all__ = ["JobFailures", "RunResults", "compare", "load", "run"]

# How long an interrupted child may take to keep its finished jobs and exit, before it is killed.
INTERRUPT_GRACE_S = 30.0


class RunResults(List[JobResult]):
    """The finished jobs of one `run`, in job order, as the one result type, and the folder they were
    written to."""

    def __init__(self, records: Sequence[JobResult], folder: Path) -> None:
        super().__init__(records)
        self.folder = folder


class JobFailures(PipebenchError):
    """Some jobs of a sweep failed; `results` holds the ones that finished (results are never lost)."""

    def __init__(self, message: str, results: RunResults) -> None:
        super().__init__(message)
        self.results = results


def _echo(stream: IO[str], out: Optional[IO[str]], keep: List[str]) -> None:
    for line in stream:
        keep.append(line.rstrip("\n"))
        if out is not None:
            out.write(line)
            out.flush()


def _command(args: Sequence[str], quiet: bool) -> Tuple[int, Optional[Path], List[str]]:
    """Run `pipebench ARGS` in a child process and wait: its exit status, the results folder it named
    and its error lines. Ctrl-C in the caller stops the child as the terminal's Ctrl-C would (its
    finished jobs are kept) and is raised again here."""
    child = subprocess.Popen([sys.executable, "-m", CLI_MODULE, *args], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, bufsize=1)
    out_lines: List[str] = []
    err_lines: List[str] = []
    streams = ((child.stdout, sys.stdout, out_lines), (child.stderr, sys.stderr, err_lines))
    readers = [threading.Thread(target=_echo, args=(stream, None if quiet else out, keep), daemon=True)
               for stream, out, keep in streams]
    for reader in readers:
        reader.start()
    try:
        status = child.wait()
    except KeyboardInterrupt:
        child.send_signal(signal.SIGINT)
        try:
            child.wait(INTERRUPT_GRACE_S)
        except subprocess.TimeoutExpired:
            child.kill()
        raise
    finally:
        for reader in readers:
            reader.join()
    errors = [line[len(ERROR_PREFIX):] for line in err_lines if line.startswith(ERROR_PREFIX)]
    return status, results_folder(out_lines), errors


def run(overrides: Sequence[str], *, config_dir: Optional[Union[str, Path]] = None, fresh: bool = False,
        quiet: bool = False) -> RunResults:
    """Run a job or a sweep as `pipebench run OVERRIDES` does and return its finished jobs.

    Raises `PipebenchError` with the CLI's one line for a bad override or a bad dataset,
    `JobFailures` (holding the finished jobs) when some jobs failed, and KeyboardInterrupt when the
    run was stopped. `quiet` keeps the command's output (tables, notes, progress) off the console.
    """
    args = ["run", *([f"--config-dir={os.fspath(config_dir)}"] if config_dir is not None else []),
            *(["--fresh"] if fresh else []), *overrides]
    status, folder, errors = _command(args, quiet)
    if status == INTERRUPTED_EXIT_STATUS:
        raise KeyboardInterrupt(f"pipebench run was interrupted; finished jobs are kept in {folder}")
    if folder is None:
        raise PipebenchError(errors[-1] if errors
                             else f"pipebench run exited with status {status} and named no results folder")
    results = RunResults(load_job_results(folder), folder)
    if status:
        failed = "; ".join(errors) or f"pipebench run exited with status {status}"
        raise JobFailures(f"{failed} ({len(results)} finished jobs kept in {folder})", results)
    return results


def load(folder: Union[str, Path]) -> RunResults:
    """The finished jobs of a results folder, as `run` returns them."""
    path = Path(folder)
    if not path.is_dir():
        raise PipebenchError(f"{path}: no such results folder")
    return RunResults(load_job_results(path), path)


def _side(side: Union[str, Path, RunResults]) -> Run:
    if isinstance(side, RunResults):
        return run_of_records(side.folder, side)
    return load_run(os.fspath(side))


def compare(base: Union[str, Path, RunResults], new: Union[str, Path, RunResults], *,
            threshold: float = DEFAULT_THRESHOLD, allow_mismatch: bool = False) -> Comparison:
    """Judge `new` against `base` (results folders, or what `run` or `load` returned) as
    `pipebench compare` does; `.verdict` is the whole comparison's word, `.jobs` each job's.

    Raises CompareError, as the CLI refuses, when no job is in common or the fingerprints differ.
    """
    return checked_comparison(_side(base), _side(new), threshold, allow_mismatch)
