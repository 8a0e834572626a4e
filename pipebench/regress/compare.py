"""`pipebench compare BASELINE CURRENT`: per-job verdicts on two signals, throughput and CPU time
(docs/compare-and-nightly.md, "Two signals").

A change is real by the one rule of `pipebench.base.significance` (significant *and* past the
threshold), Holm-corrected across a comparison's jobs per signal, so a night of 8 jobs keeps its
chance of any false verdict at ALPHA, not 8 x ALPHA.

- **throughput**: samples/s of each repeat (of each round, paired, in an A/B session);
- **CPU time**: the thread CPU ms a sample of each round. Other tenants move wall time a lot and CPU
  time little, but not nothing; where both runs carry the CPU reference in every round
  (`calibrate=true`, `reference_cpu_ms`), the signal is CPU ms a sample *per reference ms*, which a
  busier host leaves where it was and a dearer chain moves (pipebench.pipeline.cpu_reference).

A real change of CPU time is a pipeline change (`slower` / `faster`); of throughput alone, `wall only`:
the host, not the pipeline. Without CPU time on both sides (older results, or fewer than MIN_CPU_ROUNDS
rounds a side) throughput decides alone, and a change that goes with more of other tenants' CPU load
(`host_other_cpu_cores`) is `host busier`. Where both runs carry a calibration.json, throughput is
judged raw and calibration-normalised and called only where the two agree; where one says `no change`
the signal reads `no change`, otherwise `noisy`. `flagged_by` says which signal called it.
"""
from dataclasses import astuple, dataclass, field, fields, replace
from pathlib import Path
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from pipebench.base.csv_cells import csv_table
from pipebench.base.errors import PipebenchError
from pipebench.base.io import write_text_atomic
from pipebench.base.significance import (
    ALPHA,
    BOOTSTRAP_SEED,
    DOWN,
    MIN_SAMPLES,
    N_BOOTSTRAP,
    UP,
    Change,
    holm,
    measure_change,
)
from pipebench.base.typed_json import parse
from pipebench.measure.host_load import OTHER_LOAD_NOTE_SHARE
from pipebench.model.judging import DEFAULT_THRESHOLD, FASTER, INCOMPARABLE, NO_CHANGE, NOISY, SLOWER
from pipebench.record.jobs import JobResult, override_pairs, varying_keys
from pipebench.record.sections import Fingerprint, PassRecord
from pipebench.record.results import (
    CALIBRATION_FILE,
    JOB_RESULT_GLOB,
    SUMMARY_CSV,
    Calibration,
    flat_config,
    load_job_results,
    read_calibration,
)

# The per-job A/A false `faster`/`slower` rate this module claims at 5 repeats and <= 5% CV.
CLAIMED_FALSE_ALARM_RATE = 0.01

# A job label's keys when no override tells the jobs apart (one job): what a reader names a job by.
FALLBACK_LABEL_KEYS = ("transform", "workers")
# CPU time is one figure a round (result.json): fewer rounds than this a side have no spread to
# test, so such a comparison runs on throughput alone.
MIN_CPU_ROUNDS = MIN_SAMPLES

# Fingerprint fields that must agree between a baseline job and a current job.
FINGERPRINT_FIELDS = ("torch", "cpu_model", "usable_cores", "dataset")
# Config keys that legitimately differ between two runs of the same job: where results go,
# progress bars, and how many rounds the invocation ran (each round is one more sample).
CONFIG_IGNORED = ("run.round", "results_dir", "run.progress", "rounds", "calibrate")

