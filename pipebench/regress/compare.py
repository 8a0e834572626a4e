"""`pipebench compare BASELINE CURRENT`: per-job throughput ratios, confidence intervals and verdicts.

Verdict rule for one job, in the manner of asv (significant *and* larger than a factor):

- `significant` = the bootstrap CI of the ratio excludes 1 **and** Mann–Whitney p < ALPHA;
- `faster` / `slower`: significant and |ratio − 1| > threshold;
- `noisy`: not flagged, but either |ratio − 1| > threshold (a change too large to call
  `no change` that the repeats cannot confirm, e.g. with only 3 repeats the exact
  Mann–Whitney p cannot go below 0.1) or the CI half-width > threshold (the repeats
  cannot tell a change of `threshold` from none);
- `no change` otherwise;
- `incomparable`: the job is in one run only, or its fingerprint differs and the
  mismatch was not allowed.

When both runs carry a calibration.json the rule is applied to the raw and to the
calibration-normalised ratio, and a change is called only where the two agree; where one
says `no change` the job reads `no change`, otherwise `noisy`. A machine 10% slower overall
(raw `slower`, normalised `no change`) is no pipeline regression, and a calibration that
happened to catch a quick or a slow moment (measured here: 10% between two runs of the same
code, while the pipeline held still) cannot invent one either.
"""

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np
from scipy.stats import mannwhitneyu

from pipebench.base.csv_cells import csv_table
from pipebench.base.errors import PipebenchError
from pipebench.base.io import write_text_atomic
from pipebench.record.results import (
    CALIBRATION_FILE,
    JOB_RESULT_GLOB,
    SUMMARY_CSV,
    flat_config,
    job_key,
    load_job_results,
    read_calibration,
)

# Half the 20% slowdown the nightly must catch, asv's default factor (1.1), and about 2.5x
# the spread of a ratio of two 5-repeat medians at 5% CV (~4%): large enough not to cry
# wolf, small enough to catch a 20% regression. The lead confirms it from measured noise.
DEFAULT_THRESHOLD = 0.10
# Two-sided level of the Mann–Whitney test. Together with the effect-size threshold and the
# CI rule the per-job false-alarm rate of an A/A comparison stays far below it (see tests).
ALPHA = 0.05
# The per-job A/A false `faster`/`slower` rate this module claims at 5 repeats and <= 5% CV.
CLAIMED_FALSE_ALARM_RATE = 0.01
# Percentile bootstrap of the ratio of medians: 95% two-sided, 2000 resamples is plenty for
# a 2.5%/97.5% percentile and costs milliseconds; a fixed seed makes reruns give the same CI.
CONFIDENCE = 0.95
N_BOOTSTRAP = 2000
BOOTSTRAP_SEED = 0

# Fingerprint fields that must agree between a baseline job and a current job.
FINGERPRINT_FIELDS = ("torch", "cpu_model", "usable_cores", "dataset")
# Config keys that legitimately differ between two runs of the same job: where results go,
# progress bars, and how many rounds the invocation ran (each round is one more sample).
CONFIG_IGNORED = ("run.round", "results_dir", "run.progress", "rounds", "calibrate")

FASTER, SLOWER, NO_CHANGE, NOISY, INCOMPARABLE = "faster", "slower", "no change", "noisy", "incomparable"
VERDICTS = (SLOWER, FASTER, NOISY, NO_CHANGE, INCOMPARABLE)
# Exit statuses of compare_main.
EXIT_OK, EXIT_REGRESSION, EXIT_INCOMPARABLE = 0, 1, 2

CSV_COLUMNS = ("job", "baseline_samples_per_s", "current_samples_per_s", "ratio", "ratio_ci_low",
               "ratio_ci_high", "normalised_ratio", "starvation_change_pts", "p_value", "verdict",
               "baseline_repeats", "current_repeats", "mismatch")


class CompareError(PipebenchError):
    """The two runs cannot be compared: not a results folder, mismatched fingerprints, no common jobs."""


@dataclass(frozen=True)
class Calibration:
    """Median time of the fixed calibration micro-benchmark (lower is faster) and its samples."""

    score_s: float
    samples_s: Tuple[float, ...]


@dataclass(frozen=True)
class JobRuns:
    """One job of a run, its rounds merged: one entry per repeat (pass)."""

    label: str
    samples_per_s: Tuple[float, ...]
    starvation_pct: Tuple[float, ...]
    config: Mapping[str, object]
    fingerprint: Mapping[str, object]


@dataclass(frozen=True)
class Run:
    """A results folder: its jobs by label, and its calibration when it has one."""

    path: Path
    jobs: Mapping[str, JobRuns]
    calibration: Optional[Calibration]


@dataclass(frozen=True)
class JobComparison:
    """One job's baseline-vs-current figures and verdict; NaN where a side is missing."""

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

    def counts(self) -> Dict[str, int]:
        return {v: sum(j.verdict == v for j in self.jobs) for v in VERDICTS}


