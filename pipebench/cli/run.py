"""The `run` verb: check every job of a sweep up front, then hand it to Hydra with pipebench's launcher.

`pipebench run transform=a,b workers=0,4` needs no `--multirun`: the overrides are parsed with
Hydra's own parser, every job is composed and checked before anything is measured (one-line
errors, exit 2), `rounds=N` repeats the whole sweep round-robin, and `calibrate=true` times the
calibration workload first. `explore` runs its variants through `run_command` too.
"""

import argparse
import hashlib
import logging
import os
import re
from importlib import resources
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator, List, Optional, Sequence, Tuple

import hydra

# BasicSweeper's own expansion, so the jobs checked up front are exactly the jobs Hydra runs.
from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra.core.config_store import ConfigStore
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.plugins import Plugins
from hydra.plugins.launcher import Launcher
from hydra.errors import HydraException

from hydra_plugins.pipebench_launcher.subprocess_launcher import SubprocessLauncher
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
)
from pipebench.base.io import folder_safe, with_name
from pipebench.cli.build_check import check_builds
from pipebench.cli.common_args import (
    add_baseline_job,
    add_config_dir,
    add_fresh,
    add_overrides,
)
from pipebench.cli.job_task import run_job_task
from pipebench.config.compose import (
    CFG_PARTS,
    CONFIG_MODULE,
    CONFIG_NAME,
    HYDRA_VERSION_BASE,
    config_printer,
    job_spec_composer,
    one_line,
    sweep_settings,
)
from pipebench.config.schema import register_schema
from pipebench.config.specs import JobSpec
from pipebench.config.sweep_axes import expand_auto_workers
from pipebench.measure.job_spawn import JobProcess, discard
from pipebench.measure.result import identity_columns
from pipebench.record.folder_lock import folder_lock
from pipebench.record.results import (
    CALIBRATION_FILE,
    SUMMARY_MD,
    load_job_results,
    write_calibration,
)
from pipebench.record.jobs import override_key
from pipebench.record.resume import (
    HYDRA_SWEEP_FILE,
    INVOCATION_FILE,
    abandon_new_folder,
    choose_invocation,
    ready_for_sweep,
    record_invocation,
)
from pipebench.report.comparison import identity, select_job
from pipebench.report.writer import print_summary, write_report

__all__ = ["add_parser", "expand_sweep", "import_from_cwd", "main", "preflight", "refuse_hydra_dirs", "run_command",
           "search_path", "sweep_overrides"]

# Longest label in a results folder name; the full overrides are in every result.json.
MAX_LABEL_CHARS = 60
# A label cut to fit ends with this many hex digits of the whole label's digest, so two sweeps that
# differ only past the cut get different names.
LABEL_DIGEST_CHARS = 8
# Where a label too long to keep whole may be cut: between overrides, a key and its value, the words
# of a name or the values of a list (a "." may sit inside a number).
WORD_BOUNDARY = re.compile(r"[-_+]")
# The rounds sweep goes first: BasicSweeper varies its first list slowest, so every job runs
# once before any job runs again, and drift hits every job alike.
ROUND_SWEEP = "run.round=range(0,{rounds})"
# The CLI folds the config's sweeper params (suite=nightly) into the command line after the
# rounds sweep; Hydra must not prepend them a second time.
CLEAR_SWEEPER_PARAMS = "hydra.sweeper.params=null"
# Where Hydra puts a sweep and its jobs: pipebench sets them (a folder a run under results_dir, its
# jobs job-N, found again on resume), so a user's value would be overridden in silence.
HYDRA_DIR_KEYS = ("hydra.sweep.dir", "hydra.sweep.subdir")
# Keys that describe the whole invocation, so every job of a sweep must agree on them.
INVOCATION_KEYS = ("rounds", "calibrate", "run.on_job_error", "run.stop_at_target", "run.target_accel_util_pct")

# The config groups --help lists first, in the order a user picks them; any other group follows.
GROUP_ORDER = ("dataset", "transform", "loader", "consumer", "run", "suite")


def config_groups_help() -> str:
    """The `groups:` lines of --help, read from the installed config tree, so they list every
    config pipebench ships (a hand list drifted: it named 4 of 6 transforms)."""
    root = resources.files(CONFIG_MODULE)
    found = {group.name: sorted(entry.name.removesuffix(".yaml") for entry in group.iterdir()
                                if entry.name.endswith(".yaml"))
             for group in root.iterdir() if group.is_dir() and not group.name.startswith("_")}
    order = [g for g in GROUP_ORDER if g in found] + sorted(set(found) - set(GROUP_ORDER))
    return "\n".join(f"{'groups:' if i == 0 else '':<8}{group}={'|'.join(found[group])}"
                     for i, group in enumerate(g for g in order if found[g]))


