"""The `pipebench` command: verbs on top, Hydra overrides underneath.

`pipebench run transform=a,b workers=0,4` needs no `--multirun`: the CLI parses the overrides
with Hydra's own parser, checks every job of the sweep up front (one-line errors, exit 2,
before anything is measured), then hands the sweep to Hydra with pipebench's launcher.
`rounds=N` repeats the whole sweep round-robin, and `calibrate=true` times the calibration
workload first; `pipebench baseline update` stores a results folder as a nightly baseline.
`pipebench explore transform=NAME` generates a chain's variants and measures them in one sweep.
"""

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Callable, List, Optional, Sequence, Tuple

import hydra
# BasicSweeper's own expansion, so the jobs checked up front are exactly the jobs Hydra runs.
from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.config_store import ConfigStore
from hydra.errors import HydraException

from pipebench.baseline import BASELINES_DIR, DEFAULT_BASELINE_NAME, update_baseline
from pipebench.build import build_dataset, build_transforms
from pipebench.calibration import run_calibration, write_calibration
from pipebench.compare import DEFAULT_THRESHOLD, compare_main
from pipebench.comparison import identity, select_job
from pipebench.configs import (CONFIG_MODULE, CONFIG_NAME, HYDRA_VERSION_BASE, job_spec_composer, one_line,
                               sweep_settings)
from pipebench.errors import USAGE_EXIT_STATUS, ConfigError, PipebenchError
from pipebench.fingerprint import usable_cores
from pipebench.explore import EXPLORE_DEFAULTS, NoVariants, plan_exploration, write_explore_table
from pipebench.job import run_job_task
from pipebench.job_process import INTERRUPTED_EXIT_STATUS
from pipebench.report import print_summary, report_main, write_report
from pipebench.results import CALIBRATION_FILE, SUMMARY_MD, folder_safe, load_job_results
from pipebench.resume import choose_invocation, record_invocation
from pipebench.schema import register_schema
from pipebench.specs import JobSpec
from pipebench.sweep_axes import expand_auto_workers

# Longest label in a results folder name; the full overrides are in every result.json.
MAX_LABEL_CHARS = 60
# The rounds sweep goes first: BasicSweeper varies its first list slowest, so every job runs
# once before any job runs again, and drift hits every job alike.
ROUND_SWEEP = "run.round=range(0,{rounds})"
# The CLI folds the config's sweeper params (suite=nightly) into the command line after the
# rounds sweep; Hydra must not prepend them a second time.
CLEAR_SWEEPER_PARAMS = "hydra.sweeper.params=null"
# Keys that describe the whole invocation, so every job of a sweep must agree on them.
INVOCATION_KEYS = ("rounds", "calibrate")

RUN_EPILOG = """\
examples:
  pipebench run transform=yuv_mask workers=0            profile the seed chain in one process
  pipebench run transform=yuv_mask,yuv_mask_fast workers=0,2   a 4-job sweep, one table
  pipebench run dataset=image_folder dataset.path=/data/imgs loader.batch_size=64
  pipebench run --config-dir my_conf transform=my_chain  your own configs and transforms
  pipebench run workers=auto loader.batch_size=32,64   0 up to 2x the usable cores, times two batch sizes
  pipebench run --baseline workers=0 workers=0,2,4      speedups against the workers=0 job
  pipebench report results/<folder> [more folders --out merged]   tables and plots again, or merged

groups: dataset=synthetic_jpeg|image_folder|random_tensors|sharded_stream
        transform=yuv_mask|yuv_mask_fast|yuv_mask_crop_first|yuv_mask_batched
        loader=default|seed  run=default|quick
        consumer=emulated|none|toy_cnn|masked_loss_sync|masked_loss_fixed
keys:   workers (a number, a list, range(0,9,2) or auto), trace=torch|viztracer|none, results_dir, rounds,
        calibrate, loader.* (batch_size, prefetch_factor, pin_memory, persistent_workers,
        multiprocessing_context=fork|spawn|forkserver, ...), run.*, consumer.*, dataset.*
sweeps: any key takes a comma list, range(start,stop[,step]) or choice(a,b,...)
resume: re-running the same command resumes its latest unfinished folder (--fresh starts anew)
suites: suite=nightly   the nightly regression sweep (every chain, workers 0 and 2, 5 rounds)
ranks:  distributed.nproc=2   each job on 2 torchrun ranks (DistributedSampler, all-reduce each step);
        distributed.backend=auto|gloo|nccl, dataset=sharded_stream (an IterableDataset sharded by rank)
cluster: --config-dir examples/slurm hydra/launcher=pipebench_slurm   (pip install ".[slurm]")
"""

