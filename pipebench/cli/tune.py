"""The `tune` verb: the loader settings for the user's chain, found with statistics within a budget.

In order, each part in a folder of its own under the tune's results folder, each a sweep run as
`pipebench run` runs one (a fresh process a job, interleaved rounds):
1. `probe/`: each chain (the user's and explore's equivalent variants) once at workers=0, the
   thread profile on where a thread backend is in the space: the cost model's inputs (CPU a
   sample, the steps that hold the GIL) and explore's winners among the chains;
2. the space (`pipebench.tune.space`), pruned by the model, each dropped point with its reason,
   then cut to what one round of the budget fits;
3. `race-N/`: the race (`pipebench.tune.race`), stage by stage;
4. the recommendation (`pipebench.tune.recommend`), and `verify/`: it against the current
   settings, interleaved, with compare's verdict.
Then tune.csv, best.yaml, tune.md and tune.png (`pipebench.tune.files`), and `results: <folder>`.
"""

import argparse
import dataclasses
import itertools
import math
import sys
import time
from pathlib import Path
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

import torch

from pipebench.base.cores import usable_cores
from pipebench.base.errors import CRASH_EXIT_STATUS, INTERRUPTED_EXIT_STATUS, TERMINATED_EXIT_STATUS, ConfigError
from pipebench.base.io import folder_safe
from pipebench.cli.common_args import add_config_dir, add_overrides
from pipebench.cli.run import expand_sweep, import_from_cwd, refuse_hydra_dirs, run_command, search_path
from pipebench.config.compose import job_spec_composer
from pipebench.config.specs import NO_CONSUMER, THREADS, JobSpec
from pipebench.explore.equivalence import is_equivalent
from pipebench.explore.plan import NoVariants, check_variants, store_variant
from pipebench.measure.job_spawn import JobProcess
from pipebench.pipeline.build import build_dataset
from pipebench.pipeline.loader_backends import BACKENDS, backend_problem
from pipebench.record.folder_lock import folder_lock
from pipebench.record.jobs import JobRecord, override_key
from pipebench.record.results import load_job_results
from pipebench.record.resume import new_folder
from pipebench.report.diagnosis import chain_costs, needs_for_target, target_line
from pipebench.report.thread_advice import gil_bound_steps
from pipebench.tune.files import Tuned, write_tune
from pipebench.tune.objective import Objective, race_rates, told_apart_rounds
from pipebench.tune.optuna_search import optuna_missing, optuna_proposer
from pipebench.tune.plan import (
    OPTUNA,
    POINT_GROUP,
    TuneOptions,
    current_point,
    dimensions,
    job_overrides,
    point_override,
    round_defaults,
    round_settings,
    split_tune_overrides,
    store_point,
)
from pipebench.tune.race import RaceOutcome, run_race
from pipebench.tune.recommend import recommend, verify_line
from pipebench.tune.space import ChainModel, Dimensions, Point, fit_budget, grid, one_point_note, predicted_rate, prune

__all__ = ["add_parser", "main", "tune_command"]

# A job's seconds besides its measured window, before one has been timed: the process start (its
# imports alone take 2.8 s on the 2-core machine, benchmarks/startup.py), the dataset and warm-up.
ESTIMATED_JOB_START_S = 4.0
# The planted cases are each found within five minutes on the 2-core machine.
DEFAULT_BUDGET_S = 300.0
PROBE_DIR, RACE_DIR, VERIFY_DIR = "probe", "race-{}", "verify"

TUNE_EPILOG = """\
examples:
  pipebench tune transform=yuv_mask                         the seed chain's loader settings, 5 minutes
  pipebench tune --budget-s 900 --target-starvation 10 consumer=toy_cnn   fewest workers keeping the model fed
  pipebench tune --max-pss-gib 8 tune.batch_sizes=[64,128]  a memory cap; the batch size searched too
  pipebench tune tune.search=optuna                          Optuna's TPE picks which points race (the tune extra)

space:  tune.workers=[..] (default 0 up to twice the usable cores), tune.backends=[..] (every installed one),
        tune.prefetch_factors=[2,4], tune.persistent_workers=[false,true], tune.pin_memory (with CUDA only),
        tune.batch_sizes=[..] (only when given), tune.variants=true (explore's equivalent chains, its winners)
race:   tune.rounds=2 a stage, tune.stages=3 (each twice as long), tune.verify_rounds=4
writes: tune.csv, best.yaml, tune.md with tune.png, and probe/, race-N/, verify/ as `run` writes them
"""