# Throughput changed for real while CPU time a sample held: the host, not the pipeline.
WALL_ONLY = "wall only"
# No CPU time to tell, but the slower side ran beside more of other tenants' load: the host.
HOST_BUSIER = "host busier"
VERDICTS = (SLOWER, FASTER, WALL_ONLY, HOST_BUSIER, NOISY, NO_CHANGE, INCOMPARABLE)
# Which job verdict names a whole comparison: one slower job is a regression whatever the rest did (as the
# exit status says), a job that could not be judged comes before any good news, and "faster" only when no
# job is unsettled; "no change" only when every judged job held.
VERDICT_PRECEDENCE = (SLOWER, INCOMPARABLE, NOISY, WALL_ONLY, HOST_BUSIER, FASTER, NO_CHANGE)
# Which signal called a job's verdict.
SIGNAL_CPU, SIGNAL_WALL, SIGNAL_BOTH, SIGNAL_HOST = "cpu", "wall", "cpu+wall", "wall+host load"
# Other tenants' load a side must carry beyond the other's, as a share of the host's CPUs, for a
# throughput change to be put down to the host: the share from which a row's own note already
# warns that a rerun can move past its interval (pipebench.measure.host_load).
HOST_LOAD_GAP_SHARE = OTHER_LOAD_NOTE_SHARE
# Exit statuses of compare_main.
EXIT_OK, EXIT_REGRESSION, EXIT_INCOMPARABLE = 0, 1, 2

CSV_COLUMNS = ("job", "baseline_samples_per_s", "current_samples_per_s", "ratio", "ratio_ci_low",
               "ratio_ci_high", "normalised_ratio", "starvation_change_pts", "p_value", "verdict",
               "baseline_repeats", "current_repeats", "mismatch", "wall_verdict", "baseline_cpu_ms_per_sample",
               "current_cpu_ms_per_sample", "cpu_ratio", "cpu_ratio_ci_low", "cpu_ratio_ci_high", "cpu_p_value",
               "cpu_verdict", "flagged_by", "moved_transform", "full_job", "baseline_host_other_cores",
               "current_host_other_cores", "baseline_reference_cpu_ms", "current_reference_cpu_ms", "cpu_ratio_of")
# What compare.csv's cpu_ratio is a ratio of.
CPU_RATIO_RAW, CPU_RATIO_PER_REFERENCE = "cpu ms a sample", "cpu ms a sample per reference ms"
# The CPU reference's version in results written before they recorded it (the median of its runs).
FIRST_REFERENCE_VERSION = 1.0


class CompareError(PipebenchError):
    """The two runs cannot be compared: not a results folder, mismatched fingerprints, no common jobs."""


@dataclass(frozen=True)
class JobRuns:
    """One job of a run, its rounds merged: one entry per repeat (pass)."""

    label: str
    samples_per_s: Tuple[float, ...]
    starvation_pct: Tuple[float, ...]
    config: Mapping[str, object]
    fingerprint: Mapping[str, object]
    # One entry a round (result.json): its round number, samples/s of its passes pooled, CPU ms a
    # sample (NaN where the result predates the signal); and each transform's median ms a sample.
    rounds: Tuple[int, ...] = ()
    round_samples_per_s: Tuple[float, ...] = ()
    cpu_ms_per_sample: Tuple[float, ...] = ()
    transform_ms: Mapping[str, float] = field(default_factory=dict)
    overrides: Tuple[str, ...] = ()
    # Other processes' CPU on the host during each round's window (cores; NaN where not measured).
    host_other_cores: Tuple[float, ...] = ()
    # The CPU reference's thread CPU ms in each round (NaN where it did not run), and the version of
    # that figure (pipebench.pipeline.cpu_reference.REFERENCE_VERSION; 1 where the result predates it).
    reference_cpu_ms: Tuple[float, ...] = ()
    reference_version: Tuple[float, ...] = ()

    @property
    def has_cpu(self) -> bool:
        """CPU time in every round, and rounds enough (MIN_CPU_ROUNDS) to have a spread."""
        return len(self.cpu_ms_per_sample) >= MIN_CPU_ROUNDS and all(np.isfinite(self.cpu_ms_per_sample))

    @property
    def has_reference(self) -> bool:
        """The CPU reference beside every round that has CPU time."""
        return (self.has_cpu and len(self.reference_cpu_ms) == len(self.cpu_ms_per_sample)
                and all(np.isfinite(self.reference_cpu_ms)))

    def cpu_per_reference(self) -> Tuple[float, ...]:
        """Each round's CPU ms a sample over its reference ms: the chain's cost in the host's units of the moment."""
        return tuple(c / r for c, r in zip(self.cpu_ms_per_sample, self.reference_cpu_ms))


