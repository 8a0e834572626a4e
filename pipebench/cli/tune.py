"""The `tune` verb: the loader settings for the user's chain, found with statistics within a budget.

In order, each part in a folder of its own under the tune's results folder, each a sweep run as
`pipebench run` runs one (a fresh process a job, interleaved rounds):
1. `probe/`: each chain (the user's and explore's equivalent variants) once at workers=0, the
   thread profile on where a thread backend is in the space: the cost model's inputs (CPU a
   sample, the share of time in steps that hold the GIL, each worker's memory) and explore's
   winners among the chains; a chain whose probe crashed is a warning, first in the output;
2. the space (`pipebench.tune.space`): the worker ladder up to where the model puts the knee
   (unless tune.workers names it), pruned by the model, each dropped point with its reason, then
   cut to what one round of the budget fits (never under MIN_RACED_POINTS);
3. `race-N/`: the race (`pipebench.tune.race`), stage by stage;
4. the recommendation (`pipebench.tune.recommend`), and `verify/`: it against the current
   settings, interleaved, with compare's verdict.
Then tune.csv, best.yaml, tune.md and tune.png (`pipebench.tune.files`), and `results: <folder>`.
The plan is kept in tune.json as it is decided, so the same command resumes an interrupted tune
(`pipebench.tune.state`), measuring only the trials it had not finished.
"""

import argparse
import dataclasses
import itertools
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

import psutil
import torch

from pipebench.base.cores import usable_cores
from pipebench.base.errors import CRASH_EXIT_STATUS, INTERRUPTED_EXIT_STATUS, TERMINATED_EXIT_STATUS, ConfigError
from pipebench.base.io import folder_safe
from pipebench.cli.common_args import add_config_dir, add_fresh, add_overrides
from pipebench.config.compose import job_spec_composer
from pipebench.config.limits import MAX_TUNE_BUDGET_S
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
from pipebench.measure.memory import BYTES_PER_MB
from pipebench.report.diagnosis import chain_costs, needs_for_target, predict, target_line
from pipebench.report.thread_advice import gil_bound_steps
from pipebench.sweep.expand import expand_sweep, import_from_cwd, refuse_hydra_dirs, search_path
from pipebench.sweep.launch import Into, run_command
from pipebench.tune.files import Tuned, write_tune
from pipebench.tune.objective import Objective, probe_ties, pss_mb, race_rates, starvation
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
    store_chain,
    store_point,
)
from pipebench.tune.race import RaceOutcome, run_race
from pipebench.tune.recommend import (
    STRICTNESS,
    bottleneck_note,
    crash_warning,
    recommend,
    sibling_warning,
    strictness,
    verify_line,
)
from pipebench.tune.space import (
    MIN_RACED_POINTS,
    ChainModel,
    Dimensions,
    Point,
    fit_budget,
    gil_share,
    grid,
    ladder_top,
    model_ladder,
    one_point_note,
    predicted_rate,
    prune,
)
from pipebench.tune.state import finished_trials, points_of, read_state, unfinished_folder, update_state

__all__ = ["add_parser", "main", "tune_command"]

# A job's seconds besides its measured window, before one has been timed: the process start (its
# imports alone take 2.8 s on the 2-core machine, benchmarks/startup.py), the dataset and warm-up.
ESTIMATED_JOB_START_S = 4.0
# The planted cases are each found within five minutes on the 2-core machine.
DEFAULT_BUDGET_S = 300.0
PROBE_DIR, RACE_DIR, VERIFY_DIR = "probe", "race-{}", "verify"
# The folder name after `<time>-`: what a resumed tune looks for.
FOLDER_TAIL = "tune-{}"
# Why a chain has no probe result: its job ended without one (a crash, a signal; its line is above).
PROBE_FAILED = "its probe job ended without a result; its line is above"