class Stopped(Exception):
    """A stage was interrupted (Ctrl-C, SIGTERM): tune stops with the stage's status."""

    def __init__(self, status: int) -> None:
        super().__init__(status)
        self.status = status


def _measure(folder: Path, points: Sequence[Point], rounds: int, base: Sequence[str], run_settings: Sequence[str],
             config_dir: Optional[str], ahead: Optional[JobProcess]) -> Dict[str, List[JobRecord]]:
    """Run the points' jobs, `rounds` interleaved rounds, in `folder`; each point's finished records."""
    for point in points:
        store_point(point)
    sweep = [*base, *run_settings, f"rounds={rounds}", point_override([p.name for p in points])]
    status = run_command(sweep, config_dir, invocation_dir=folder, ahead=ahead, stage=True)
    if status in (INTERRUPTED_EXIT_STATUS, TERMINATED_EXIT_STATUS):
        raise Stopped(status)
    found: Dict[str, List[JobRecord]] = {}
    for record in load_job_results(folder):
        found.setdefault(str(record.choices.get(POINT_GROUP)), []).append(record)
    return found


def _chains(first_job: Sequence[str], options: TuneOptions, base: str) -> Tuple[List[str], Dict[str, object]]:
    """The user's chain and explore's equivalent variants this host can measure (each stored as a
    transform config); the variants' chain configs by name."""
    if not options.variants:
        return [base], {}
    found = check_variants(first_job, loader_moves=False)
    if isinstance(found, NoVariants):
        print(f"tune: no variants of transform={base}: {'; '.join(found.reasons)}")
        return [base], {}
    chains, configs = [], {}
    for item in found.checked:
        if item.measured and (item.equivalence is None or is_equivalent(item.verdict)):
            store_variant(item.variant)
            chains.append(item.variant.name)
            configs[item.variant.name] = item.variant.chain.as_config()
    return chains, configs


def _winning_chains(probe: Mapping[str, List[JobRecord]], chains: Sequence[str], most: int
                    ) -> Tuple[List[str], Dict[str, str]]:
    """Explore's winners at workers=0: the chains the probe cannot tell apart from its fastest, the
    fastest `most` of them; what became of each chain, in words."""
    summaries = {c: [r.summary for r in probe[c]] for c in chains if probe.get(c)}
    verdicts = {c: "dropped: its probe job failed (its line is above)" for c in chains if c not in summaries}
    if not summaries:
        return [], verdicts
    rate = {c: race_rates(s)[0] for c, s in summaries.items()}
    fastest = max(summaries, key=rate.get)
    near = sorted((c for c in summaries if c == fastest or not told_apart_rounds(summaries[fastest], summaries[c])),
                  key=rate.get, reverse=True)
    for chain in summaries:
        if chain in near[:most]:
            verdicts[chain] = f"kept: {rate[chain]:.4g} samples/s at workers=0"
        elif chain in near:
            verdicts[chain] = (f"dropped: within noise of {fastest}, but tune.max_chains={most} keeps the fastest "
                               f"{most} ({rate[chain]:.4g} samples/s)")
        else:
            verdicts[chain] = (f"dropped: told apart from the fastest chain, {fastest} ({rate[chain]:.4g} against "
                               f"{rate[fastest]:.4g} samples/s at workers=0)")
    return near[:most], verdicts


def _models(probe: Mapping[str, List[JobRecord]]) -> Dict[str, ChainModel]:
    return {chain: ChainModel(chain_costs(records), tuple(gil_bound_steps(records)))
            for chain, records in probe.items() if records}