@dataclass(frozen=True)
class Run:
    """A results folder: its jobs by label, and its calibration when it has one."""

    path: Path
    jobs: Mapping[str, JobRuns]
    calibration: Optional[Calibration]


@dataclass(frozen=True)
class JobComparison:
    """One job's baseline-vs-current figures and verdict; NaN where a side is missing. The fields are
    compare.csv's columns, in their order (CSV_COLUMNS)."""

    job: str
    baseline_samples_per_s: float
    current_samples_per_s: float
    ratio: float
    ci_low: float
    ci_high: float
    normalised_ratio: float
    starvation_change_pts: float
    p_value: float
    verdict: str
    baseline_repeats: int
    current_repeats: int
    mismatch: Tuple[str, ...]
    wall_verdict: str = INCOMPARABLE
    baseline_cpu_ms: float = float("nan")
    current_cpu_ms: float = float("nan")
    cpu_ratio: float = float("nan")
    cpu_ci_low: float = float("nan")
    cpu_ci_high: float = float("nan")
    cpu_p_value: float = float("nan")
    cpu_verdict: str = INCOMPARABLE
    flagged_by: str = ""
    moved_transform: str = ""
    full_job: str = ""
    baseline_host_other_cores: float = float("nan")
    current_host_other_cores: float = float("nan")
    baseline_reference_ms: float = float("nan")
    current_reference_ms: float = float("nan")


@dataclass(frozen=True)
class Comparison:
    """All jobs of two runs compared; `mismatch` lists the differing fingerprint/config fields."""

    baseline: Path
    current: Path
    threshold: float
    jobs: Tuple[JobComparison, ...]
    mismatch: Tuple[str, ...]
    allow_mismatch: bool
    normalised: bool
    # False when a job on either side lacks CPU time: throughput alone decides; `cpu_missing` says why.
    cpu_signal: bool = True
    paired: bool = False
    cpu_missing: str = ""
    # True when the CPU signal is CPU time per reference ms (every round of both sides carries it).
    cpu_per_reference: bool = False

    def counts(self) -> Dict[str, int]:
        return {v: sum(j.verdict == v for j in self.jobs) for v in VERDICTS}

    @property
    def verdict(self) -> str:
        """The whole comparison's word: the first of VERDICT_PRECEDENCE that any job got."""
        counts = self.counts()
        return next((v for v in VERDICT_PRECEDENCE if counts[v]), INCOMPARABLE)


def _rate(passes: Sequence[PassRecord]) -> float:
    """samples/s over the passes together."""
    return 1000.0 * float(sum(sum(p.samples) for p in passes)) / float(sum(sum(p.step_ms) for p in passes))


def comparable_config(config: Mapping[str, object]) -> Dict[str, object]:
    """The resolved config as dotted keys, minus the keys that may differ between runs."""
    return {k: v for k, v in flat_config(config).items()
            if not any(k == ign or k.startswith(ign + ".") for ign in CONFIG_IGNORED)}


def _at_least_zero(value: Optional[float]) -> float:
    """A summary figure at or above 0, NaN where the row lacks it."""
    return float(value) if value is not None and value >= 0 else float("nan")


def _positive(value: Optional[float]) -> float:
    figure = _at_least_zero(value)
    return figure if figure > 0 else float("nan")


def _transform_ms(records: Sequence[JobResult]) -> Dict[str, float]:
    per: Dict[str, List[float]] = {}
    for record in records:
        for row in record.transform_rows:
            per.setdefault(f"{row.stage}:{row.transform}", []).append(float(row.ms_per_sample))
    return {name: float(np.median(values)) for name, values in per.items()}


def _job_runs(label: str, records: Sequence[JobResult]) -> JobRuns:
    passes = [p for r in records for p in r.pass_records]
    return JobRuns(
        label=label,
        samples_per_s=tuple(_rate([p]) for p in passes),
        starvation_pct=tuple(100.0 * sum(p.wait_ms) / sum(p.step_ms) for p in passes),
        config=records[0].config,
        fingerprint=records[0].fingerprint,
        rounds=tuple(r.round or 0 for r in records),  # one round (no run.round override) is round 0
        round_samples_per_s=tuple(_rate(r.pass_records) for r in records),
        cpu_ms_per_sample=tuple(_positive(r.summary.cpu_ms_per_sample) for r in records),
        transform_ms=_transform_ms(records),
        overrides=records[0].overrides,
        host_other_cores=tuple(_at_least_zero(r.summary.host_other_cpu_cores) for r in records),
        reference_cpu_ms=tuple(_positive(r.summary.reference_cpu_ms) for r in records),
        reference_version=tuple(_reference_version(r) for r in records),
    )