RUN_EPILOG = f"""\
examples:
  pipebench run transform=yuv_mask workers=0            profile the seed chain in one process
  pipebench run transform=yuv_mask,yuv_mask_fast workers=0,2   a 4-job sweep, one table
  pipebench run dataset=image_folder dataset.path=/data/imgs loader.batch_size=64
  pipebench run --config-dir my_conf transform=my_chain  your own configs and transforms
  pipebench run workers=auto loader.batch_size=32,64   0 up to 2x the usable cores, times two batch sizes
  pipebench run --baseline workers=0 workers=0,2,4      speedups against the workers=0 job
  pipebench report results/<folder> [more folders --out merged]   tables and plots again, or merged

{config_groups_help()}
keys:   workers (a number, a list, range(0,9,2) or auto), trace=torch|viztracer|none, results_dir, rounds,
        calibrate, loader.* (batch_size, prefetch_factor, pin_memory, persistent_workers,
        multiprocessing_context=fork|spawn|forkserver, ...), run.*, consumer.*, dataset.*
sweeps: any key takes a comma list, range(start,stop[,step]) or choice(a,b,...)
check:  --cfg job|hydra|all [--resolve], --info [TOPIC]: every job of the sweep printed, none run
resume: re-running the same command resumes its latest unfinished folder (--fresh starts anew)
suites: suite=nightly   the nightly regression sweep (every chain, workers 0 and 2, 5 rounds)
ranks:  distributed.nproc=2   each job on 2 torchrun ranks (DistributedSampler, all-reduce each step);
        distributed.backend=auto|gloo|nccl, dataset=sharded_stream (an IterableDataset sharded by rank)
cluster: --config-dir examples/slurm hydra/launcher=pipebench_slurm   (pip install ".[slurm]")
"""


def _label(overrides: Sequence[str]) -> str:
    """A folder-safe label from the overrides, e.g. `transform-yuv_mask_workers-0+4+8`."""
    parts = []
    for item in overrides:
        key, _, value = item.partition("=")
        if key.startswith(("hydra.", "results_dir")):
            continue
        parts.append(folder_safe(f"{key.split('.')[-1].lstrip('+~')}-{value.replace(',', '+')}"))
    label = "_".join(parts)
    return _cut_label(label) if len(label) > MAX_LABEL_CHARS else label or "default"


def _cut_label(label: str) -> str:
    """`label` cut to fit MAX_LABEL_CHARS at its last word boundary, never inside a word or a number,
    then the whole label's digest, so names cut alike stay apart."""
    room = MAX_LABEL_CHARS - LABEL_DIGEST_CHARS - 1
    cuts = [m.start() for m in WORD_BOUNDARY.finditer(label[:room + 1]) if m.start() > 0]
    kept = label[:max(cuts)] if cuts else label[:room]
    return f"{kept}_{hashlib.sha1(label.encode()).hexdigest()[:LABEL_DIGEST_CHARS]}"


def _quote(value: str) -> str:
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def expand_sweep(overrides: Sequence[str]) -> List[List[str]]:
    """Every job's overrides, expanded the way Hydra's BasicSweeper does (comma lists, range, choice)."""
    try:
        parsed = OverridesParser.create().parse_overrides(list(overrides))
        return BasicSweeper.split_arguments(parsed, None)[0]
    except HydraException as exc:
        raise ConfigError(one_line(exc)) from exc


def sweep_overrides(overrides: Sequence[str]) -> List[str]:
    """The whole sweep as overrides: the rounds sweep, then the config's sweeper params, then the user's.

    The order mirrors BasicSweeper (its params before the command line; a later override of
    the same key replaces the values in place), so `expand_sweep` of the result is exactly
    the list of jobs that will run, suite=nightly included.
    """
    settings = sweep_settings(expand_sweep(overrides)[0])
    rounds = [ROUND_SWEEP.format(rounds=settings.rounds)] if settings.rounds > 1 else []
    return [*rounds, *settings.params, *overrides]


def _spec_value(spec: JobSpec, key: str) -> object:
    """The value of a dotted config key (`run.on_job_error`) in a spec."""
    value: object = spec
    for part in key.split("."):
        value = getattr(value, part)
    return value


def refuse_hydra_dirs(overrides: Sequence[str]) -> None:
    """A ConfigError naming results_dir for an override of where Hydra puts the sweep or its jobs."""
    for item in overrides:
        if override_key(item) in HYDRA_DIR_KEYS:
            raise ConfigError(f"{override_key(item)} is set by pipebench (each run gets a folder of its own "
                              "under results_dir, its jobs in job-N, so the same command resumes it); "
                              "pass results_dir=DIR to choose where results go")