EXPLORE_EPILOG = f"""\
examples:
  pipebench explore transform=yuv_mask                  the seed chain's variants at workers=0
  pipebench explore transform=yuv_mask workers=2 rounds=5
  pipebench explore --config-dir my_conf transform=my_chain   your chain; your transforms declare `movement`

moves:  crop_first (a crop ahead of pointwise steps and PIL->tensor), fast (a declared fast_form),
        per_batch (trailing steps with a batch_form into the collate), and their combinations
checks: identical / close (float tolerance) / same distribution (KS test) / not equivalent / fails
writes: variants.json, equivalence.md|csv, variants/transform/*.yaml, explore.md|csv, and what `run` writes
defaults: {' '.join(f"{k}={v}" for k, v in EXPLORE_DEFAULTS)} (interleaved rounds of short jobs), unless given
"""


def _label(overrides: Sequence[str]) -> str:
    """A folder-safe label from the overrides, e.g. `transform-yuv_mask_workers-0+4+8`."""
    parts = []
    for item in overrides:
        key, _, value = item.partition("=")
        if key.startswith(("hydra.", "results_dir")):
            continue
        parts.append(f"{key.split('.')[-1].lstrip('+~')}-{value.replace(',', '+')}")
    label = folder_safe("_".join(parts))[:MAX_LABEL_CHARS]
    return label or "default"


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


def _check_invocation_keys(checked: Sequence[Tuple[JobSpec, str]]) -> None:
    for key in INVOCATION_KEYS:
        values = {getattr(spec, key) for spec, _ in checked}
        if len(values) > 1:
            raise ConfigError(f"{key} applies to the whole invocation and cannot be swept, got {sorted(values)}")


def _check_baseline(selector: Optional[str], jobs: Sequence[Sequence[str]],
                    checked: Sequence[Tuple[JobSpec, str]]) -> None:
    """`--baseline` must name exactly one job of the sweep (its rounds together) before anything runs."""
    if selector is None:
        return
    named: List[dict] = []
    for job, (spec, _) in zip(jobs, checked):
        names = identity(job, {"dataset": spec.dataset_name, "transform": spec.transform_name,
                               "workers": spec.workers, "batch_size": spec.loader.batch_size,
                               "consumer": spec.consumer.kind})
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
    invocation_dir.mkdir(parents=True, exist_ok=True)
    print("calibration: timing the fixed decode + transform workload", flush=True)
    calibration = run_calibration()
    path = write_calibration(invocation_dir, calibration)
    print(f"calibration: {calibration.score_s * 1000:.1f} ms a repetition (median) -> {path}", flush=True)


def preflight(jobs: Sequence[Sequence[str]]) -> List[Tuple[JobSpec, str]]:
    """Compose and check every job, and build each distinct dataset once, before measuring anything.

    Returns each job's spec with its results_dir.
    """
    checked = []
    datasets_built = set()
    with job_spec_composer() as compose_one:
        for job in jobs:
            spec, results_dir = compose_one(job)
            build_transforms(spec.per_sample, "transform.per_sample")
            build_transforms(spec.per_batch, "transform.per_batch")
            key = repr(sorted(spec.dataset.items())) + f"|{spec.loader.batch_size}|{spec.loader.drop_last}"
            if key not in datasets_built:
                build_dataset(spec)
                datasets_built.add(key)
            checked.append((spec, results_dir))
    return checked


def _hydra_entry():
    register_schema(ConfigStore.instance())
    return hydra.main(config_path=f"pkg://{CONFIG_MODULE}", config_name=CONFIG_NAME,
                      version_base=HYDRA_VERSION_BASE)(run_job_task)


def _import_from_cwd() -> None:
    """User modules named by `_target_` resolve from the working directory, as with `python -m`."""
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())


def _search_path(config_dir: Optional[str], extra: Sequence[Path] = ()) -> List[str]:
    """A `hydra.searchpath` override for the user's --config-dir and any extra config folders, or none."""
    if config_dir is not None and not Path(config_dir).is_dir():
        raise ConfigError(f"--config-dir {config_dir}: no such directory")
    paths = [*([Path(config_dir)] if config_dir is not None else []), *extra]
    if not paths:
        return []
    return [f"hydra.searchpath=[{','.join(_quote('file://' + str(p.resolve())) for p in paths)}]"]