def _reference_version(record: JobResult) -> float:
    version = _at_least_zero(record.summary.reference_version)
    return FIRST_REFERENCE_VERSION if np.isnan(version) else version


def _results_folder(path: str) -> Path:
    folder = Path(path)
    if folder.name == SUMMARY_CSV or folder.is_file():
        folder = folder.parent
    if not folder.is_dir() or not any(folder.glob(JOB_RESULT_GLOB)):
        raise CompareError(f"{path}: not a results folder (no {JOB_RESULT_GLOB})")
    return folder


def load_run(path: str, *more: str) -> Run:
    """Read one results folder (or its summary.csv), or several whose rounds make one run (an A/B
    side runs each round as its own invocation): every job's repeats, rounds and CPU time.

    Pass step times are positive and results whole: `read_result` refuses any other file.
    """
    folders = [_results_folder(p) for p in (path, *more)]
    records = [record for folder in folders for record in load_job_results(folder)]
    calibration = folders[0] / CALIBRATION_FILE
    return run_of_records(folders[0], records,
                          read_calibration(calibration) if len(folders) == 1 and calibration.is_file() else None)


def run_of_records(path: Path, records: Sequence[JobResult], calibration: Optional[Calibration] = None) -> Run:
    """A run of records already loaded (the Python API's results), grouped by job as `load_run` groups them."""
    grouped: Dict[str, List[JobResult]] = {}
    for record in records:
        grouped.setdefault(record.key.label, []).append(record)
    jobs = {label: _job_runs(label, group) for label, group in grouped.items()}
    return Run(path, jobs, calibration)


def fingerprint_mismatch(baseline: JobRuns, current: JobRuns) -> Tuple[str, ...]:
    """Names of the fingerprint fields and `config.<key>`s that differ between two runs of a job."""
    fields = [f for f in FINGERPRINT_FIELDS if baseline.fingerprint.get(f) != current.fingerprint.get(f)]
    b, c = comparable_config(baseline.config), comparable_config(current.config)
    fields += [f"config.{k}" for k in sorted(set(b) | set(c)) if b.get(k) != c.get(k)]
    return tuple(fields)


def _calibration_factor(baseline: Optional[Calibration], current: Optional[Calibration]) -> Optional[float]:
    """Multiply a raw current/baseline throughput ratio by this to remove machine speed.

    Calibration is a time: a machine 10% slower (throughput x0.9) has score_s x1/0.9, so
    current/baseline score is 1/0.9 and raw 0.9 x 1/0.9 = 1.0.
    """
    if baseline is None or current is None:
        return None
    return current.score_s / baseline.score_s


def _bootstrap_factors(baseline: Optional[Calibration], current: Optional[Calibration]) -> np.ndarray:
    """Resampled calibration factors, so the interval carries the calibration's own noise."""
    rng = np.random.default_rng(BOOTSTRAP_SEED)

    def medians(cal: Calibration) -> np.ndarray:
        if len(cal.samples_s) < 2:
            return np.full(N_BOOTSTRAP, cal.score_s)
        s = np.asarray(cal.samples_s)
        return np.median(rng.choice(s, size=(N_BOOTSTRAP, len(s))), axis=1)
    if baseline is None or current is None:
        return np.ones(N_BOOTSTRAP)
    return medians(current) / medians(baseline)


def _agreed(raw: str, normalised: str) -> str:
    """One verdict from the raw and the calibration-normalised one (module docstring)."""
    if raw == normalised:
        return raw
    return NO_CHANGE if NO_CHANGE in (raw, normalised) else NOISY


def _named(direction: str, up: str, down: str) -> str:
    return {UP: up, DOWN: down}.get(direction, direction)