def _check_invocation_keys(checked: Sequence[Tuple[JobSpec, str]]) -> None:
    for key in INVOCATION_KEYS:
        values = {_spec_value(spec, key) for spec, _ in checked}
        if len(values) > 1:
            raise ConfigError(f"{key} applies to the whole invocation and cannot be swept, got {sorted(values)}")


def _check_baseline(selector: Optional[str], jobs: Sequence[Sequence[str]],
                    checked: Sequence[Tuple[JobSpec, str]]) -> None:
    """`--baseline` must name exactly one job of the sweep (its rounds together) before anything runs."""
    if selector is None:
        return
    named: List[dict] = []
    for job, (spec, _) in zip(jobs, checked):
        names = identity(job, identity_columns(spec))
        if names not in named:
            named.append(names)
    select_job(selector, named)


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


def _calibrate(invocation_dir: Path) -> None:
    # Imported here: the workload's torchvision and scipy cost a sweep without calibrate=true seconds.
    from pipebench.measure.calibration import run_calibration

    print("calibration: timing the fixed decode + transform workload", flush=True)
    calibration = run_calibration()
    path = write_calibration(invocation_dir, calibration)
    print(f"calibration: {calibration.score_s * 1000:.1f} ms a repetition (median) -> {path}", flush=True)


def preflight(jobs: Sequence[Sequence[str]], ahead: Optional[JobProcess] = None,
              baseline: Optional[str] = None) -> List[Tuple[JobSpec, str]]:
    """Compose and check every job, and build each distinct dataset once (in a child of `ahead`
    when it serves: pipebench.cli.build_check), before measuring anything.

    Returns each job's spec with its results_dir.
    """
    with job_spec_composer() as compose_one:
        checked = [compose_one(job) for job in jobs]
    # What the configs alone show first: one line at once, not after the builds' seconds.
    _check_invocation_keys(checked)
    _check_baseline(baseline, jobs, checked)
    check_builds([spec for spec, _ in checked], ahead)
    return checked


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


def import_from_cwd() -> None:
    """User modules named by `_target_` resolve from the working directory, as with `python -m`."""
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())


def search_path(config_dir: Optional[str]) -> List[str]:
    """A `hydra.searchpath` override for the user's --config-dir, or none. Nothing pipebench stored
    ever goes on the search path: explore's variants reach Hydra through its ConfigStore."""
    if config_dir is None:
        return []
    if not Path(config_dir).is_dir():
        raise ConfigError(f"--config-dir {config_dir}: no such directory")
    return [f"hydra.searchpath=[{_quote('file://' + str(Path(config_dir).resolve()))}]"]


# Hydra's switch that lets an exception out of its entry point instead of printing a traceback and
# exiting 1 (hydra._internal.utils.run_and_report).
HYDRA_RAISES = "HYDRA_FULL_ERROR"


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


def _any_job(invocation_dir: Path) -> bool:
    return any(path.is_dir() for path in invocation_dir.glob("job-*"))


def _run_sweep(invocation_dir: Path, swept: Sequence[str], jobs: Sequence[Sequence[str]], command: Sequence[str],
               calibrate: bool, baseline: Optional[str], epilogue: Optional[Callable[[Path], None]],
               ahead: Optional[JobProcess], stage: bool = False) -> int:
    """Run the checked sweep in invocation_dir, whose lock the caller holds, then report (unless it
    is a `stage` of another verb's, which reports)."""
    ready_for_sweep(invocation_dir)
    record_invocation(invocation_dir, swept, jobs, command)
    if calibrate and not (invocation_dir / CALIBRATION_FILE).is_file():
        # The calibration is timed: no process started ahead may still be importing beside it.
        discard(ahead)
        ahead = None
        _calibrate(invocation_dir)
    handed = [] if ahead is None else [f"hydra.launcher.ahead=[{ahead.pid},{ahead.stdin_fd},{ahead.status_fd}]"]
    sys.argv = ["pipebench", "--multirun", *swept, CLEAR_SWEEPER_PARAMS,
                f"hydra.sweep.dir={_quote(str(invocation_dir))}", *handed]
    status = 0
    incomplete: List[str] = []
    try:
        with _hydra_raising():
            _hydra_entry()()
    except OSError as exc:  # a full disk: one line; at the sweep's start, no folder left either
        if not _any_job(invocation_dir):
            raise _sweep_not_started(invocation_dir, exc) from None
        print(f"pipebench: error: {error_line(exc)}", file=sys.stderr)
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
        if not stage:
            _final_report(invocation_dir, baseline)
        if epilogue is not None:
            epilogue(invocation_dir)
    except OSError as exc:  # a full disk: the rows are kept, the list and the folder still named
        unwritten = error_line(exc)
    for line in incomplete:
        print(line, file=sys.stderr)
    if unwritten:  # after a failed job, whose own line is above, no second error line
        print(f"pipebench: {'' if status else 'error: '}the tables were not written: {unwritten}", file=sys.stderr)
        status = status or USAGE_EXIT_STATUS
    if not stage:
        print(f"results: {invocation_dir}")
    return status


