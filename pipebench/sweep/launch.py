"""A checked sweep handed to Hydra with pipebench's launcher, in a results folder of its own.

`rounds=N` repeats the whole sweep round-robin, `calibrate=true` times the calibration workload
first, and a finished sweep writes its report. The verbs that measure (`run`, `explore`, `tune`,
`storage-check`) each run their sweeps through `run_command`; `--cfg` and `--info` print a sweep's
jobs through `show_command` and run none.
"""

import logging
import os
import sys
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, List, Optional

import hydra
from hydra.core.config_store import ConfigStore
from hydra.core.plugins import Plugins
from hydra.plugins.launcher import Launcher

from hydra_plugins.pipebench_launcher.subprocess_launcher import SubprocessLauncher
from pipebench.base.command import results_line
from pipebench.base.cores import usable_cores
from pipebench.base.errors import (
    INTERRUPTED_EXIT_STATUS,
    TERMINATED_EXIT_STATUS,
    USAGE_EXIT_STATUS,
    ConfigError,
    PipebenchError,
    SweepIncomplete,
    Terminated,
    error_line,
    report_error,
    stops_unmasked,
)
from pipebench.base.io import with_name
from pipebench.config.compose import CONFIG_MODULE, CONFIG_NAME, HYDRA_VERSION_BASE, config_printer
from pipebench.config.schema import register_schema
from pipebench.config.sweep_axes import expand_auto_workers
from pipebench.measure.job_spawn import JobProcess
from pipebench.record.folder_lock import folder_lock
from pipebench.record.resume import (
    HYDRA_SWEEP_FILE,
    INVOCATION_FILE,
    abandon_new_folder,
    choose_invocation,
    dated,
    ready_for_sweep,
    record_invocation,
)
from pipebench.record.results import CALIBRATION_FILE, SUMMARY_MD, load_job_results
from pipebench.report.writer import print_summary, write_report
from pipebench.sweep.calibrate import calibrate
from pipebench.sweep.expand import expand_sweep, import_from_cwd, label, quote, refuse_hydra_dirs, search_path, \
    sweep_overrides
from pipebench.sweep.job_task import run_job_task
from pipebench.sweep.preflight import preflight

__all__ = ["Into", "Stopped", "run_command", "show_command"]

# The CLI folds the config's sweeper params (suite=nightly) into the command line after the
# rounds sweep; Hydra must not prepend them a second time.
CLEAR_SWEEPER_PARAMS = "hydra.sweeper.params=null"
# Hydra's switch that lets an exception out of its entry point instead of printing a traceback and
# exiting 1 (hydra._internal.utils.run_and_report).
HYDRA_RAISES = "HYDRA_FULL_ERROR"


@dataclass(frozen=True)
class Into:
    """A folder another verb has made and locked for its sweep, so it is never resumed: `epilogue`
    prints the verb's own table after the report (explore's); a `stage` (one of tune's or
    storage-check's parts) writes no report and prints no `results:` line, since its verb reports,
    and raises `Stopped` where it was interrupted; past a `deadline` (time.monotonic's clock) the
    launcher starts no more of its jobs (tune's budget)."""

    folder: Path
    epilogue: Optional[Callable[[Path], None]] = None
    stage: bool = False
    deadline: Optional[float] = None


class Stopped(Exception):
    """A stage was interrupted (Ctrl-C, SIGTERM): its verb stops with the stage's status."""

    def __init__(self, status: int) -> None:
        super().__init__(status)
        self.status = status


@dataclass(frozen=True)
class _Sweep:
    """A checked sweep: its overrides with the rounds, its jobs, the command's own overrides (for
    invocation.json), whether it calibrates first, and `--baseline`'s job."""

    swept: List[str]
    jobs: List[List[str]]
    command: List[str]
    calibrate: bool
    baseline: Optional[str]


def _final_report(invocation_dir: Path, baseline: Optional[str]) -> None:
    """comparison.md/.csv, plots and report.md from the finished jobs, and the table on the terminal."""
    if not load_job_results(invocation_dir):
        return
    try:
        inputs = write_report([str(invocation_dir)], invocation_dir, baseline)
    except ConfigError as exc:  # the baseline job did not finish
        print(f"pipebench: {exc}; speedup against the first job instead", file=sys.stderr)
        inputs = write_report([str(invocation_dir)], invocation_dir, None)
    print("\n## comparison\n")
    print_summary(inputs)
    print(f"every column: {invocation_dir / SUMMARY_MD}")


