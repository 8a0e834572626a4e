"""The `storage-check` verb: an MLPerf Storage-style check with the preprocessing left in.

How many emulated accelerators this host and its storage feed at the workload's minimum AU,
through the user's own chain ([storage-check.md](../../docs/storage-check.md)). In order, each part
a sweep run as `pipebench run` runs one (a fresh process a job; N accelerators are N torchrun ranks,
each with its own loader and emulated step), in a folder of its own under the check's folder:
1. `search/nN-K/`: the search for the largest N whose every rank keeps the minimum AU
   (pipebench.storage_track.search), from the arithmetic's guess where the shared bandwidth is known;
2. `runs/`: at that N, 1 warm-up run and storage_check.runs runs (5), a new seed each;
3. `no-chain/`: the same N without the chain, where there is one: what the preprocessing costs.
Then verdict.json and report.md (pipebench.storage_track.files), and `results: <folder>`. A run that
fails or is interrupted keeps the runs that finished; the verdict says INVALID and why.
These are MLPerf Storage-style results, not MLPerf results.
"""

import argparse
import dataclasses
import itertools
import math
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import psutil

from pipebench.base.command import results_line
from pipebench.base.cores import usable_cores
from pipebench.base.errors import (
    USAGE_EXIT_STATUS,
    ConfigError,
    PipebenchError,
    error_line,
    report_error,
)
from pipebench.base.io import folder_safe
from pipebench.base.typed_json import parse
from pipebench.cli.common_args import add_config_dir, add_overrides
from pipebench.config.compose import job_spec_composer
from pipebench.config.specs import EMULATED, NO_CONSUMER, TRANSFORM_GROUP, JobSpec, RunSpec
from pipebench.measure.job_spawn import JobProcess
from pipebench.measure.memory import BYTES_PER_MB
from pipebench.record.figures import Summary
from pipebench.record.folder_lock import folder_lock
from pipebench.record.jobs import JobResult, edits_chain, override_key, override_pairs
from pipebench.record.results import load_job_results
from pipebench.record.resume import dated, new_folder
from pipebench.storage.dataset_contract import told
from pipebench.storage_track.files import NOT_MLPERF, CheckResult, Run, write_check
from pipebench.storage_track.held_back import HeldBack, Measured, held_back
from pipebench.storage_track.options import CheckOptions, split_check_overrides
from pipebench.storage_track.presets import (CUSTOM, DEFAULT_MIN_AU_PCT, MS_PER_S, Preset, custom_preset, preset,
                                             workload_listing)
from pipebench.storage_track.rules import (
    MEMORY_FACTOR,
    MIN_STEPS_PER_EPOCH,
    RUNS,
    Procedure,
    memory_rule,
    steps_rule,
    verdict,
)
from pipebench.storage_track.search import (
    FAILED_AU,
    Probe,
    SearchOutcome,
    judge_rounds,
    predicted_accelerators,
    search_accelerators,
)
from pipebench.sweep.expand import expand_sweep, import_from_cwd, refuse_hydra_dirs, search_path
from pipebench.sweep.launch import Into, Stopped, run_command

__all__ = ["add_parser", "main", "storage_check_command"]

SEARCH_DIR, RUNS_DIR, NO_CHAIN_DIR = "search", "runs", "no-chain"
# A search round's steps (at most run.steps): each N is judged on a short run, raced where it is close.
SEARCH_STEPS = 100
# A preset's data without a chain is a sample's raw bytes: only a consumer that reads no pixels takes it.
RAW_BYTES_CONSUMERS = (NO_CONSUMER, EMULATED)
# The transform rows that are no step of the chain: the dataset's load and the collate.
NOT_CHAIN_STAGES = ("load", "collate")

EPILOG = """\
examples:
  pipebench storage-check workload=resnet50 accelerator=h100 dataset.storage.shared_mb_per_s=500
  pipebench storage-check workload=resnet50 accelerator=h100 transform=imagenet   the preprocessing left in
  pipebench storage-check workload=custom consumer.step_ms=50 loader.batch_size=64 dataset=image_folder ...
  pipebench storage-check workload=unet3d accelerator=a100 storage_check.runs=2 run.steps=50   a quick look

workloads (accelerators): """ + workload_listing() + """
keys:   storage_check.runs=5, storage_check.max_accelerators=64, storage_check.min_au_pct (workload=custom, 90)
writes: verdict.json, report.md, and search/, runs/, no-chain/ as `run` writes them
""" + NOT_MLPERF + "."