def _model_needs(point: Point, models: Mapping[str, ChainModel], target_pct: float) -> str:
    """Why a starvation target was missed, in the model's words: the workers and cores the chain needs
    to keep the consumer busy 100 - `target_pct` of the time, and whether this host has them."""
    model = models.get(point.chain)
    if model is None:
        return f"nothing kept starvation under {target_pct:g}%; the model has no probe of {point.chain} to say why"
    costs = dataclasses.replace(model.costs, batch_size=point.batch_size)
    return (f"nothing kept starvation under {target_pct:g}%; the model: "
            + target_line(point.chain, needs_for_target(costs, 100.0 - target_pct)))


def _check_objective(objective: Objective, spec: JobSpec) -> None:
    if objective.target_starvation_pct is not None and spec.consumer.kind == NO_CONSUMER:
        raise ConfigError("--target-starvation needs a consumer to starve: with consumer=none every step is all "
                          "wait; pick consumer=emulated (consumer.step_ms=...) or consumer=toy_cnn")


def _start(overrides: Sequence[str], config_dir: Optional[str], options: TuneOptions, objective: Objective
           ) -> Tuple[JobSpec, str, List[str], Dimensions]:
    """The user's first job (one, no sweep), its spec and results folder, and the space's dimensions
    before the chains are probed."""
    jobs = expand_sweep([*search_path(config_dir), *overrides])
    if len(jobs) != 1:
        raise ConfigError(f"tune starts from one setting, got a sweep of {len(jobs)} jobs; the values tune tries are "
                          "tune.* keys, e.g. tune.workers=[0,2,4] (pipebench tune --help)")
    if options.variants:
        edits = [o for o in overrides if override_key(o).startswith("transform.")]
        if edits:
            raise ConfigError(f"tune cannot apply {edits[0]} to explore's variants (their steps move); put the chain "
                              "in a config file and pass transform=NAME, or set tune.variants=false")
    with job_spec_composer() as compose_one:
        spec, results_dir = compose_one(jobs[0])
    _check_objective(objective, spec)
    dataset = build_dataset(spec)
    backends = [name for name in BACKENDS if not backend_problem(name, dataset)]
    dims = dimensions(options, spec, [spec.transform_name], usable_cores(), backends)
    return spec, results_dir, jobs[0], dims


def _check_budget(budget_s: float, probe_jobs: int, points: int, options: TuneOptions, job_s: float) -> None:
    """A ConfigError, giving the minimum, for a budget that cannot measure the probe and one round of
    the race (two points, or the one there is)."""
    minimum = (probe_jobs + options.rounds * min(2, max(1, points))) * job_s
    if budget_s < minimum:
        raise ConfigError(f"--budget-s is too small to measure one round: at least {math.ceil(minimum)} s here "
                          f"({budget_s:.0f} s left; the probe's {probe_jobs} job(s) and one round of the race, "
                          f"~{job_s:.0f} s a job)")


def _verify(folder: Path, pick: Point, current: Point, options: TuneOptions, outcome: RaceOutcome,
            base: Sequence[str], run_settings: Sequence[str], config_dir: Optional[str], deadline: float) -> str:
    if pick == current:
        return "verified: your settings are the recommended ones; nothing to change"
    if not options.verify_rounds:
        return ""
    if time.monotonic() + 2 * options.verify_rounds * outcome.job_s > deadline:
        return ("not verified against your settings: the budget is spent; run both with `pipebench run ... "
                f"rounds={options.verify_rounds}` to see the gain")
    print(f"tune: verifying {pick.name} against your settings ({current.name}), {options.verify_rounds} "
          "interleaved rounds a side", flush=True)
    records = _measure(folder / VERIFY_DIR, [current, pick], options.verify_rounds, base, run_settings,
                       config_dir, None)
    by_round = {name: {int(r.round or 0): race_rates([r.summary])[0] for r in records.get(name, [])}
                for name in (current.name, pick.name)}
    if not by_round[current.name] or not by_round[pick.name]:
        return "not verified: a verification job failed (its line is above)"
    return verify_line(pick.name, current.name, by_round[current.name], by_round[pick.name])