def job_verdict(wall: str, cpu: Optional[str]) -> Tuple[str, str]:
    """The job's verdict and the signal that called it, from the two signals' verdicts (module
    docstring): CPU time decides a pipeline change; throughput alone is `wall only`."""
    if cpu is None:
        return wall, SIGNAL_WALL if wall in (SLOWER, FASTER) else ""
    if cpu in (SLOWER, FASTER):
        return cpu, SIGNAL_BOTH if wall == cpu else SIGNAL_CPU
    if wall in (SLOWER, FASTER):
        return WALL_ONLY, SIGNAL_WALL
    return (NOISY if NOISY in (wall, cpu) else NO_CHANGE), ""


def _median_load(job: JobRuns) -> float:
    loads = [x for x in job.host_other_cores if np.isfinite(x)]
    return float(np.median(loads)) if loads else float("nan")


def _host_busier(verdict: str, baseline: JobRuns, current: JobRuns) -> bool:
    """A throughput verdict the host's other load explains: the slower side ran beside at least
    HOST_LOAD_GAP_SHARE of the host's CPUs more of other tenants' load than the faster side."""
    if verdict not in (SLOWER, FASTER):
        return False
    host = parse(Fingerprint, current.fingerprint)
    cpus = host.cpu_count or host.usable_cores or 1
    slower, faster = (current, baseline) if verdict == SLOWER else (baseline, current)
    gap = _median_load(slower) - _median_load(faster)
    return bool(np.isfinite(gap)) and gap >= HOST_LOAD_GAP_SHARE * float(cpus)


def _moved_transform(baseline: JobRuns, current: JobRuns) -> str:
    """The transform whose time a sample moved most (ms), e.g. `per_sample:Decode +0.41 ms`."""
    common = set(baseline.transform_ms) & set(current.transform_ms)
    if not common:
        return ""
    name = max(common, key=lambda n: abs(current.transform_ms[n] - baseline.transform_ms[n]))
    return f"{name} {current.transform_ms[name] - baseline.transform_ms[name]:+.3g} ms"


def _paired(baseline: JobRuns, current: JobRuns) -> bool:
    """Rounds that pair one to one: the same round numbers, each once, on both sides."""
    return (len(set(baseline.rounds)) == len(baseline.rounds) > 1
            and sorted(baseline.rounds) == sorted(current.rounds))


def _by_round(job: JobRuns, values: Sequence[float]) -> List[float]:
    return [v for _, v in sorted(zip(job.rounds, values))]


@dataclass(frozen=True)
class _Measured:
    """One job's changes before Holm's correction: throughput raw and normalised, and CPU time."""

    wall: Change
    normalised: Optional[Change]
    cpu: Optional[Change]
    cpu_normalised: Optional[Change]


def _measure(baseline: JobRuns, current: JobRuns, threshold: float, factor: Optional[float],
             factors: np.ndarray, paired: bool, use_cpu: bool, per_reference: bool) -> _Measured:
    pair = paired and _paired(baseline, current)
    if pair:
        b, c = _by_round(baseline, baseline.round_samples_per_s), _by_round(current, current.round_samples_per_s)
    else:
        b, c = list(baseline.samples_per_s), list(current.samples_per_s)
    wall = measure_change(b, c, threshold, pair)
    normalised = None if factor is None else measure_change(b, c, threshold, pair, factor, factors)
    cpu = cpu_normalised = None
    if use_cpu:
        cb, cc = baseline.cpu_ms_per_sample, current.cpu_ms_per_sample
        if per_reference:
            cb, cc = baseline.cpu_per_reference(), current.cpu_per_reference()
        if pair:
            cb, cc = _by_round(baseline, cb), _by_round(current, cc)
        cpu = measure_change(cb, cc, threshold, pair)
        # A machine whose clock is slower spends more CPU time on the same work: the calibration
        # (a time) divides it out, as it multiplies throughput. The reference, timed beside each
        # round, has divided it out already, and at the moment it applied.
        if factor is not None and not per_reference:
            cpu_normalised = measure_change(cb, cc, threshold, pair, 1 / factor, 1 / factors)
    return _Measured(wall, normalised, cpu, cpu_normalised)