def _preset(options: CheckOptions, spec: JobSpec) -> Preset:
    """The preset the options name; workload=custom's from the user's consumer and batch."""
    if options.workload == CUSTOM:
        return custom_preset(spec.consumer.step_ms, spec.loader.batch_size,
                             options.min_au_pct if options.min_au_pct is not None else DEFAULT_MIN_AU_PCT)
    if options.min_au_pct is not None:
        raise ConfigError("storage_check.min_au_pct is workload=custom's; a preset has its own minimum")
    return preset(options.workload, options.accelerator)


def _dataset_bytes(dataset: object) -> Optional[int]:
    """The dataset's size on storage, where it can say: generated samples' total, or its files' sizes."""
    total = getattr(dataset, "total_bytes", None)
    if callable(total):
        return int(total())
    paths = told(dataset).files()
    return sum(Path(p).stat().st_size for p in paths) if paths else None


def _chain(spec: JobSpec) -> str:
    """The chain's name as the verdict reads it: none when it has no step."""
    if not spec.per_sample and not spec.per_batch and not spec.on_device:
        return "none"
    return spec.transform_name if spec.transform_name != "none" else "custom"


def _run_of(record: JobResult, sample_bytes: Optional[float]) -> Run:
    """A finished run's figures; samples/s keeps the first batch's wait in the run's time (the rules do),
    and MiB/s is samples/s x the dataset's bytes a sample (a rank merge's row has no file-read columns)."""
    s = record.summary
    steady_s = s.steps * s.step_ms_mean / MS_PER_S
    first = s.first_batch_s
    rate = s.samples_per_s * steady_s / (steady_s + first) if steady_s > 0 else s.samples_per_s
    per_sample = sample_bytes if sample_bytes is not None else s.read_bytes_per_sample
    mb = rate * per_sample / BYTES_PER_MB if per_sample is not None else math.nan
    return Run(_seed(record), s.au_pct, rate, mb, first)


def _seed(record: JobResult) -> int:
    """The run's `run.seed`, from its stored config."""
    return int(parse(RunSpec, record.config["run"]).seed)


def _costliest(records: Sequence[JobResult]) -> Optional[Tuple[str, float]]:
    rows = [r for record in records for r in record.transform_rows if r.stage not in NOT_CHAIN_STAGES]
    if not rows:
        return None
    top = max(rows, key=lambda r: float(r.ms_per_sample or 0.0))
    return str(top.transform), float(top.ms_per_sample)


@dataclasses.dataclass(frozen=True)
class Sizing:
    """The dataset against the size rules: its length at N accelerators, whether the check sets it, the
    memory rule's miss ('' when met) and its bytes a sample (None when it cannot say)."""

    length_for: Callable[[int], int]
    sized: bool
    memory: str
    sample_bytes: Optional[float]


def _sizing(chosen: Preset, spec: JobSpec, length_given: bool, strict: bool, ram: int) -> Sizing:
    """A preset's generated data sized as mlpstorage sizes a workload's for a host (MEMORY_FACTOR x its
    memory, MIN_STEPS_PER_EPOCH steps an epoch on each of the N accelerators, never below DLIO's own
    count) unless the user gave dataset.length (`length_given`); any other dataset checked against the
    rules: too few samples for one accelerator is one line, under the memory rule refused under `strict`."""
    data = chosen.dataset
    if data is not None and not length_given:
        least = max(data.dataset_length, math.ceil(MEMORY_FACTOR * ram / data.sample_bytes))
        return Sizing(lambda n: max(least, MIN_STEPS_PER_EPOCH * chosen.batch_size * n), True, "", data.sample_bytes)
    # Imported here: it imports torch, which a preset's check leaves to its job processes.
    from pipebench.pipeline.build import build_dataset

    dataset = build_dataset(spec)
    length, size = len(dataset), _dataset_bytes(dataset)
    need = steps_rule(length, spec.loader.batch_size, 1)
    if need:
        raise ConfigError(f"the dataset's {length} samples are too few for {MIN_STEPS_PER_EPOCH} steps an epoch of "
                          f"{spec.loader.batch_size}: it needs {need} samples (x the accelerators)")
    memory = memory_rule(size, ram)
    if memory and strict:
        raise ConfigError(f"--rules strict: {memory}; a dataset {MEMORY_FACTOR}x the memory is the rule")
    return Sizing(lambda n: length, False, memory, size / length if size is not None else None)