def tune_command(overrides: List[str], config_dir: Optional[str], budget_s: float = DEFAULT_BUDGET_S,
                 target_starvation: Optional[float] = None, max_pss_gib: Optional[float] = None,
                 ahead: Optional[JobProcess] = None) -> int:
    """Search the loader settings for the chain `overrides` compose to (module doc); exit status 0
    when done, a stage's interruption status when stopped."""
    started = time.monotonic()
    deadline = started + budget_s
    import_from_cwd()
    refuse_hydra_dirs(overrides)
    options, overrides = split_tune_overrides(overrides)
    if options.search == OPTUNA and optuna_missing() is not None:
        raise optuna_missing()
    objective = Objective(target_starvation, max_pss_gib)
    spec, results_dir, first_job, dims = _start(overrides, config_dir, options, objective)
    cuda = torch.cuda.is_available()
    base = job_overrides(overrides)
    with job_spec_composer() as compose_one:
        round_spec, _ = compose_one([*first_job, *round_defaults(overrides)])
    first_estimate = ESTIMATED_JOB_START_S + round_spec.run.min_time_s
    free_of_model, _ = prune(grid(dims), {}, cuda)
    _check_budget(budget_s, 1, len(free_of_model), options, first_estimate)  # before explore's checks take time
    chains, configs = _chains(first_job, options, spec.transform_name)
    _check_budget(deadline - time.monotonic(), len(chains), len(free_of_model), options, first_estimate)
    folder = new_folder(Path(results_dir) / f"{time.strftime('%Y%m%d-%H%M%S')}-tune-{folder_safe(spec.transform_name)}")
    with folder_lock(folder):
        try:
            return _tune(folder, spec, round_spec, base, overrides, config_dir, options, objective, dims, chains,
                         configs, cuda, budget_s, started, deadline, ahead)
        except Stopped as stop:
            print(f"results: {folder}")
            return stop.status


def _tune(folder: Path, spec: JobSpec, round_spec: JobSpec, base: List[str], overrides: List[str],
          config_dir: Optional[str], options: TuneOptions, objective: Objective, dims: Dimensions,
          chains: List[str], configs: Mapping[str, object], cuda: bool, budget_s: float, started: float,
          deadline: float, ahead: Optional[JobProcess]) -> int:
    """tune_command's work inside its locked folder."""
    threads = any(BACKENDS[b].worker_kind == THREADS for b in dims.backends) and max(dims.workers) > 0
    probe_points = [Point.probe(c, spec.loader.batch_size) for c in chains]
    print(f"tune: probing {len(chains)} chain(s) at workers=0 for the cost model"
          f"{' (with the thread profile)' if threads else ''}", flush=True)
    probe_started = time.monotonic()
    probed = _measure(folder / PROBE_DIR, probe_points, 1, base, round_settings(overrides, round_spec, 1.0, threads),
                      config_dir, ahead)
    probe_job_s = (time.monotonic() - probe_started) / max(1, len(probe_points))
    probe = {p.chain: probed.get(p.name, []) for p in probe_points}
    kept_chains, chain_verdicts = _winning_chains(probe, chains, options.max_chains)
    models = _models(probe)
    kept, pruned = prune(grid(dataclasses.replace(dims, chains=tuple(kept_chains))), models, cuda)
    schedule = options.schedule(round_s=round_spec.run.min_time_s, job_s=probe_job_s)
    reserve = 2 * options.verify_rounds
    room = math.floor((deadline - time.monotonic() - reserve * probe_job_s) / (options.rounds * probe_job_s))
    notes: List[str] = []
    if options.search != OPTUNA:
        kept, cut = fit_budget(kept, models, max(1, room))
        pruned += cut
    if one_point_note(kept):
        notes.append(one_point_note(kept))
        print(f"tune: {notes[-1]}", flush=True)
    points = {p.name: p for p in [*kept, *(d.point for d in pruned)]}
    print(f"tune: {len(kept)} point(s) race, {len(pruned)} pruned (reasons in tune.csv)", flush=True)
    batches = itertools.count(1)

    def measure(names: Sequence[str], rounds: int, length: float) -> Dict[str, List[Mapping[str, object]]]:
        number = next(batches)
        print(f"tune: race {number}: {len(names)} point(s), {rounds} round(s) {length:g}x long", flush=True)
        found = _measure(folder / RACE_DIR.format(number), [points[n] for n in names], rounds, base,
                         round_settings(overrides, round_spec, length), config_dir, None)
        return {name: [r.summary for r in records] for name, records in found.items()}

    propose = optuna_proposer(kept, objective, options.optuna_batch, options.seed) if options.search == OPTUNA \
        else None
    outcome = run_race([p.name for p in kept], {p.name: p.workers for p in kept}, measure, objective, schedule,
                       deadline, reserve_jobs=reserve, propose=propose)
    chosen = recommend(outcome.rounds, outcome.survivors, {p.name: p.workers for p in kept}, objective) \
        if outcome.survivors else None
    verification = ""
    if chosen is not None and not chosen.met and objective.target_starvation_pct is not None:
        notes.append(_model_needs(points[chosen.pick], models, objective.target_starvation_pct))
    if chosen is not None:
        last_length = outcome.stages[-1].length if outcome.stages else 1.0
        verification = _verify(folder, points[chosen.pick], current_point(spec).as_run(cuda), options, outcome, base,
                               round_settings(overrides, round_spec, last_length), config_dir, deadline)
    tuned = Tuned(spec.transform_name, objective, budget_s, time.monotonic() - started, points, pruned,
                  {name: predicted_rate(p, models.get(p.chain)) for name, p in points.items()}, outcome, chosen,
                  {c: [r.summary for r in records] for c, records in probe.items() if records}, chain_verdicts,
                  verification, configs.get(points[chosen.pick].chain) if chosen is not None else None, notes, base)
    print("\n" + write_tune(folder, tuned, config_dir or ""), end="")
    if chosen is None:
        print(f"pipebench: error: tune: {outcome.stop}", file=sys.stderr)
    print(f"results: {folder}")
    return 0 if chosen is not None else CRASH_EXIT_STATUS