TUNE_EPILOG = """\
examples:
  pipebench tune transform=yuv_mask                         the seed chain's loader settings, 5 minutes
  pipebench tune --budget-s 900 --target-starvation 10 consumer=toy_cnn   fewest workers keeping the model fed
  pipebench tune --max-pss-gib 8 tune.batch_sizes=[64,128]  a memory cap; the batch size searched too
  pipebench tune tune.search=optuna                          Optuna's TPE picks which points race (the tune extra)

space:  tune.workers=[..] (default: the model's ladder, up to its knee), tune.backends=[..] (every installed one),
        tune.prefetch_factors=[2,4], tune.persistent_workers=[false,true], tune.pin_memory (with CUDA only),
        tune.batch_sizes=[..] (only when given), tune.variants=true (explore's equivalent chains, its winners)
race:   tune.rounds=2 a stage, tune.stages=3 (each twice as long), tune.verify_rounds=4
writes: tune.csv, best.yaml, tune.md with tune.png, conf/ (the chain's config), and probe/, race-N/, verify/
resume: the same command again resumes an interrupted tune (only unfinished trials run); --fresh starts anew
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
    status = run_command(sweep, config_dir, ahead=ahead, into=Into(folder, stage=True))
    if status in (INTERRUPTED_EXIT_STATUS, TERMINATED_EXIT_STATUS):
        raise Stopped(status)
    found: Dict[str, List[JobRecord]] = {}
    for record in load_job_results(folder):
        found.setdefault(str(record.choices.get(POINT_GROUP)), []).append(record)
    return found


@dataclass(frozen=True)
class ChainSet:
    """The chains tune probes: the user's first, then explore's equivalent variants; each variant's
    config, and each chain's equivalence verdict against the user's and its moves."""

    names: Tuple[str, ...]
    configs: Mapping[str, Mapping[str, object]]
    verdicts: Mapping[str, str]
    moves: Mapping[str, Tuple[str, ...]]

    def record(self) -> Dict[str, object]:
        """As tune.json keeps it, for a resumed tune."""
        return {name: {"config": self.configs.get(name), "verdict": self.verdicts.get(name, STRICTNESS[0]),
                       "moves": list(self.moves.get(name, ()))} for name in self.names}

    @classmethod
    def read(cls, recorded: Mapping[str, Mapping[str, object]]) -> "ChainSet":
        """From tune.json, each variant stored again as `transform=<name>` (explore's checks not rerun)."""
        configs = {name: dict(item["config"]) for name, item in recorded.items() if item.get("config") is not None}
        for name, config in configs.items():
            store_chain(name, config)
        return cls(tuple(recorded), configs, {n: str(item["verdict"]) for n, item in recorded.items()},
                   {n: tuple(item.get("moves") or ()) for n, item in recorded.items()})


def _chains(first_job: Sequence[str], options: TuneOptions, base: str) -> ChainSet:
    """The user's chain and explore's equivalent variants this host can measure (each variant stored
    as a transform config; the user's own is its config file already, and storing it again under the
    same name made Hydra warn that the file is validated against a ConfigStore schema)."""
    mine = ChainSet((base,), {}, {base: STRICTNESS[0]}, {base: ()})
    if not options.variants:
        return mine
    found = check_variants(first_job, loader_moves=False)
    if isinstance(found, NoVariants):
        print(f"tune: no variants of transform={base}: {'; '.join(found.reasons)}")
        return mine
    names, configs, verdicts, moves = [], {}, {}, {}
    for item in found.checked:
        if item.measured and (item.equivalence is None or is_equivalent(item.verdict)):
            name = item.variant.name
            names.append(name)
            verdicts[name], moves[name] = item.verdict, tuple(item.variant.moves)
            if item.equivalence is not None:
                store_variant(item.variant)
                configs[name] = item.variant.chain.as_config()
    return ChainSet(tuple(names), configs, verdicts, moves)


def _winning_chains(probe: Mapping[str, List[JobRecord]], chains: ChainSet, most: int
                    ) -> Tuple[List[str], Dict[str, str]]:
    """Explore's winners at workers=0: the chains the probe cannot tell apart from its fastest, the
    `most` of them with the strictest equivalence to the user's chain, then the fastest; what became
    of each chain, in words."""
    summaries = {c: [r.summary for r in probe[c]] for c in chains.names if probe.get(c)}
    verdicts = {c: f"crashed: {PROBE_FAILED}" for c in chains.names if c not in summaries}
    if not summaries:
        return [], verdicts
    rate = {c: race_rates(s)[0] for c, s in summaries.items()}
    fastest = max(summaries, key=rate.get)
    near = sorted(probe_ties(summaries, fastest),
                  key=lambda c: (strictness(chains.verdicts.get(c, STRICTNESS[0])), -rate[c]))
    for chain in summaries:
        if chain in near[:most]:
            verdicts[chain] = f"kept: {rate[chain]:.4g} samples/s at workers=0"
        elif chain in near:
            verdicts[chain] = (f"dropped: the probe cannot tell it from {fastest}, but tune.max_chains={most} keeps "
                               f"{most}, the strictest equivalents first ({rate[chain]:.4g} samples/s, "
                               f"{chains.verdicts.get(chain, '')})")
        else:
            verdicts[chain] = (f"dropped: told apart from the fastest chain, {fastest} ({rate[chain]:.4g} against "
                               f"{rate[fastest]:.4g} samples/s at workers=0)")
    return near[:most], verdicts


def _models(probe: Mapping[str, List[JobRecord]]) -> Dict[str, ChainModel]:
    """Each probed chain's model: its costs, the steps holding the GIL and their share of its time,
    and a worker's memory (the probe's summed PSS: one process, so what a worker copying it holds)."""
    return {chain: ChainModel(chain_costs(records), tuple(gil_bound_steps(records)), gil_share(records),
                              pss_mb([r.summary for r in records]))
            for chain, records in probe.items() if records}


def _ladder(models: Mapping[str, ChainModel], chains: Sequence[str], cores: int) -> Tuple[Tuple[int, ...], str]:
    """The worker counts where the user named none: up to the highest top of the kept chains'
    (`ladder_top`), and the line saying where it stops and why."""
    available_mb = psutil.virtual_memory().available / BYTES_PER_MB
    tops = {c: ladder_top(models[c].costs, models[c].worker_mb, available_mb) for c in chains if c in models}
    if not tops:
        return (), ""
    chain, top = max(tops.items(), key=lambda item: item[1].workers)
    return model_ladder(top.workers, cores), f"the worker ladder stops at {top.workers} ({chain}: {top.why})"


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
    the race (MIN_RACED_POINTS points, or those there are)."""
    minimum = (probe_jobs + options.rounds * min(MIN_RACED_POINTS, max(1, points))) * job_s
    if budget_s < minimum:
        raise ConfigError(f"--budget-s is too small to measure one round: at least {math.ceil(minimum)} s here "
                          f"({budget_s:.0f} s left; the probe's {probe_jobs} job(s) and one round of the race, "
                          f"~{job_s:.0f} s a job)")


def _verify(folder: Path, pick: Point, current: Point, options: TuneOptions, job_s: float,
            base: Sequence[str], run_settings: Sequence[str], config_dir: Optional[str], deadline: float
            ) -> Tuple[str, List[Mapping[str, object]]]:
    """The verification's line, and the current settings' rounds it measured (none where it did not
    run). It runs as many of tune.verify_rounds interleaved rounds a side as the time left holds."""
    if pick == current:
        return "verified: your settings are the recommended ones; nothing to change", []
    if not options.verify_rounds:
        return "", []
    left = deadline - time.monotonic()
    rounds = min(options.verify_rounds, math.floor(left / (2 * job_s)))
    if rounds < 1:
        return (f"not verified against your settings: {max(left, 0):.0f} s of the budget are left and a round a "
                f"side takes ~{2 * job_s:.0f} s; run both with `pipebench run ... rounds={options.verify_rounds}` "
                "to see the gain"), []
    fewer = f" (of tune.verify_rounds={options.verify_rounds}: what the budget's {left:.0f} s left hold)" \
        if rounds < options.verify_rounds else ""
    print(f"tune: verifying {pick.name} against your settings ({current.name}), {rounds} interleaved rounds a "
          f"side{fewer}", flush=True)
    records = _measure(folder / VERIFY_DIR, [current, pick], rounds, base, run_settings, config_dir, None)
    by_round = {name: {int(r.round or 0): race_rates([r.summary])[0] for r in records.get(name, [])}
                for name in (current.name, pick.name)}
    mine = [r.summary for r in records.get(current.name, [])]
    if not by_round[current.name] or not by_round[pick.name]:
        return "not verified: a verification job failed (its line is above)", mine
    return verify_line(pick.name, current.name, by_round[current.name], by_round[pick.name]) + fewer, mine


def _bottleneck(spec: JobSpec, current: Point, measured: Sequence[Mapping[str, object]],
                models: Mapping[str, ChainModel]) -> str:
    """Whether the loader holds the user's own step back at their settings: measured where the
    verification (or the race) ran them, else the model's prediction."""
    if spec.consumer.kind == NO_CONSUMER:
        return ""
    step = f"consumer={spec.consumer.kind}, {spec.consumer.step_ms:g} ms a step" \
        if spec.consumer.kind == "emulated" else f"consumer={spec.consumer.kind}"
    if measured:
        return bottleneck_note(starvation(measured), f"measured, {len(measured)} round(s)", step)
    model = models.get(current.chain)
    if model is None or current.worker_kind == THREADS:
        return ""
    predicted = predict(dataclasses.replace(model.costs, batch_size=current.batch_size), current.workers)
    return bottleneck_note(predicted.starvation_pct, "the model's prediction", step)


def _command_key(overrides: Sequence[str], config_dir: Optional[str], objective: Objective) -> List[str]:
    """What makes two tune commands the same one, for resuming (the budget may differ)."""
    return [*overrides, f"--config-dir={config_dir or ''}", f"objective={objective.name}"]


def tune_command(overrides: List[str], config_dir: Optional[str], budget_s: float = DEFAULT_BUDGET_S,
                 target_starvation: Optional[float] = None, max_pss_gib: Optional[float] = None,
                 ahead: Optional[JobProcess] = None, fresh: bool = False) -> int:
    """Search the loader settings for the chain `overrides` compose to (module doc); exit status 0
    when done, a stage's interruption status when stopped. The same command resumes an interrupted
    tune (`pipebench.tune.state`) unless `fresh`."""
    if budget_s > MAX_TUNE_BUDGET_S:
        raise ConfigError(f"--budget-s must be at most {MAX_TUNE_BUDGET_S:g} s (a week), got {budget_s:g}")
    started = time.monotonic()
    deadline = started + budget_s
    import_from_cwd()
    refuse_hydra_dirs(overrides)
    command = list(overrides)
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
    key = _command_key(command, config_dir, objective)
    tail = FOLDER_TAIL.format(folder_safe(spec.transform_name))
    folder = None if fresh else unfinished_folder(Path(results_dir), f"*-{tail}*", key)
    state = (read_state(folder) or {}) if folder is not None else {}
    if folder is not None:
        print(f"tune: resuming {folder}: {finished_trials(folder)} finished trial(s) kept, the plan as first "
              "made (--fresh starts anew)", flush=True)
    _check_budget(budget_s, 1, len(free_of_model), options, first_estimate)  # before explore's checks take time
    chains = ChainSet.read(state["chains"]) if isinstance(state.get("chains"), dict) else \
        _chains(first_job, options, spec.transform_name)
    _check_budget(deadline - time.monotonic(), len(chains.names), len(free_of_model), options, first_estimate)
    if folder is None:
        folder = new_folder(Path(results_dir) / f"{time.strftime('%Y%m%d-%H%M%S')}-{tail}")
    with folder_lock(folder):
        state = update_state(folder, command=key, chains=chains.record())
        try:
            return _tune(folder, spec, round_spec, base, overrides, config_dir, options, objective, dims, chains,
                         cuda, budget_s, started, deadline, ahead, state)
        except Stopped as stop:
            print("tune: stopped; its finished trials are kept, and the same command resumes it", file=sys.stderr)
            print(f"results: {folder}")
            return stop.status


def _race_entrants(kept: List[Point], state: Mapping[str, object], folder: Path) -> List[Point]:
    """The race's points: those a resumed tune recorded, else `kept`, recorded now."""
    recorded = points_of(state, "entrants")
    if recorded is not None:
        return [Point(**fields) for fields in recorded]
    update_state(folder, entrants=[dataclasses.asdict(p) for p in kept])
    return kept


def _tune(folder: Path, spec: JobSpec, round_spec: JobSpec, base: List[str], overrides: List[str],
          config_dir: Optional[str], options: TuneOptions, objective: Objective, dims: Dimensions,
          chains: ChainSet, cuda: bool, budget_s: float, started: float, deadline: float,
          ahead: Optional[JobProcess], state: Mapping[str, object]) -> int:
    """tune_command's work inside its locked folder."""
    threads = any(BACKENDS[b].worker_kind == THREADS for b in dims.backends) and (
        options.workers is None or max(dims.workers) > 0)
    probe_points = [Point.probe(c, spec.loader.batch_size) for c in chains.names]
    print(f"tune: probing {len(chains.names)} chain(s) at workers=0 for the cost model"
          f"{' (with the thread profile)' if threads else ''}", flush=True)
    probe_started = time.monotonic()
    probed = _measure(folder / PROBE_DIR, probe_points, 1, base, round_settings(overrides, round_spec, 1.0, threads),
                      config_dir, ahead)
    probe_job_s = (time.monotonic() - probe_started) / max(1, len(probe_points))
    probe = {p.chain: probed.get(p.name, []) for p in probe_points}
    kept_chains, chain_verdicts = _winning_chains(probe, chains, options.max_chains)
    crashed = [c for c in chains.names if not probe.get(c)]
    warnings = [crash_warning(c, PROBE_FAILED) for c in crashed]
    for warning in warnings:
        print(f"tune: warning: {warning}", flush=True)
    models = _models(probe)
    notes: List[str] = []
    if options.workers is None:
        ladder, why = _ladder(models, kept_chains, usable_cores())
        if ladder:
            dims = dataclasses.replace(dims, workers=ladder)
            notes.append(why)
            print(f"tune: {why}", flush=True)
    kept, pruned = prune(grid(dataclasses.replace(dims, chains=tuple(kept_chains))), models, cuda)
    schedule = options.schedule(round_s=round_spec.run.min_time_s, job_s=probe_job_s)
    reserve = 2 * options.verify_rounds
    room = math.floor((deadline - time.monotonic() - reserve * probe_job_s) / (options.rounds * probe_job_s))
    if options.search != OPTUNA:
        kept, cut = fit_budget(kept, models, room)
        pruned += cut
    entrants = _race_entrants(kept, state, folder)
    if entrants != kept:
        names = {p.name for p in entrants}
        pruned = [d for d in pruned if d.point.name not in names]
    kept = entrants
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
    equivalence = {name: chains.verdicts.get(p.chain, STRICTNESS[0]) for name, p in points.items()}
    chosen = recommend(outcome.rounds, outcome.survivors, {p.name: p.workers for p in kept}, objective,
                       equivalence) if outcome.survivors else None
    verification, pick_warning = "", ""
    if chosen is not None and not chosen.met and objective.target_starvation_pct is not None:
        notes.append(_model_needs(points[chosen.pick], models, objective.target_starvation_pct))
    if chosen is not None:
        last_length = outcome.stages[-1].length if outcome.stages else 1.0
        current = current_point(spec).as_run(cuda)
        verification, mine = _verify(folder, points[chosen.pick], current, options, outcome.job_s or probe_job_s,
                                     base, round_settings(overrides, round_spec, last_length), config_dir, deadline)
        note = _bottleneck(spec, current, mine or list(outcome.rounds.get(current.name, ())), models)
        notes += [note] if note else []
        pick_warning = sibling_warning(points[chosen.pick].chain, crashed, chains.moves)
    tuned = Tuned(spec.transform_name, objective, budget_s, time.monotonic() - started, points, pruned,
                  {name: predicted_rate(p, models.get(p.chain)) for name, p in points.items()}, outcome, chosen,
                  {c: [r.summary for r in records] for c, records in probe.items() if records}, chain_verdicts,
                  verification, chains.configs.get(points[chosen.pick].chain) if chosen is not None else None, notes,
                  base, warnings, pick_warning)
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
                        help=f"wall-clock seconds for the whole search (default {DEFAULT_BUDGET_S:g}, at most "
                             f"{MAX_TUNE_BUDGET_S:g})")
    add_fresh(parser, "tune")
    parser.add_argument("--target-starvation", type=_percent, metavar="PCT",
                        help="find the fewest workers that keep starvation under PCT (10: MLPerf Storage's AU >= 90%%)")
    parser.add_argument("--max-pss-gib", type=_positive, metavar="G",
                        help="only settings whose summed PSS (main process and workers) stays under G GiB")
    add_overrides(parser, "transform=yuv_mask tune.workers=[0,2,4]")


def main(args: argparse.Namespace) -> int:
    return tune_command(list(args.overrides), args.config_dir, args.budget_s, args.target_starvation,
                        args.max_pss_gib, args.job_ahead, args.fresh)


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