def _hydra_entry():
    register_schema(ConfigStore.instance())
    # Hydra's plugin scan walks hydra_plugins.__path__, which setuptools' editable finder does not
    # extend, so the launcher is registered here (its import stored its config) unless the scan found
    # it (a regular install, or a clone's folder on the path): the scan runs its module again, and
    # that class is not this one, so registering both listed the launcher twice in --info.
    plugins = Plugins.instance()
    ours = (SubprocessLauncher.__module__, SubprocessLauncher.__qualname__)
    if not any((found.__module__, found.__qualname__) == ours for found in plugins.discover(Launcher)):
        plugins.register(SubprocessLauncher)
    return hydra.main(config_path=f"pkg://{CONFIG_MODULE}", config_name=CONFIG_NAME,
                      version_base=HYDRA_VERSION_BASE)(run_job_task)


@contextmanager
def _hydra_raising() -> Iterator[None]:
    """Hydra's entry point lets exceptions out while the block runs, so a file its sweeper writes (its
    multirun.yaml, on a full disk) reaches pipebench's one line rather than Hydra's traceback."""
    before = os.environ.get(HYDRA_RAISES)
    os.environ[HYDRA_RAISES] = "1"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(HYDRA_RAISES, None)
        else:
            os.environ[HYDRA_RAISES] = before


def _sweep_not_started(invocation_dir: Path, exc: OSError) -> PipebenchError:
    """The one line for a file the sweep's process could not write before any job had a folder (a
    full disk), naming it (a buffered write names none, and the only one there is Hydra's
    multirun.yaml) and the space it met. Then the truncated multirun.yaml and invocation.json are
    removed, so a new folder is left as the run found it (run_command removes it)."""
    line = error_line(exc if exc.filename else with_name(exc, invocation_dir / HYDRA_SWEEP_FILE))
    (invocation_dir / HYDRA_SWEEP_FILE).unlink(missing_ok=True)
    (invocation_dir / INVOCATION_FILE).unlink(missing_ok=True)
    return PipebenchError(line)


def _run_sweep(sweep: _Sweep, into: Into, ahead: Optional[JobProcess]) -> int:
    """Run the checked sweep in `into`'s folder, whose lock the caller holds, then report (unless it
    is a `stage` of another verb's, which reports)."""
    invocation_dir = into.folder
    ready_for_sweep(invocation_dir)
    record_invocation(invocation_dir, sweep.swept, sweep.jobs, sweep.command)
    if sweep.calibrate and not (invocation_dir / CALIBRATION_FILE).is_file():
        ahead = calibrate(invocation_dir, ahead)  # in a child of `ahead`, which then serves the first job
    handed = [] if ahead is None else [f"hydra.launcher.ahead=[{ahead.pid},{ahead.stdin_fd},{ahead.status_fd}]"]
    handed += [] if into.deadline is None else [f"hydra.launcher.deadline={into.deadline!r}"]
    sys.argv = ["pipebench", "--multirun", *sweep.swept, CLEAR_SWEEPER_PARAMS,
                f"hydra.sweep.dir={quote(str(invocation_dir))}", *handed]
    status = 0
    incomplete: List[str] = []
    try:
        with _hydra_raising(), stops_unmasked():
            _hydra_entry()()
    except OSError as exc:  # a full disk: one line; at the sweep's start, no folder left either
        if not any(path.is_dir() for path in invocation_dir.glob("job-*")):
            raise _sweep_not_started(invocation_dir, exc) from None
        report_error(error_line(exc))
        status = USAGE_EXIT_STATUS
    except SweepIncomplete as exc:  # jobs failed; the finished ones are reported all the same
        status, incomplete = exc.code, exc.lines()
    except SystemExit as exc:
        status = exc.code if isinstance(exc.code, int) else 1
    except KeyboardInterrupt:
        print("\npipebench: interrupted; finished jobs are kept", file=sys.stderr)
        status = INTERRUPTED_EXIT_STATUS
    except Terminated:
        print("\npipebench: terminated (SIGTERM); finished jobs are kept", file=sys.stderr)
        status = TERMINATED_EXIT_STATUS
    unwritten = ""
    try:
        if not into.stage:
            _final_report(invocation_dir, sweep.baseline)
        if into.epilogue is not None:
            into.epilogue(invocation_dir)
    except OSError as exc:  # a full disk: the rows are kept, the list and the folder still named
        unwritten = error_line(exc)
    for line in incomplete:
        print(line, file=sys.stderr)
    if unwritten:  # after a failed job, whose own line is above, no second error line
        print(f"pipebench: {'' if status else 'error: '}the tables were not written: {unwritten}", file=sys.stderr)
        status = status or USAGE_EXIT_STATUS
    if not into.stage:
        print(results_line(invocation_dir))
    elif status in (INTERRUPTED_EXIT_STATUS, TERMINATED_EXIT_STATUS):
        raise Stopped(status)
    return status