def add_parser(verbs: "argparse._SubParsersAction") -> None:
    parser = verbs.add_parser(
        "tune", help="find the loader settings for your chain: the model prunes, interleaved rounds race the rest",
        description="Search workers, loader.backend, prefetch_factor, persistent_workers, pin_memory (with CUDA), "
                    "the batch size (where allowed) and explore's equivalent chains for the chain the overrides "
                    "compose to. The cost model prunes first, each dropped point with its reason; short interleaved "
                    "rounds race the rest, longer rounds those the intervals cannot yet tell from the best, within "
                    "the budget. Ends with the settings within noise of the best and the cheapest of them.",
        epilog=TUNE_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_config_dir(parser)
    parser.add_argument("--budget-s", type=_positive, default=DEFAULT_BUDGET_S, metavar="S",
                        help=f"wall-clock seconds for the whole search (default {DEFAULT_BUDGET_S:g})")
    parser.add_argument("--target-starvation", type=_percent, metavar="PCT",
                        help="find the fewest workers that keep starvation under PCT (10: MLPerf Storage's AU >= 90%%)")
    parser.add_argument("--max-pss-gib", type=_positive, metavar="G",
                        help="only settings whose summed PSS (main process and workers) stays under G GiB")
    add_overrides(parser, "transform=yuv_mask tune.workers=[0,2,4]")


def main(args: argparse.Namespace) -> int:
    return tune_command(list(args.overrides), args.config_dir, args.budget_s, args.target_starvation,
                        args.max_pss_gib, args.job_ahead)


def _number(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be a number, got {text!r}")
    return value


def _positive(text: str) -> float:
    """An argparse type: a finite number above 0."""
    value = _number(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be above 0, got {text!r}")
    return value


def _percent(text: str) -> float:
    """An argparse type: a share of step time, above 0 and below 100."""
    value = _number(text)
    if not 0 < value < 100:
        raise argparse.ArgumentTypeError(f"must be a percentage above 0 and below 100, got {text!r}")
    return value