def _judged(baseline: JobRuns, current: JobRuns, m: _Measured, p: Mapping[str, float], mismatch: Tuple[str, ...],
            allow_mismatch: bool) -> JobComparison:
    """The job's verdicts from its changes and their Holm-corrected p-values (`p`, by _Measured's field)."""
    wall = _named(m.wall.direction(p["wall"]), FASTER, SLOWER)
    if m.normalised is not None:
        wall = _agreed(wall, _named(m.normalised.direction(p["normalised"]), FASTER, SLOWER))
    # CPU time is a cost: up is slower.
    cpu = None if m.cpu is None else _named(m.cpu.direction(p["cpu"]), SLOWER, FASTER)
    if m.cpu_normalised is not None:
        cpu = _agreed(cpu, _named(m.cpu_normalised.direction(p["cpu_normalised"]), SLOWER, FASTER))
    verdict_, flagged = job_verdict(wall, cpu)
    if cpu is None and _host_busier(verdict_, baseline, current):
        verdict_, flagged = HOST_BUSIER, SIGNAL_HOST
    if mismatch and not allow_mismatch:
        verdict_, flagged = INCOMPARABLE, ""
    nan = float("nan")
    starvation = float(np.median(current.starvation_pct) - np.median(baseline.starvation_pct))
    cpu_median = lambda j: float(np.median(j.cpu_ms_per_sample)) if j.has_cpu else nan  # noqa: E731
    return JobComparison(
        baseline.label, float(np.median(baseline.samples_per_s)), float(np.median(current.samples_per_s)),
        m.wall.ratio, m.wall.ci_low, m.wall.ci_high, m.normalised.ratio if m.normalised else nan, starvation,
        p["wall"], verdict_, len(baseline.samples_per_s), len(current.samples_per_s), mismatch,
        wall_verdict=wall, baseline_cpu_ms=cpu_median(baseline), current_cpu_ms=cpu_median(current),
        cpu_ratio=m.cpu.ratio if m.cpu else nan, cpu_ci_low=m.cpu.ci_low if m.cpu else nan,
        cpu_ci_high=m.cpu.ci_high if m.cpu else nan, cpu_p_value=p["cpu"], cpu_verdict=cpu or "",
        flagged_by=flagged, moved_transform=_moved_transform(baseline, current), full_job=baseline.label,
        baseline_host_other_cores=_median_load(baseline), current_host_other_cores=_median_load(current),
        baseline_reference_ms=_median_reference(baseline), current_reference_ms=_median_reference(current))


def _median_reference(job: JobRuns) -> float:
    return float(np.median(job.reference_cpu_ms)) if job.has_reference else float("nan")


def _one_sided(label: str, baseline: Optional[JobRuns], current: Optional[JobRuns]) -> JobComparison:
    """A job present in one run only: `incomparable`, with the side it has."""
    nan = float("nan")
    med = lambda j: float(np.median(j.samples_per_s)) if j else nan  # noqa: E731
    count = lambda j: len(j.samples_per_s) if j else 0  # noqa: E731
    return JobComparison(label, med(baseline), med(current), nan, nan, nan, nan, nan, nan, INCOMPARABLE,
                         count(baseline), count(current), (), full_job=label)


def short_labels(jobs: Sequence[JobRuns]) -> Dict[str, str]:
    """Each job's label cut to the overrides that tell the jobs apart (`transform=yuv_mask,workers=2`
    rather than every setting of the suite), FALLBACK_LABEL_KEYS for a lone job; the full label
    where the cut ones would not be distinct or not exist."""
    pairs = {j.label: override_pairs(j.overrides) for j in jobs}
    varying = sorted(varying_keys(list(pairs.values()))) or list(FALLBACK_LABEL_KEYS)
    short = {label: ",".join(f"{k}={p[k]}" for k in varying if k in p) for label, p in pairs.items()}
    if len(set(short.values())) < len(short) or not all(short.values()):
        return {j.label: j.label for j in jobs}
    return short