class Check:
    """One check's sweeps: the jobs' overrides, how each N is sized, and running a sweep in a folder."""

    def __init__(self, folder: Path, base: List[str], config_dir: Optional[str], sizing: Sizing, steps: int,
                 ahead: Optional[JobProcess] = None) -> None:
        self.folder, self.base, self.config_dir = folder, base, config_dir
        # The job process started with the command, for the first sweep's first job; each later sweep starts its own.
        self.ahead = ahead
        self.length_for, self.sized = sizing.length_for, sizing.sized
        self.steps, self.sample_bytes = steps, sizing.sample_bytes
        self.rounds = itertools.count(1)
        # Each N's rounds as measured, kept for a search that is interrupted before it returns.
        self.measured: Dict[int, List[float]] = {}
        # Each N's finished rounds' summaries: what held the least N that missed back.
        self.summaries: Dict[int, List[Summary]] = {}

    def overrides(self, n: int, *extra: str) -> List[str]:
        sized = [f"dataset.length={self.length_for(n)}"] if self.sized else []
        return [*self.base, *sized, f"distributed.nproc={n}", *extra]

    def chainless(self, n: int) -> List[str]:
        """The overrides at N without the chain: the user's own `transform.*` keys go with it (they reach
        into the chain, so they would not compose with transform=none)."""
        kept = [o for o in self.overrides(n) if not edits_chain(o) and override_key(o) != TRANSFORM_GROUP]
        return [*kept, f"{TRANSFORM_GROUP}=none", "dataset.images=false", "run.seed=1"]

    def sweep(self, where: Path, overrides: Sequence[str]) -> Tuple[int, List[JobResult]]:
        ahead, self.ahead = self.ahead, None
        status = run_command(list(overrides), self.config_dir, ahead=ahead, into=Into(where, stage=True))
        return status, load_job_results(where) if where.exists() else []

    def measure(self, n: int, rounds: int) -> List[Optional[float]]:
        """The search's measure: `rounds` rounds at N = n, each a job; a failed one is None."""
        found: List[Optional[float]] = []
        for _ in range(rounds):
            number = next(self.rounds)
            print(f"storage-check: search: {n} accelerator(s), round {number}", flush=True)
            _, records = self.sweep(self.folder / SEARCH_DIR / f"n{n}-{number}",
                                    self.overrides(n, f"run.steps={min(self.steps, SEARCH_STEPS)}",
                                                   f"run.seed={number}"))
            found.append(records[0].summary.au_pct if records else None)
            self.summaries.setdefault(n, []).extend(r.summary for r in records[:1])
            self.measured.setdefault(n, []).append(FAILED_AU if found[-1] is None else found[-1])
        return found

    def what_held_back(self, search: SearchOutcome, shared: Optional[float]) -> Optional[HeldBack]:
        """What held back the least N the search found to miss above the N it found (None where none missed)."""
        missed = [p.accelerators for p in search.probes if not p.meets and p.accelerators > search.accelerators]
        if not missed:
            return None
        n = min(missed)
        measured = Measured(n, self.summaries.get(n, ()), self.summaries.get(n - 1, ()))
        return held_back(measured, self.sample_bytes, shared, usable_cores())

    def searched_so_far(self, min_au_pct: float) -> SearchOutcome:
        """The probes of a search stopped part way, each judged on the rounds it had; no N claimed."""
        return SearchOutcome(0, tuple(Probe(n, tuple(au), bool(judge_rounds(au, min_au_pct)))
                                      for n, au in self.measured.items()), False)