def run_command(overrides: List[str], config_dir: Optional[str], baseline: Optional[str] = None,
                fresh: bool = False, ahead: Optional[JobProcess] = None, into: Optional[Into] = None) -> int:
    """Check and run a sweep in a folder of its own, locked while it runs (a second run on it stops
    with one line): a new one under results_dir, or the latest unfinished one of the same command
    (unless `fresh`), or `into`'s, which the calling verb has already started and locked. `ahead` is
    a job process started with the command, for the first job to run (its caller ends it if none does)."""
    import_from_cwd()
    refuse_hydra_dirs(overrides)
    overrides = [*search_path(config_dir), *overrides]
    # Expanded here, so the checks below, the label and invocation.json all see the real jobs.
    overrides = expand_auto_workers(overrides, usable_cores())
    swept = sweep_overrides(overrides)
    jobs = expand_sweep(swept)
    checked = preflight(jobs, ahead, baseline)
    first_spec, results_dir = checked[0]
    sweep = _Sweep(swept, jobs, overrides, first_spec.calibrate, baseline)
    if into is not None:
        return _run_sweep(sweep, into, ahead)
    choice = choose_invocation(Path(results_dir), dated(results_dir, label(overrides)), swept, jobs, fresh)
    try:
        with folder_lock(choice.folder):
            if choice.resumed:
                print(f"resuming {choice.folder}: {choice.done} of {choice.total} jobs already done", flush=True)
            return _run_sweep(sweep, Into(choice.folder), ahead)
    except BaseException:
        if not choice.resumed:  # stopped before its sweep was recorded (a full disk): no empty folder left
            abandon_new_folder(choice.folder)
        raise


def show_command(overrides: List[str], config_dir: Optional[str], cfg: Optional[str], resolve: bool,
                 info: Optional[str]) -> int:
    """`--cfg` / `--info`: each job of the sweep printed, none run, no dataset built. `--cfg` composes
    each job (a typo is one line, as in `run`); `--info` is Hydra's own output."""
    if resolve and not cfg:
        raise ConfigError("--resolve goes with --cfg job|hydra|all")
    import_from_cwd()
    overrides = expand_auto_workers([*search_path(config_dir), *overrides], usable_cores())
    jobs = expand_sweep(sweep_overrides(overrides))
    if cfg:
        with config_printer(cfg, resolve) as text:
            shown = [text(job) for job in jobs]  # every job checked before any is printed
        for number, (job, yaml_text) in enumerate(zip(jobs, shown), 1):
            print(f"# job {number}/{len(jobs)}: {' '.join(job)}\n{yaml_text}", end="", flush=True)
    for number, job in enumerate(jobs if info else [], 1):
        print(f"# job {number}/{len(jobs)}: {' '.join(job)}", flush=True)
        sys.argv = ["pipebench", f"--info={info}", *job]
        try:
            _hydra_entry()()
        except SystemExit as exc:  # Hydra's own exit after it printed why
            if exc.code:
                return exc.code if isinstance(exc.code, int) else 1
        finally:  # Hydra's --info adds logging handlers each call: kept, the next job prints once a handler
            for logger in (logging.getLogger(), logging.getLogger("hydra")):
                for handler in logger.handlers[:]:
                    logger.removeHandler(handler)
    return 0