def compare_runs(baseline: Run, current: Run, threshold: float = DEFAULT_THRESHOLD,
                 allow_mismatch: bool = False, paired: bool = False) -> Comparison:
    """Compare every job of two runs, on throughput and on CPU time, Holm-corrected across jobs per
    signal. `paired`: the rounds were measured side by side (an A/B session), so round k of one
    side pairs with round k of the other. The interval and p shown are the raw throughput's."""
    factor = _calibration_factor(baseline.calibration, current.calibration)
    factors = _bootstrap_factors(baseline.calibration, current.calibration)
    both = sorted(set(baseline.jobs) & set(current.jobs))
    use_cpu = bool(both) and all(side.jobs[label].has_cpu for label in both for side in (baseline, current))
    # One version of the reference on both sides: a round figure of another meaning would read as a change.
    versions = {v for label in both for side in (baseline, current) for v in side.jobs[label].reference_version}
    per_reference = use_cpu and len(versions) <= 1 and all(side.jobs[label].has_reference for label in both
                                                           for side in (baseline, current))
    measured = {label: _measure(baseline.jobs[label], current.jobs[label], threshold, factor, factors, paired, use_cpu,
                                per_reference) for label in both}
    corrected = {f.name: dict(zip(both, holm([getattr(measured[k], f.name).p_value if getattr(measured[k], f.name)
                                              else float("nan") for k in both]))) for f in fields(_Measured)}
    labels = short_labels([*baseline.jobs.values(), *(j for k, j in current.jobs.items() if k not in baseline.jobs)])
    results, mismatch = [], []
    for label in sorted(set(baseline.jobs) | set(current.jobs)):
        if label not in measured:
            job = _one_sided(label, baseline.jobs.get(label), current.jobs.get(label))
        else:
            job_mismatch = fingerprint_mismatch(baseline.jobs[label], current.jobs[label])
            mismatch += [f for f in job_mismatch if f not in mismatch]
            p = {name: by_label[label] for name, by_label in corrected.items()}
            job = _judged(baseline.jobs[label], current.jobs[label], measured[label], p, job_mismatch, allow_mismatch)
        results.append(replace(job, job=labels.get(label, label)))
    missing = "" if use_cpu else _cpu_missing([side.jobs[label] for label in both for side in (baseline, current)])
    return Comparison(baseline.path, current.path, threshold, tuple(results), tuple(mismatch),
                      allow_mismatch, factor is not None, use_cpu, paired, missing, per_reference)


def checked_comparison(baseline: Run, current: Run, threshold: float = DEFAULT_THRESHOLD,
                       allow_mismatch: bool = False) -> Comparison:
    """`compare_runs`, refused (CompareError) when the runs share no job or, unless allowed, their
    fingerprints differ: what the `compare` verb and the Python API both judge."""
    comparison = compare_runs(baseline, current, threshold, allow_mismatch)
    if not any(j.baseline_repeats and j.current_repeats for j in comparison.jobs):
        raise CompareError(f"no job in common between {baseline.path} and {current.path}")
    if comparison.mismatch and not allow_mismatch:
        raise CompareError(f"fingerprints differ in {', '.join(comparison.mismatch)} "
                           "(allowing the mismatch compares anyway: --allow-mismatch)")
    return comparison


def _cpu_missing(jobs: Sequence[JobRuns]) -> str:
    """Why the CPU-time signal is off, and what brings it back."""
    if any(not np.isfinite(ms) for job in jobs for ms in job.cpu_ms_per_sample):
        return "CPU time a sample missing from a side (results written before the CPU-time signal)"
    fewest = min((len(job.cpu_ms_per_sample) for job in jobs), default=0)
    return (f"CPU time a sample is one figure a round, and a side has {fewest} round(s) of a job, fewer than the "
            f"{MIN_CPU_ROUNDS} its test needs; measure with rounds=N, N >= {MIN_CPU_ROUNDS}, to compare CPU time")


def _fmt(x: float, spec: str) -> str:
    return "n/a" if np.isnan(x) else format(x, spec)