def storage_check_command(overrides: List[str], config_dir: Optional[str], strict: bool = False,
                          ahead: Optional[JobProcess] = None) -> int:
    """The check (module doc); 0 when it reached a verdict, an interruption's status when stopped, 2 when a
    sweep could not start part way (its line printed, the files written all the same). `ahead` is a job
    process started with the command, for the first job (its caller ends it if none runs)."""
    import_from_cwd()
    refuse_hydra_dirs(overrides)
    options, user = split_check_overrides(overrides)
    if options.workload is None:
        raise ConfigError(f"storage-check needs workload=...: {workload_listing()}")
    if len(expand_sweep([*search_path(config_dir), *user])) != 1:
        raise ConfigError("storage-check runs one setting: a sweep (a comma list) is not its to run")
    with job_spec_composer() as compose_one:
        first, _ = compose_one([*search_path(config_dir), *user])
        chosen = _preset(options, first)
        base = [*chosen.overrides(tuple(user)), *user]
        spec, results_dir = compose_one([*search_path(config_dir), *base])
    notes: List[str] = []
    if (spec.consumer.step_ms, spec.loader.batch_size) != (chosen.step_ms, chosen.batch_size):
        # The user's consumer.step_ms or loader.batch_size won over the preset's: the jobs ran theirs.
        notes.append(f"the preset's step and batch ({chosen.step_ms:g} ms, {chosen.batch_size}) overridden: "
                     f"{spec.consumer.step_ms:g} ms a batch of {spec.loader.batch_size}")
        chosen = dataclasses.replace(chosen, step_ms=spec.consumer.step_ms, batch_size=spec.loader.batch_size)
    if spec.consumer.kind != EMULATED:
        notes.append(f"consumer={spec.consumer.kind} in place of the emulated {chosen.step_ms:g} ms step: the "
                     "accelerator's step is the consumer's own")
    given = override_pairs(user)
    sizing = _sizing(chosen, spec, "dataset.length" in given, strict, psutil.virtual_memory().total)
    if sizing.memory:
        print(f"storage-check: {sizing.memory}: running with dataset.cache=cold, and the result says so", flush=True)
        base.append("dataset.cache=cold")
    steps_given = "run.steps" in given
    steps = spec.run.steps if steps_given else MIN_STEPS_PER_EPOCH
    shortened = tuple(line for line in (
        f"storage_check.runs={options.runs} of {RUNS}" if options.runs < RUNS else "",
        f"run.steps={steps}, under the rules' epoch of {MIN_STEPS_PER_EPOCH} steps" if steps < MIN_STEPS_PER_EPOCH
        else "") if line)
    shared = spec.storage.shared_mb_per_s
    predicted = None
    if shared is not None and sizing.sample_bytes:
        predicted = predicted_accelerators(shared, chosen.step_ms / MS_PER_S, chosen.batch_size, sizing.sample_bytes,
                                           chosen.min_au_pct)
    label = folder_safe(f"{chosen.workload}-{chosen.accelerator}")
    folder = new_folder(dated(results_dir, f"storage-check-{label}"))
    check = Check(folder, base if steps_given else [*base, f"run.steps={steps}"], config_dir,
                  sizing, steps, ahead)
    plan = CheckPlan(chosen, spec, options, shortened, sizing.memory, tuple(notes), predicted, shared,
                     tuple(overrides))
    with folder_lock(folder):
        return _check(check, plan)


@dataclasses.dataclass(frozen=True)
class CheckPlan:
    """What the verb settled before the first job: the preset as the jobs run it, and the N the shared
    link (`shared`, MiB/s) predicts."""

    chosen: Preset
    spec: JobSpec
    options: CheckOptions
    shortened: Tuple[str, ...]
    memory: str
    notes: Tuple[str, ...]
    predicted: Optional[int]
    shared: Optional[float]
    overrides: Tuple[str, ...]


def _without_chain(check: Check, plan: CheckPlan, n: int) -> Tuple[Optional[Run], str]:
    """The same N run once without the chain, or the reason it is not (the runs stand either way)."""
    consumer = plan.spec.consumer.kind
    if plan.chosen.dataset is None:
        return None, ("the same N without the chain is not measured: the dataset hands the chain images, which "
                      "need a chain to become tensors (a workload's preset hands tensors without one)")
    if consumer not in RAW_BYTES_CONSUMERS:
        return None, (f"the same N without the chain is not measured: consumer={consumer} needs pixels, and "
                      "without a chain the preset hands each sample's raw bytes")
    print(f"storage-check: {n} accelerator(s) without the chain", flush=True)
    try:
        code, plain = check.sweep(check.folder / NO_CHAIN_DIR, check.chainless(n))
    except PipebenchError as exc:
        return None, f"the same N without the chain did not run: {error_line(exc)}"
    if not plain:
        return None, (f"the same N without the chain failed (exit status {code}; its line is above, its files in "
                      f"{NO_CHAIN_DIR}/)")
    return _run_of(plain[0], check.sample_bytes), ""