def _pass_rate(p: Mapping[str, Sequence[float]]) -> float:
    return 1000.0 * float(sum(p["samples"])) / float(sum(p["step_ms"]))


def _pass_starvation(p: Mapping[str, Sequence[float]]) -> float:
    return 100.0 * float(sum(p["wait_ms"])) / float(sum(p["step_ms"]))


def comparable_config(config: Mapping[str, object]) -> Dict[str, object]:
    """The resolved config as dotted keys, minus the keys that may differ between runs."""
    return {k: v for k, v in flat_config(config).items()
            if not any(k == ign or k.startswith(ign + ".") for ign in CONFIG_IGNORED)}


def _load_calibration(folder: Path) -> Optional[Calibration]:
    path = folder / CALIBRATION_FILE
    if not path.is_file():
        return None
    data = read_calibration(path)
    return Calibration(float(data["score_s"]), tuple(float(s) for s in data["samples_s"]))


def load_run(path: str) -> Run:
    """Read a results folder (or its summary.csv): every job's per-repeat samples/s and starvation.

    Pass step times are positive and results whole: `read_result` refuses any other file.
    """
    folder = Path(path)
    if folder.name == SUMMARY_CSV or folder.is_file():
        folder = folder.parent
    if not folder.is_dir() or not any(folder.glob(JOB_RESULT_GLOB)):
        raise CompareError(f"{path}: not a results folder (no {JOB_RESULT_GLOB})")
    grouped: Dict[str, List[Mapping[str, Any]]] = {}
    for record in load_job_results(folder):
        grouped.setdefault(job_key(str(record["job"])), []).append(record)
    jobs = {}
    for label, records in grouped.items():
        passes = [p for r in records for p in r["passes"]]
        jobs[label] = JobRuns(
            label=label,
            samples_per_s=tuple(_pass_rate(p) for p in passes),
            starvation_pct=tuple(_pass_starvation(p) for p in passes),
            config=records[0]["config"],
            fingerprint=records[0]["fingerprint"],
        )
    return Run(folder, jobs, _load_calibration(folder))


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


def _bootstrap_factors(rng: np.random.Generator, baseline: Optional[Calibration],
                       current: Optional[Calibration]) -> np.ndarray:
    """Resampled calibration factors, so the CI carries the calibration's own noise."""
    def medians(cal: Calibration) -> np.ndarray:
        if len(cal.samples_s) < 2:
            return np.full(N_BOOTSTRAP, cal.score_s)
        s = np.asarray(cal.samples_s)
        return np.median(rng.choice(s, size=(N_BOOTSTRAP, len(s))), axis=1)
    if baseline is None or current is None:
        return np.ones(N_BOOTSTRAP)
    return medians(current) / medians(baseline)


def _ratio_ci(b: np.ndarray, c: np.ndarray, factors: np.ndarray, rng: np.random.Generator) -> Tuple[float, float]:
    """Percentile bootstrap CI of factor x median(c) / median(b), each side resampled alone."""
    mb = np.median(rng.choice(b, size=(N_BOOTSTRAP, len(b))), axis=1)
    mc = np.median(rng.choice(c, size=(N_BOOTSTRAP, len(c))), axis=1)
    tail = 100 * (1 - CONFIDENCE) / 2
    low, high = np.percentile(factors * mc / mb, [tail, 100 - tail])
    return float(low), float(high)


def verdict(ratio: float, ci_low: float, ci_high: float, p_value: float, threshold: float) -> str:
    """The module docstring's rule for one job (ratio = current/baseline throughput)."""
    significant = (ci_low > 1 or ci_high < 1) and p_value < ALPHA
    large = abs(ratio - 1) > threshold
    if significant and large:
        return FASTER if ratio > 1 else SLOWER
    if large or (ci_high - ci_low) / 2 > threshold:
        return NOISY
    return NO_CHANGE


def _agreed(raw: str, normalised: str) -> str:
    """One verdict from the raw and the calibration-normalised one (module docstring)."""
    if raw == normalised:
        return raw
    return NO_CHANGE if NO_CHANGE in (raw, normalised) else NOISY


def _one_sided(label: str, baseline: Optional[JobRuns], current: Optional[JobRuns]) -> JobComparison:
    """A job present in one run only: `incomparable`, with the side it has."""
    nan = float("nan")
    med = lambda j: float(np.median(j.samples_per_s)) if j else nan  # noqa: E731
    count = lambda j: len(j.samples_per_s) if j else 0  # noqa: E731
    return JobComparison(label, med(baseline), med(current), nan, nan, nan, nan, nan, nan, INCOMPARABLE,
                         count(baseline), count(current), ())