def _signals_line(comparison: Comparison) -> str:
    if not comparison.cpu_signal:
        return (f"{comparison.cpu_missing}. Compared on throughput alone; `{HOST_BUSIER}`: throughput moved and the "
                f"slower side ran beside more of other tenants' CPU load (>= {HOST_LOAD_GAP_SHARE:.0%} of the "
                "host's CPUs more), so the host, not the pipeline.")
    pairing = "rounds paired (one A/B session)" if comparison.paired else "rounds unpaired"
    cpu = ("CPU time a sample per ms of the CPU reference timed beside it in the workers (a busier host moves "
           "both, a dearer chain only the first)" if comparison.cpu_per_reference else
           "CPU time a sample (the CPU reference is not in every round of both sides, in one version: "
           "calibrate=true runs it, a chain too cheap for 3 runs of it in its window gets none, and a run "
           "stored by an older pipebench may carry another version; with it, a busier host is told from a "
           "dearer chain)")
    return (f"Signals: throughput and {cpu}, each Holm-corrected across {len(comparison.jobs)} jobs "
            f"(alpha {ALPHA}), {pairing}. `wall only`: throughput moved, CPU time held; the host, not the pipeline.")


def render_markdown(comparison: Comparison) -> str:
    """A pull-request comment: a verdict-count header, notes, one row a job."""
    counts = ", ".join(f"{n} {v}" for v, n in comparison.counts().items() if n)
    lines = [f"**pipebench compare**: {counts} (threshold {comparison.threshold:.0%}, "
             f"throughput verdicts on {'raw and calibration-normalised ratios agreeing' if comparison.normalised else 'raw ratios'})", ""]
    if comparison.mismatch:
        state = "compared anyway (--allow-mismatch)" if comparison.allow_mismatch else "not compared"
        lines += [f"> **WARNING: fingerprint mismatch, {state}:** {', '.join(comparison.mismatch)}", ""]
    if not comparison.normalised and not comparison.paired:
        lines += ["Normalised ratios unavailable: calibration.json missing from a run.", ""]
    lines += [_signals_line(comparison), "",
              f"baseline: `{comparison.baseline}`  ", f"current: `{comparison.current}`", "",
              "| job | baseline samples/s | current samples/s | ratio (95% CI) | normalised | "
              "starvation Δ (pts) | p | CPU ms a sample | CPU ratio (95% CI) | verdict | flagged by | moved most |",
              "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---|---|"]
    for j in comparison.jobs:
        ratio = "n/a" if np.isnan(j.ratio) else f"{j.ratio:.3f} ({j.ci_low:.3f}–{j.ci_high:.3f})"
        cpu_ratio = "n/a" if np.isnan(j.cpu_ratio) else f"{j.cpu_ratio:.3f} ({j.cpu_ci_low:.3f}–{j.cpu_ci_high:.3f})"
        cpu = f"{_fmt(j.baseline_cpu_ms, '.3g')} → {_fmt(j.current_cpu_ms, '.3g')}"
        lines.append(f"| `{j.job}` | {_fmt(j.baseline_samples_per_s, '.1f')} | {_fmt(j.current_samples_per_s, '.1f')} "
                     f"| {ratio} | {_fmt(j.normalised_ratio, '.3f')} | {_fmt(j.starvation_change_pts, '+.1f')} "
                     f"| {_fmt(j.p_value, '.3f')} | {cpu} | {cpu_ratio} | {j.verdict} | {j.flagged_by or '-'} "
                     f"| {j.moved_transform or '-'} |")
    return "\n".join(lines) + "\n"


def render_csv(comparison: Comparison) -> str:
    """One row a job, CSV_COLUMNS: JobComparison's fields in their order, then what cpu_ratio is a ratio of."""
    ratio_of = CPU_RATIO_PER_REFERENCE if comparison.cpu_per_reference else CPU_RATIO_RAW
    return csv_table(CSV_COLUMNS, ([*(";".join(v) if isinstance(v, tuple) else v for v in astuple(j)), ratio_of]
                                   for j in comparison.jobs))


def write_comparison(comparison: Comparison, out_dir: str) -> Tuple[Path, Path]:
    """Write compare.md and compare.csv under out_dir; return their paths."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    md, csv_path = out / "compare.md", out / "compare.csv"
    write_text_atomic(md, render_markdown(comparison))
    write_text_atomic(csv_path, render_csv(comparison))
    return md, csv_path