def run_command(overrides: List[str], config_dir: Optional[str], baseline: Optional[str] = None,
                fresh: bool = False, invocation_dir: Optional[Path] = None,
                epilogue: Optional[Callable[[Path], None]] = None, ahead: Optional[JobProcess] = None,
                stage: bool = False) -> int:
    """Check and run a sweep in a folder of its own, locked while it runs (a second run on it stops
    with one line). `explore` names the folder it has already started and locked (so it is never
    resumed), and prints its own table after the report (`epilogue`). `ahead` is a job process
    started with the command, for the first job to run (its caller ends it if none does). A `stage`
    (one of `tune`'s rounds, in a folder it names) writes no report and prints no `results:` line:
    the verb that runs it reports."""
    import_from_cwd()
    refuse_hydra_dirs(overrides)
    overrides = [*search_path(config_dir), *overrides]
    # Expanded here, so the checks below, the label and invocation.json all see the real jobs.
    overrides = expand_auto_workers(overrides, usable_cores())
    swept = sweep_overrides(overrides)
    jobs = expand_sweep(swept)
    checked = preflight(jobs, ahead, baseline)
    first_spec, results_dir = checked[0]
    if invocation_dir is not None:
        return _run_sweep(invocation_dir, swept, jobs, overrides, first_spec.calibrate, baseline, epilogue, ahead,
                          stage)
    choice = choose_invocation(Path(results_dir),
                               Path(results_dir) / f"{time.strftime('%Y%m%d-%H%M%S')}-{_label(overrides)}",
                               swept, jobs, fresh)
    try:
        with folder_lock(choice.folder):
            if choice.resumed:
                print(f"resuming {choice.folder}: {choice.done} of {choice.total} jobs already done", flush=True)
            return _run_sweep(choice.folder, swept, jobs, overrides, first_spec.calibrate, baseline, epilogue,
                              ahead)
    except BaseException:
        if not choice.resumed:  # stopped before its sweep was recorded (a full disk): no empty folder left
            abandon_new_folder(choice.folder)
        raise


# What `--info` may show: Hydra's own topics, passed to Hydra as they are.
INFO_TOPICS = ("all", "config", "defaults", "defaults-tree", "plugins", "searchpath")


def show_command(overrides: List[str], config_dir: Optional[str], cfg: Optional[str], resolve: bool,
                 info: Optional[str]) -> int:
    """`--cfg` / `--info`: each job of the sweep printed, and none of them run; no dataset is built.

    `--cfg` composes each job (a typo is one line, as in `run`); `--info` is Hydra's own output.
    """
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
        finally:
            _drop_log_handlers()
    return 0


def _drop_log_handlers() -> None:
    """Hydra's --info prints through logging handlers it adds on each call: without dropping them,
    the next job's information would print once a handler."""
    for logger in (logging.getLogger(), logging.getLogger("hydra")):
        for handler in logger.handlers[:]:
            logger.removeHandler(handler)


def add_hydra_flags(parser: argparse.ArgumentParser) -> None:
    """The flags a Hydra user types: --cfg, --resolve and --info print without running; -m and
    --multirun are accepted, since every pipebench run sweeps already."""
    parser.add_argument("--cfg", "-c", choices=CFG_PARTS,
                        help="print each job's composed config (job, hydra or all) and run nothing")
    parser.add_argument("--resolve", action="store_true", help="with --cfg: resolve interpolations first")
    parser.add_argument("--info", "-i", nargs="?", const="all", choices=INFO_TOPICS,
                        help="print Hydra's information for each job (default: all) and run nothing")
    parser.add_argument("--multirun", "-m", action="store_true",
                        help="accepted for Hydra habit: a comma list sweeps with or without it")


def add_parser(verbs: "argparse._SubParsersAction") -> None:
    parser = verbs.add_parser(
        "run", help="run a benchmark job, or a sweep when any override is a comma list",
        description="Run jobs from Hydra overrides. A comma list, range() or choice() sweeps; "
                    "each job runs in a fresh process, one after another.",
        epilog=RUN_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_config_dir(parser)
    add_baseline_job(parser, "job, e.g. workers=0", "job")
    add_fresh(parser, "run")
    add_hydra_flags(parser)
    add_overrides(parser, "transform=yuv_mask workers=0,4,8")


def main(args: argparse.Namespace) -> int:
    if args.cfg or args.info or args.resolve:
        return show_command(list(args.overrides), args.config_dir, args.cfg, args.resolve, args.info)
    return run_command(list(args.overrides), args.config_dir, args.baseline, args.fresh, ahead=args.job_ahead)