def compare_job(baseline: JobRuns, current: JobRuns, threshold: float, factor: Optional[float],
                factors: np.ndarray, mismatch: Tuple[str, ...], allow_mismatch: bool,
                rng: np.random.Generator) -> JobComparison:
    """Ratio, CI, p-value and verdict for one job present in both runs."""
    b, c = np.asarray(baseline.samples_per_s), np.asarray(current.samples_per_s)
    ratio = float(np.median(c) / np.median(b))
    low, high = _ratio_ci(b, c, np.ones(N_BOOTSTRAP), rng)
    p = float(mannwhitneyu(c, b, alternative="two-sided").pvalue)
    verdict_ = verdict(ratio, low, high, p, threshold)
    if factor is not None:
        norm_low, norm_high = _ratio_ci(b, c, factors, rng)
        # Scaling current by the (constant) calibration factor tests the normalised ratio.
        norm_p = float(mannwhitneyu(c * factor, b, alternative="two-sided").pvalue)
        verdict_ = _agreed(verdict_, verdict(ratio * factor, norm_low, norm_high, norm_p, threshold))
    if mismatch and not allow_mismatch:
        verdict_ = INCOMPARABLE
    starvation = float(np.median(current.starvation_pct) - np.median(baseline.starvation_pct))
    return JobComparison(baseline.label, float(np.median(b)), float(np.median(c)), ratio, low, high,
                         ratio * factor if factor is not None else float("nan"), starvation, p, verdict_,
                         len(b), len(c), mismatch)


def compare_runs(baseline: Run, current: Run, threshold: float = DEFAULT_THRESHOLD,
                 allow_mismatch: bool = False) -> Comparison:
    """Compare every job of two runs. The CI and p shown are the raw ratio's."""
    factor = _calibration_factor(baseline.calibration, current.calibration)
    rng = np.random.default_rng(BOOTSTRAP_SEED)
    factors = _bootstrap_factors(rng, baseline.calibration, current.calibration)
    results, mismatch = [], []
    for label in sorted(set(baseline.jobs) | set(current.jobs)):
        b, c = baseline.jobs.get(label), current.jobs.get(label)
        if b is None or c is None:
            results.append(_one_sided(label, b, c))
            continue
        job_mismatch = fingerprint_mismatch(b, c)
        mismatch += [f for f in job_mismatch if f not in mismatch]
        results.append(compare_job(b, c, threshold, factor, factors, job_mismatch, allow_mismatch, rng))
    return Comparison(baseline.path, current.path, threshold, tuple(results), tuple(mismatch),
                      allow_mismatch, factor is not None)


def _fmt(x: float, spec: str) -> str:
    return "n/a" if np.isnan(x) else format(x, spec)


def render_markdown(comparison: Comparison) -> str:
    """A pull-request comment: a verdict-count header, a mismatch warning if any, one row a job."""
    counts = ", ".join(f"{n} {v}" for v, n in comparison.counts().items() if n)
    lines = [f"**pipebench compare**: {counts} (threshold {comparison.threshold:.0%}, "
             f"verdicts on {'raw and calibration-normalised ratios agreeing' if comparison.normalised else 'raw ratios'})", ""]
    if comparison.mismatch:
        state = "compared anyway (--allow-mismatch)" if comparison.allow_mismatch else "not compared"
        lines += [f"> **WARNING: fingerprint mismatch, {state}:** {', '.join(comparison.mismatch)}", ""]
    if not comparison.normalised:
        lines += ["Normalised ratios unavailable: calibration.json missing from a run.", ""]
    lines += [f"baseline: `{comparison.baseline}`  ", f"current: `{comparison.current}`", "",
              "| job | baseline samples/s | current samples/s | ratio (95% CI) | normalised | "
              "starvation Δ (pts) | p | verdict |",
              "|---|---:|---:|---:|---:|---:|---:|---|"]
    for j in comparison.jobs:
        ratio = "n/a" if np.isnan(j.ratio) else f"{j.ratio:.3f} ({j.ci_low:.3f}–{j.ci_high:.3f})"
        lines.append(f"| `{j.job}` | {_fmt(j.baseline_samples_per_s, '.1f')} | {_fmt(j.current_samples_per_s, '.1f')} "
                     f"| {ratio} | {_fmt(j.normalised_ratio, '.3f')} | {_fmt(j.starvation_change_pts, '+.1f')} "
                     f"| {_fmt(j.p_value, '.3f')} | {j.verdict} |")
    return "\n".join(lines) + "\n"


def render_csv(comparison: Comparison) -> str:
    """One row a job, CSV_COLUMNS."""
    return csv_table(CSV_COLUMNS, ([j.job, j.baseline_samples_per_s, j.current_samples_per_s, j.ratio, j.ci_low,
                                    j.ci_high, j.normalised_ratio, j.starvation_change_pts, j.p_value, j.verdict,
                                    j.baseline_repeats, j.current_repeats, ";".join(j.mismatch)]
                                   for j in comparison.jobs))


def write_comparison(comparison: Comparison, out_dir: str) -> Tuple[Path, Path]:
    """Write compare.md and compare.csv under out_dir; return their paths."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    md, csv_path = out / "compare.md", out / "compare.csv"
    write_text_atomic(md, render_markdown(comparison))
    write_text_atomic(csv_path, render_csv(comparison))
    return md, csv_path
