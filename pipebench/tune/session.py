"""`pipebench tune`'s sequence, in the order it runs (docs/tune.md): the probe (`probe/`), the space
and its pruning, the race (`race-N/`), the recommendation and its verification (`verify/`), then the
files. Each part is a sweep in a folder of its own, run as `pipebench run` runs one. The race's and
the verification's sweeps start no job past the budget's deadline (`Into.deadline`), so a tune
overruns its budget by at most the job running then; tune.json keeps the plan as it is decided, so
the same command resumes an interrupted tune (`pipebench.tune.state`).
"""

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

from pipebench.base.command import results_line
from pipebench.base.cores import usable_cores
from pipebench.base.errors import (
    CRASH_EXIT_STATUS,
    ConfigError,
    report_error,
)
from pipebench.base.io import folder_safe
from pipebench.config.compose import job_spec_composer
from pipebench.config.limits import MAX_TUNE_BUDGET_S
from pipebench.config.specs import EMULATED, NO_CONSUMER, THREADS, JobSpec
from pipebench.config.verb_options import split_prefixed
from pipebench.explore.plan import unset_defaults
from pipebench.measure.job_spawn import JobProcess
from pipebench.measure.memory import BYTES_PER_MB
from pipebench.model.costs import needs_for_target, predict, target_line
from pipebench.pipeline.build import build_dataset
from pipebench.pipeline.loader_backends import BACKENDS, backend_problem
from pipebench.record.folder_lock import folder_lock
from pipebench.record.jobs import JobResult, edits_chain
from pipebench.record.results import load_job_results
from pipebench.record.resume import dated, new_folder
from pipebench.report.diagnosis import chain_costs
from pipebench.report.thread_advice import gil_bound_steps
from pipebench.sweep.expand import expand_sweep, import_from_cwd, refuse_hydra_dirs, search_path
from pipebench.sweep.launch import Into, Stopped, run_command
from pipebench.tune.chains import PROBE_FAILED, ChainSet, probed_chains, winning_chains
from pipebench.tune.files import Tuned, write_tune
from pipebench.tune.job_cost import job_seconds
from pipebench.tune.objective import Objective, Round, pss_mb, race_rates, starvation
from pipebench.tune.optuna_search import optuna_missing, optuna_proposer
from pipebench.tune.plan import (
    OPTUNA,
    POINT_GROUP,
    ROUND_DEFAULTS,
    TUNE_PREFIX,
    TuneOptions,
    current_point,
    dimensions,
    job_overrides,
    point_override,
    round_settings,
    store_point,
)
from pipebench.tune.race import Entrants, RaceLimit, RaceOutcome, run_race
from pipebench.tune.recommend import (
    STRICTNESS,
    Recommendation,
    bottleneck_note,
    crash_warning,
    recommend,
    sibling_warning,
    verify_line,
)
from pipebench.tune.space import (
    MIN_RACED_POINTS,
    ChainModel,
    Dimensions,
    Dropped,
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
from pipebench.tune.state import TuneState, finished_trials, read_state, unfinished_folder, update_state

__all__ = ["DEFAULT_BUDGET_S", "TuneRequest", "TuneSession", "tune_command"]

# A job's seconds besides its measured window, before one has been timed: the process start (its
# imports alone take 2.8 s on the 2-core machine, benchmarks/startup.py), the dataset and warm-up.
ESTIMATED_JOB_START_S = 4.0
# The planted cases are each found within five minutes on the 2-core machine.
DEFAULT_BUDGET_S = 300.0
PROBE_DIR, RACE_DIR, VERIFY_DIR = "probe", "race-{}", "verify"
# The folder name after `<time>-`: what a resumed tune looks for.
FOLDER_TAIL = "tune-{}"


@dataclass(frozen=True)
class TuneRequest:
    """What the command asks: the user's overrides (tune.* among them), --config-dir, the budget,
    the objective's limits, and whether to start anew rather than resume."""

    overrides: Tuple[str, ...]
    config_dir: Optional[str]
    budget_s: float = DEFAULT_BUDGET_S
    target_starvation: Optional[float] = None
    max_pss_gib: Optional[float] = None
    fresh: bool = False

    def command_key(self, objective: Objective) -> List[str]:
        """What makes two tune commands the same one, for resuming (the budget may differ)."""
        return [*self.overrides, f"--config-dir={self.config_dir or ''}", f"objective={objective.name}"]


@dataclass(frozen=True)
class Probed:
    """The probe at workers=0: each chain's records, a job's seconds, the chains that race and what
    became of each, those whose probe crashed (and their warnings), and each probed chain's model."""

    records: Mapping[str, List[JobResult]]
    job_s: float
    kept: List[str]
    verdicts: Dict[str, str]
    crashed: List[str]
    warnings: List[str]
    models: Dict[str, ChainModel]


def _models(probe: Mapping[str, List[JobResult]]) -> Dict[str, ChainModel]:
    """Each probed chain's model: its costs, the steps holding the GIL and their share of its time,
    and a worker's memory (the probe's summed PSS: one process, so what a worker copying it holds)."""
    return {chain: ChainModel(chain_costs(records), tuple(gil_bound_steps(records)),
                              gil_share(records), pss_mb([r.summary for r in records]))
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
    costs = model.at_batch(point.batch_size)
    return (f"nothing kept starvation under {target_pct:g}%; the model: "
            + target_line(point.chain, needs_for_target(costs, 100.0 - target_pct)))


def _bottleneck(spec: JobSpec, current: Point, measured: Sequence[Round],
                models: Mapping[str, ChainModel]) -> str:
    """Whether the loader holds the user's own step back at their settings: measured where the
    verification (or the race) ran them, else the model's prediction."""
    if spec.consumer.kind == NO_CONSUMER:
        return ""
    step = f"consumer={spec.consumer.kind}, {spec.consumer.step_ms:g} ms a step" \
        if spec.consumer.kind == EMULATED else f"consumer={spec.consumer.kind}"
    if measured:
        return bottleneck_note(starvation(measured), f"measured, {len(measured)} round(s)", step)
    model = models.get(current.chain)
    if model is None or current.worker_kind == THREADS:
        return ""
    predicted = predict(model.at_batch(current.batch_size), current.workers)
    return bottleneck_note(predicted.starvation_pct, "the model's prediction", step)


def _start(overrides: Sequence[str], config_dir: Optional[str], options: TuneOptions, objective: Objective
           ) -> Tuple[JobSpec, str, List[str], Dimensions]:
    """The user's first job (one, no sweep), its spec and results folder, and the space's dimensions
    before the chains are probed."""
    jobs = expand_sweep([*search_path(config_dir), *overrides])
    if len(jobs) != 1:
        raise ConfigError(f"tune starts from one setting, got a sweep of {len(jobs)} jobs; the values tune tries are "
                          "tune.* keys, e.g. tune.workers=[0,2,4] (pipebench tune --help)")
    if options.variants:
        edits = [o for o in overrides if edits_chain(o)]
        if edits:
            raise ConfigError(f"tune cannot apply {edits[0]} to explore's variants (their steps move); put the chain "
                              "in a config file and pass transform=NAME, or set tune.variants=false")
    with job_spec_composer() as compose_one:
        spec, results_dir = compose_one(jobs[0])
    if objective.target_starvation_pct is not None and spec.consumer.kind == NO_CONSUMER:
        raise ConfigError("--target-starvation needs a consumer to starve: with consumer=none every step is all "
                          "wait; pick consumer=emulated (consumer.step_ms=...) or consumer=toy_cnn")
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


def tune_command(request: TuneRequest, ahead: Optional[JobProcess] = None) -> int:
    """Search the loader settings for the chain the request's overrides compose to (module doc); exit
    status 0 when done, a stage's interruption status when stopped. The same command resumes an
    interrupted tune (`pipebench.tune.state`) unless the request is `fresh`."""
    if request.budget_s > MAX_TUNE_BUDGET_S:
        raise ConfigError(f"--budget-s must be at most {MAX_TUNE_BUDGET_S:g} s (a week), got {request.budget_s:g}")
    started = time.monotonic()
    deadline = started + request.budget_s
    import_from_cwd()
    refuse_hydra_dirs(request.overrides)
    options, overrides = split_prefixed(request.overrides, TUNE_PREFIX, TuneOptions)
    if options.search == OPTUNA and optuna_missing() is not None:
        raise optuna_missing()
    objective = Objective(request.target_starvation, request.max_pss_gib)
    spec, results_dir, first_job, dims = _start(overrides, request.config_dir, options, objective)
    cuda = torch.cuda.is_available()
    with job_spec_composer() as compose_one:
        round_spec, _ = compose_one([*first_job, *unset_defaults(ROUND_DEFAULTS, overrides)])
    first_estimate = ESTIMATED_JOB_START_S + round_spec.run.min_time_s
    free_of_model, _ = prune(grid(dims), {}, cuda)
    key = request.command_key(objective)
    tail = FOLDER_TAIL.format(folder_safe(spec.transform_name))
    folder = None if request.fresh else unfinished_folder(Path(results_dir), f"*-{tail}*", key)
    state = (read_state(folder) or TuneState()) if folder is not None else TuneState()
    if folder is not None:
        print(f"tune: resuming {folder}: {finished_trials(folder)} finished trial(s) kept, the plan as first "
              "made (--fresh starts anew)", flush=True)
    _check_budget(request.budget_s, 1, len(free_of_model), options, first_estimate)  # before explore's checks
    chains = ChainSet.read(state.chains) if isinstance(state.chains, dict) else \
        probed_chains(first_job, options, spec.transform_name)
    _check_budget(deadline - time.monotonic(), len(chains.names), len(free_of_model), options, first_estimate)
    if folder is None:
        folder = new_folder(dated(results_dir, tail))
    with folder_lock(folder):
        state = update_state(folder, command=key, chains=chains.record())
        session = TuneSession(folder, request, options, objective, spec, round_spec, overrides, dims, chains, cuda,
                              started, state)
        try:
            return session.run(ahead)
        except Stopped as stop:
            print("tune: stopped; its finished trials are kept, and the same command resumes it", file=sys.stderr)
            print(results_line(folder))
            return stop.status


@dataclass(frozen=True)
class TuneSession:
    """One tune inside its locked folder: what the command asked and composed, the space before the
    probe, the chains, and the plan a resumed tune read back (`state`). `run` is the sequence."""

    folder: Path
    request: TuneRequest
    options: TuneOptions
    objective: Objective
    spec: JobSpec
    round_spec: JobSpec
    overrides: List[str]
    dims: Dimensions
    chains: ChainSet
    cuda: bool
    started: float
    state: TuneState

    @property
    def deadline(self) -> float:
        return self.started + self.request.budget_s

    @property
    def base(self) -> List[str]:
        """The user's overrides less those each point and round set."""
        return job_overrides(self.overrides)

    @property
    def reserve_jobs(self) -> int:
        """The jobs the race leaves the verification: its rounds, a side each."""
        return 2 * self.options.verify_rounds

    def run(self, ahead: Optional[JobProcess]) -> int:
        """Probe, prune, race, recommend and verify, then write the tune's files; 0 when a point was
        recommended. `ahead`: the job process started with the command, for the probe's first job."""
        probe = self._probe(ahead)
        notes: List[str] = []
        kept, pruned = self._space(probe, notes)
        points = {p.name: p for p in [*kept, *(d.point for d in pruned)]}
        print(f"tune: {len(kept)} point(s) race, {len(pruned)} pruned (reasons in tune.csv)", flush=True)
        outcome = self._race(kept, points, probe.job_s)
        equivalence = {name: self.chains.verdicts.get(p.chain, STRICTNESS[0]) for name, p in points.items()}
        chosen = recommend(outcome.rounds, outcome.survivors, {p.name: p.workers for p in kept}, self.objective,
                           equivalence) if outcome.survivors else None
        verification, pick_warning = "", ""
        if chosen is not None:
            verification, pick_warning = self._verify(chosen, points, outcome, probe, notes)
        tuned = Tuned(self.spec.transform_name, self.objective, self.request.budget_s,
                      time.monotonic() - self.started, points, pruned,
                      {name: predicted_rate(p, probe.models.get(p.chain)) for name, p in points.items()}, outcome,
                      chosen, {c: [r.summary for r in records] for c, records in probe.records.items() if records},
                      probe.verdicts, verification,
                      self.chains.configs.get(points[chosen.pick].chain) if chosen is not None else None, notes,
                      self.base, probe.warnings, pick_warning)
        print("\n" + write_tune(self.folder, tuned, self.request.config_dir or ""), end="")
        if chosen is None:
            report_error(f"tune: {outcome.stop}")
        print(results_line(self.folder))
        return 0 if chosen is not None else CRASH_EXIT_STATUS

    def _measure(self, where: Path, points: Sequence[Point], rounds: int, run_settings: Sequence[str],
                 ahead: Optional[JobProcess] = None, deadline: Optional[float] = None) -> Dict[str, List[JobResult]]:
        """Run the points' jobs, `rounds` interleaved rounds, in `where`, none started past `deadline`;
        each point's finished records."""
        for point in points:
            store_point(point)
        sweep = [*self.base, *run_settings, f"rounds={rounds}", point_override([p.name for p in points])]
        run_command(sweep, self.request.config_dir, ahead=ahead,
                    into=Into(where, stage=True, deadline=deadline))
        found: Dict[str, List[JobResult]] = {}
        for record in load_job_results(where):
            found.setdefault(str(record.choices.get(POINT_GROUP)), []).append(record)
        return found

    def _probe(self, ahead: Optional[JobProcess]) -> Probed:
        """Each chain once at workers=0 (with the thread profile where a thread backend may race)."""
        threads = any(BACKENDS[b].worker_kind == THREADS for b in self.dims.backends) and (
            self.options.workers is None or max(self.dims.workers) > 0)
        probe_points = [Point.probe(c, self.spec.loader.batch_size) for c in self.chains.names]
        print(f"tune: probing {len(self.chains.names)} chain(s) at workers=0 for the cost model"
              f"{' (with the thread profile)' if threads else ''}", flush=True)
        probe_started = time.monotonic()
        probed = self._measure(self.folder / PROBE_DIR, probe_points, 1,
                               round_settings(self.overrides, self.round_spec, 1.0, threads), ahead)
        job_s = (time.monotonic() - probe_started) / max(1, len(probe_points))
        records = {p.chain: probed.get(p.name, []) for p in probe_points}
        kept, verdicts = winning_chains(records, self.chains, self.options.max_chains)
        crashed = [c for c in self.chains.names if not records.get(c)]
        warnings = [crash_warning(c, PROBE_FAILED) for c in crashed]
        for warning in warnings:
            print(f"tune: warning: {warning}", flush=True)
        return Probed(records, job_s, kept, verdicts, crashed, warnings, _models(records))

    def _space(self, probe: Probed, notes: List[str]) -> Tuple[List[Point], List[Dropped]]:
        """The points that race (the model's ladder, pruned and cut to the budget, or the entrants a
        resumed tune recorded) and those pruned, each with its reason; its lines go to `notes`."""
        dims = self.dims
        if self.options.workers is None:
            ladder, why = _ladder(probe.models, probe.kept, usable_cores())
            if ladder:
                dims = dataclasses.replace(dims, workers=ladder)
                notes.append(why)
                print(f"tune: {why}", flush=True)
        kept, pruned = prune(grid(dataclasses.replace(dims, chains=tuple(probe.kept))), probe.models, self.cuda)
        if self.options.search != OPTUNA:
            # The verification's jobs, at the kept points' mean: it runs the pick beside the current settings.
            costs = [job_seconds(p, probe.job_s) for p in kept] or [probe.job_s]
            seconds = self.deadline - time.monotonic() - self.reserve_jobs * sum(costs) / len(costs)
            kept, cut = fit_budget(kept, probe.models, seconds,
                                   lambda p: self.options.rounds * job_seconds(p, probe.job_s))
            pruned += cut
        entrants = self._entrants(kept)
        if entrants != kept:
            names = {p.name for p in entrants}
            pruned = [d for d in pruned if d.point.name not in names]
        if one_point_note(entrants):
            notes.append(one_point_note(entrants))
            print(f"tune: {notes[-1]}", flush=True)
        return entrants, pruned

    def _entrants(self, kept: List[Point]) -> List[Point]:
        """The race's points: those a resumed tune recorded, else `kept`, recorded now."""
        recorded = self.state.entrants
        if isinstance(recorded, tuple):
            return [Point(**fields) for fields in recorded]
        update_state(self.folder, entrants=[dataclasses.asdict(p) for p in kept])
        return kept

    def _race(self, kept: Sequence[Point], points: Mapping[str, Point], job_s: float) -> RaceOutcome:
        """The race among `kept`, stage by stage, each stage's batch of rounds a sweep in `race-N/`."""
        batches = itertools.count(1)

        def measure(names: Sequence[str], rounds: int, length: float) -> Dict[str, List[Round]]:
            number = next(batches)
            print(f"tune: race {number}: {len(names)} point(s), {rounds} round(s) {length:g}x long", flush=True)
            found = self._measure(self.folder / RACE_DIR.format(number), [points[n] for n in names], rounds,
                                  round_settings(self.overrides, self.round_spec, length), deadline=self.deadline)
            return {name: [r.summary for r in records] for name, records in found.items()}

        propose = optuna_proposer(kept, self.objective, self.options.optuna_batch, self.options.seed) \
            if self.options.search == OPTUNA else None
        schedule = self.options.schedule(round_s=self.round_spec.run.min_time_s, job_s=job_s)
        entrants = Entrants([p.name for p in kept], {p.name: p.workers for p in kept},
                            {p.name: job_seconds(p, job_s) for p in kept})
        return run_race(entrants, measure, self.objective, schedule,
                        RaceLimit(self.deadline, reserve_jobs=self.reserve_jobs), propose=propose)

    def _verify(self, chosen: Recommendation, points: Mapping[str, Point], outcome: RaceOutcome, probe: Probed,
                notes: List[str]) -> Tuple[str, str]:
        """The verification's line and the pick's warning (a sibling of a crashed chain); the model's
        word on a missed target and the bottleneck line go to `notes`."""
        if not chosen.met and self.objective.target_starvation_pct is not None:
            notes.append(_model_needs(points[chosen.pick], probe.models, self.objective.target_starvation_pct))
        last_length = outcome.stages[-1].length if outcome.stages else 1.0
        current = current_point(self.spec).as_run(self.cuda)
        verification, mine = self._against_current(points[chosen.pick], current, outcome.job_s or probe.job_s,
                                                   round_settings(self.overrides, self.round_spec, last_length))
        note = _bottleneck(self.spec, current, mine or list(outcome.rounds.get(current.name, ())), probe.models)
        notes += [note] if note else []
        return verification, sibling_warning(points[chosen.pick].chain, probe.crashed, self.chains.moves)

    def _against_current(self, pick: Point, current: Point, job_s: float, run_settings: Sequence[str]
                         ) -> Tuple[str, List[Round]]:
        """The verification's line, and the current settings' rounds it measured (none where it did not
        run). It runs as many of tune.verify_rounds interleaved rounds a side as the time left holds."""
        if pick == current:
            return "verified: your settings are the recommended ones; nothing to change", []
        verify_rounds = self.options.verify_rounds
        if not verify_rounds:
            return "", []
        left = self.deadline - time.monotonic()
        rounds = min(verify_rounds, math.floor(left / (2 * job_s)))
        if rounds < 1:
            return (f"not verified against your settings: {max(left, 0):.0f} s of the budget are left and a round a "
                    f"side takes ~{2 * job_s:.0f} s; run both with `pipebench run ... rounds={verify_rounds}` "
                    "to see the gain"), []
        fewer = f" (of tune.verify_rounds={verify_rounds}: what the budget's {left:.0f} s left hold)" \
            if rounds < verify_rounds else ""
        print(f"tune: verifying {pick.name} against your settings ({current.name}), {rounds} interleaved rounds a "
              f"side{fewer}", flush=True)
        records = self._measure(self.folder / VERIFY_DIR, [current, pick], rounds, run_settings,
                                deadline=self.deadline)
        by_round = {name: {int(r.round or 0): race_rates([r.summary])[0] for r in records.get(name, [])}
                    for name in (current.name, pick.name)}
        mine = [r.summary for r in records.get(current.name, [])]
        if not by_round[current.name] or not by_round[pick.name]:
            if time.monotonic() >= self.deadline:
                return "not verified: the budget was spent before its jobs ran (the sweep's line names them)", mine
            return "not verified: a verification job failed (its line is above)", mine
        return verify_line(pick.name, current.name, by_round[current.name], by_round[pick.name]) + fewer, mine