def run_command(overrides: List[str], config_dir: Optional[str], baseline: Optional[str] = None,
                fresh: bool = False, search_paths: Sequence[Path] = (), invocation_dir: Optional[Path] = None,
                epilogue: Optional[Callable[[Path], None]] = None) -> int:
    """Check and run a sweep. `explore` adds config folders, names the folder it has already
    started (so it is never resumed), and prints its own table after the report (`epilogue`)."""
    _import_from_cwd()
    overrides = [*_search_path(config_dir, search_paths), *overrides]
    # Expanded here, so the checks below, the label and invocation.json all see the real jobs.
    overrides = expand_auto_workers(overrides, usable_cores())
    swept = sweep_overrides(overrides)
    jobs = expand_sweep(swept)
    checked = preflight(jobs)
    _check_invocation_keys(checked)
    _check_baseline(baseline, jobs, checked)
    first_spec, results_dir = checked[0]
    if invocation_dir is None:
        choice = choose_invocation(Path(results_dir),
                                   Path(results_dir) / f"{time.strftime('%Y%m%d-%H%M%S')}-{_label(overrides)}",
                                   swept, jobs, fresh)
        invocation_dir = choice.folder
        if choice.resumed:
            print(f"resuming {invocation_dir}: {choice.done} of {choice.total} jobs already done", flush=True)
    record_invocation(invocation_dir, swept, jobs, overrides)
    if first_spec.calibrate and not (invocation_dir / CALIBRATION_FILE).is_file():
        _calibrate(invocation_dir)
    sys.argv = ["pipebench", "--multirun", *swept, CLEAR_SWEEPER_PARAMS,
                f"hydra.sweep.dir={_quote(str(invocation_dir))}"]
    status = 0
    try:
        _hydra_entry()()
    except SystemExit as exc:
        status = exc.code if isinstance(exc.code, int) else 1
    except KeyboardInterrupt:
        print("\npipebench: interrupted; finished jobs are kept", file=sys.stderr)
        status = INTERRUPTED_EXIT_STATUS
    _final_report(invocation_dir, baseline)
    if epilogue is not None:
        epilogue(invocation_dir)
    print(f"results: {invocation_dir}")
    return status