def _check(check: Check, plan: CheckPlan) -> int:
    """The search, the runs and the no-chain run inside the check's locked folder; the files written
    whatever stopped it: an interruption, or a sweep that could not start (its one line, exit 2)."""
    chosen, options, notes = plan.chosen, plan.options, list(plan.notes)
    chain = _chain(plan.spec)
    status = 0
    failure = ""
    search = SearchOutcome(0, (), False)
    records: List[JobResult] = []
    without = None
    try:
        search = search_accelerators(check.measure, chosen.min_au_pct, plan.predicted or 1, options.max_accelerators)
        n = search.accelerators
        if n >= 1:
            seeds = ",".join(str(seed) for seed in range(options.runs + 1))
            print(f"storage-check: {n} accelerator(s): 1 warm-up run and {options.runs} runs", flush=True)
            code, records = check.sweep(check.folder / RUNS_DIR, check.overrides(n, f"run.seed={seeds}"))
            if code != 0:
                failure = f"a run failed (exit status {code}; its line is above, its files in {RUNS_DIR}/)"
            if chain != "none" and not failure:
                without, note = _without_chain(check, plan, n)
                notes.extend([note] if note else [])
    except (Stopped, PipebenchError) as stop:
        if isinstance(stop, Stopped):
            status, failure = stop.status, "interrupted"
        else:  # a sweep that could not start: the rounds and runs that finished are kept
            status, failure = USAGE_EXIT_STATUS, error_line(stop)
        if not search.probes:
            search = check.searched_so_far(chosen.min_au_pct)
        if not records and (check.folder / RUNS_DIR).exists():
            records = load_job_results(check.folder / RUNS_DIR)
    # Seed 0 is the warm-up.
    runs = tuple(_run_of(r, check.sample_bytes) for r in sorted(records, key=_seed) if _seed(r) > 0)
    # The chain's cost from the runs, or from the search's rounds where no N met the minimum.
    searched = [r for sub in sorted((check.folder / SEARCH_DIR).glob("n*")) for r in load_job_results(sub)] \
        if chain != "none" and not records and (check.folder / SEARCH_DIR).is_dir() else []
    costliest = _costliest(records or searched) if chain != "none" else None
    n = search.accelerators
    length = check.length_for(n)
    done = Procedure(accelerators=n, min_au_pct=chosen.min_au_pct, au_pct=tuple(r.au_pct for r in runs),
                     samples_per_s=tuple(r.samples_per_s for r in runs), runs_asked=options.runs, failure=failure,
                     preset=chosen.dataset is not None, chain=chain, shortened=plan.shortened, memory=plan.memory,
                     steps_needed=steps_rule(length, chosen.batch_size, n) if n else 0, notes=tuple(notes))
    result = CheckResult(chosen, chain, done, verdict(done), search, runs, without, costliest, plan.shared,
                         plan.predicted, plan.overrides, check.what_held_back(search, plan.shared),
                         plan.spec.consumer.kind)
    print("\n" + write_check(check.folder, result), end="")
    if status == USAGE_EXIT_STATUS:
        report_error(failure)
    print(results_line(check.folder))
    return status


def add_parser(verbs: "argparse._SubParsersAction") -> None:
    parser = verbs.add_parser(
        "storage-check", help="MLPerf Storage-style: how many emulated accelerators this host and storage feed "
                              "at the minimum AU, through your chain (not MLPerf results)",
        description="Find the most emulated accelerators (torchrun ranks, each with its own loader and the "
                    "workload's emulated step) whose every AU meets the workload's minimum, then run 1 warm-up "
                    "and 5 runs there, a new seed each, and the same N without the chain; write verdict.json "
                    "(CLOSED, OPEN or INVALID, with reasons) and report.md. " + NOT_MLPERF + ".",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_config_dir(parser)
    parser.add_argument("--rules", choices=("open", "strict"), default="open",
                        help="strict: refuse a dataset under 5x the host's memory; open (default): run it with "
                             "dataset.cache=cold and say so in the verdict")
    add_overrides(parser, "workload=resnet50 accelerator=h100 dataset.storage.shared_mb_per_s=500")


def main(args: argparse.Namespace) -> int:
    return storage_check_command(list(args.overrides), args.config_dir, args.rules == "strict", args.job_ahead)
