"""Every job of a sweep composed and checked before any is measured: the keys the whole invocation
shares, `--baseline`'s job, and each distinct dataset and chain built once (`build_check`)."""

from operator import attrgetter
from typing import Dict, List, Optional, Sequence, Tuple

from pipebench.base.errors import ConfigError
from pipebench.config.compose import job_spec_composer
from pipebench.config.specs import JobSpec
from pipebench.measure.job_spawn import JobProcess
from pipebench.record.jobs import ROUND_KEY, identity_columns, override_key
from pipebench.report.comparison import identity, select_job
from pipebench.sweep.build_check import check_builds

__all__ = ["INVOCATION_KEYS", "preflight"]

# Keys that describe the whole invocation, so every job of a sweep must agree on them.
INVOCATION_KEYS = ("rounds", "calibrate", "run.on_job_error", "run.stop_at_target", "run.target_accel_util_pct")


def _check_invocation_keys(checked: Sequence[Tuple[JobSpec, str]]) -> None:
    for key in INVOCATION_KEYS:
        values = {attrgetter(key)(spec) for spec, _ in checked}  # a dotted key: run.on_job_error
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


def _without_round(job: Sequence[str]) -> Tuple[str, ...]:
    return tuple(override for override in job if override_key(override) != ROUND_KEY)


def preflight(jobs: Sequence[Sequence[str]], ahead: Optional[JobProcess] = None,
              baseline: Optional[str] = None) -> List[Tuple[JobSpec, str]]:
    """Compose and check every job, and build each distinct dataset once (in a child of `ahead` when it
    serves), before measuring anything; each job's spec with its results_dir. A job's rounds differ by
    `run.round` alone, so each job is composed once (a 40-job nightly side composes 8)."""
    composed: Dict[Tuple[str, ...], Tuple[JobSpec, str]] = {}
    with job_spec_composer() as compose_one:
        for job in jobs:
            if _without_round(job) not in composed:
                composed[_without_round(job)] = compose_one(job)
    checked = [composed[_without_round(job)] for job in jobs]
    # What the configs alone show first: one line at once, not after the builds' seconds.
    _check_invocation_keys(checked)
    _check_baseline(baseline, jobs, checked)
    check_builds([spec for spec, _ in checked], ahead)
    return checked