def explore_command(overrides: List[str], config_dir: Optional[str], fresh: bool = False) -> int:
    """Generate the chain's variants, check their equivalence, then measure them all in one sweep."""
    _import_from_cwd()
    plan = plan_exploration(overrides, expand_sweep([*_search_path(config_dir), *overrides])[0], fresh)
    if isinstance(plan, NoVariants):
        print(f"pipebench explore: no variants of transform={plan.base}: {'; '.join(plan.reasons)}")
        return 0
    print("".join(f"not applied: {reason}\n" for reason in plan.not_applied), end="")
    measured = [item for item in plan.checked if item.measured]
    if plan.resumed is not None:
        print(f"resuming {plan.invocation_dir}: {plan.resumed.done} of {plan.resumed.total} jobs already done",
              flush=True)
    print(f"explore: measuring {len(measured)} chains, interleaved, in one sweep", flush=True)
    return run_command(list(plan.overrides), config_dir, search_paths=[plan.search_path],
                       invocation_dir=plan.invocation_dir,
                       epilogue=lambda folder: print(f"## explore\n\n{write_explore_table(folder, plan)}"))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="pipebench",
        description="Benchmark PyTorch data-input pipelines: per-transform profiles, throughput, starvation.",
    )
    verbs = parser.add_subparsers(dest="verb", metavar="VERB", required=True)
    run = verbs.add_parser(
        "run", help="run a benchmark job, or a sweep when any override is a comma list",
        description="Run jobs from Hydra overrides. A comma list, range() or choice() sweeps; "
                    "each job runs in a fresh process, one after another.",
        epilog=RUN_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    run.add_argument("--config-dir", "-cd", help="a directory of your own configs, searched after pipebench's")
    run.add_argument("--baseline", metavar="JOB",
                     help="the job speedups are measured against, as KEY=VALUE[,KEY=VALUE] pairs that name one "
                          "job, e.g. workers=0 (default: the first job)")
    run.add_argument("--fresh", action="store_true",
                     help="start a new results folder even if an identical earlier run was interrupted")
    run.add_argument("overrides", nargs="*", help="Hydra overrides, e.g. transform=yuv_mask workers=0,4,8")
    report = verbs.add_parser(
        "report", help="rebuild the comparison table, plots and report.md from saved results; merge folders",
        description="Read every job-*/result.json under each DIR and write comparison.md, comparison.csv, "
                    "the PNG plots and report.md. One row per job (rounds grouped); several folders merge into "
                    "one table, with a host column when they come from different machines.",
    )
    report.add_argument("dirs", nargs="+", metavar="DIR", help="results folders written by `pipebench run`")
    report.add_argument("--out", help="where to write (default: the DIR itself; required with several DIRs)")
    report.add_argument("--baseline", metavar="JOB",
                        help="the job speedups are measured against, as KEY=VALUE[,KEY=VALUE] pairs that name one "
                             "row, e.g. workers=0 or host=ci,workers=0 (default: the first row)")
    explore = verbs.add_parser(
        "explore", help="find a chain's faster variants, check they compute the same thing, measure them all",
        description="Move steps of one transform chain as its transforms declare (crop first, fast forms, "
                    "per-batch forms), check each variant for equivalence with the chain on the same seeds, "
                    "then measure every variant side by side in one interleaved sweep. Other overrides pass "
                    "through as with `run`.",
        epilog=EXPLORE_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    explore.add_argument("--config-dir", "-cd", help="a directory of your own configs, searched after pipebench's")
    explore.add_argument("--fresh", action="store_true",
                         help="start a new results folder even if an identical earlier exploration was interrupted")
    explore.add_argument("overrides", nargs="*", help="Hydra overrides, e.g. transform=yuv_mask workers=2")
    compare = verbs.add_parser(
        "compare", help="compare two results folders; exit 1 on a regression, 2 if they cannot be compared",
        description="Per job: the ratio of samples/s (current / baseline) with a bootstrap interval over the "
                    "repeats and rounds, a Mann-Whitney test, the change in starvation and a verdict. A "
                    "regression must be significant AND larger than --threshold. Ratios are also normalised "
                    "by the calibration workload when both folders have calibration.json.",
    )
    compare.add_argument("baseline", metavar="BASELINE", help="a results folder (or its summary.csv)")
    compare.add_argument("current", metavar="CURRENT", help="a results folder (or its summary.csv)")
    compare.add_argument("--threshold", type=float, default=DEFAULT_THRESHOLD,
                         help=f"smallest relative change that counts (default: {DEFAULT_THRESHOLD})")
    compare.add_argument("--allow-mismatch", action="store_true",
                         help="compare even when torch, CPU, cores, dataset or config differ (the output says so)")
    compare.add_argument("--out", help="also write compare.md and compare.csv into this folder")
    baseline = verbs.add_parser("baseline", help="manage the stored baselines that nightly runs are compared with")
    actions = baseline.add_subparsers(dest="action", metavar="ACTION", required=True)
    update = actions.add_parser(
        "update", help="replace a stored baseline with a results folder",
        description="Copy a results folder's summary.csv, calibration.json and job-*/result.json (no traces) "
                    "into BASELINES_DIR/NAME, replacing what was there. Commit the result deliberately.",
    )
    update.add_argument("results", metavar="RESULTS_DIR", help="an invocation folder written by `pipebench run`")
    update.add_argument("--name", default=DEFAULT_BASELINE_NAME, help=f"baseline name (default: {DEFAULT_BASELINE_NAME})")
    update.add_argument("--baselines-dir", default=BASELINES_DIR, help=f"where baselines live (default: {BASELINES_DIR})")
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.verb == "run":
            return run_command(list(args.overrides), args.config_dir, args.baseline, args.fresh)
        if args.verb == "report":
            return report_main(args.dirs, args.out, args.baseline)
        if args.verb == "explore":
            return explore_command(list(args.overrides), args.config_dir, args.fresh)
        if args.verb == "compare":
            return compare_main(args.baseline, args.current, args.threshold, args.allow_mismatch, args.out)
        if args.verb == "baseline":
            done = update_baseline(Path(args.results), Path(args.baselines_dir), args.name)
            print(f"{'replaced' if done.replaced else 'created'} baseline {done.target} from {args.results}:")
            print("\n".join(f"  {rel}" for rel in done.files))
            print(f"commit {done.target} to make it the baseline that CI compares with")
            return 0
    except PipebenchError as exc:
        print(f"pipebench: error: {exc}", file=sys.stderr)
        return USAGE_EXIT_STATUS
    raise AssertionError(f"unhandled verb {args.verb}")


if __name__ == "__main__":
    sys.exit(main())
