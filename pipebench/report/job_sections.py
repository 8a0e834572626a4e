"""What the report reads of a job beyond `JobResult`'s typed summary and sections, as frozen types.

The exactly-once check, the thread-scaling profile, pinning in effect, the samples run.on_error=skip
dropped, and the loader and run settings: each parsed once by its own field names, so the diagnosis
reads attributes, never keys. One a job lacks (a watched loader, an older file) reads as None, or as
the spec's default for a setting.
"""
from dataclasses import dataclass
from typing import Any, Mapping, Optional, Tuple

from pipebench.base.typed_json import parse
from pipebench.config.specs import LoaderSpec, RunSpec
from pipebench.measure.coverage import CoverageReport
from pipebench.record.jobs import JobResult
from pipebench.record.sections import StoredThreadProfile

__all__ = ["LoaderSettings", "ReportSections", "loader_settings", "run_settings", "sections_of"]


@dataclass(frozen=True)
class ReportSections:
    """The sections of result.json the diagnosis reads that `JobResult` leaves untyped."""

    coverage: Optional[Mapping[str, Any]] = None
    thread_profile: Optional[Mapping[str, Any]] = None
    pin_memory_effective: Optional[bool] = None
    # The first samples run.on_error=skip dropped (pipeline.timed_chain's SampleFailure as written).
    skipped: Optional[Tuple[Mapping[str, Any], ...]] = None

    @property
    def coverage_report(self) -> Optional[CoverageReport]:
        """The exactly-once check; None where it did not run (no section, or an empty one)."""
        return parse(CoverageReport, self.coverage) if self.coverage else None

    @property
    def profile(self) -> Optional[StoredThreadProfile]:
        """The thread-scaling profile; None where the job ran none."""
        return StoredThreadProfile.from_stored(self.thread_profile) if self.thread_profile else None


def sections_of(result: JobResult) -> ReportSections:
    return parse(ReportSections, result.sections)


@dataclass(frozen=True)
class LoaderSettings:
    """The loader settings the diagnosis reads. Not `LoaderSpec` itself: a watched loader's `loader` group
    is attach's own shape (its batch size None under a batch sampler), which the spec's checks refuse."""

    backend: Optional[str] = LoaderSpec.backend
    shuffle: Optional[bool] = LoaderSpec.shuffle
    persistent_workers: Optional[bool] = LoaderSpec.persistent_workers


@dataclass(frozen=True)
class _Groups:
    """The config's groups the report reads settings from."""

    loader: Optional[Mapping[str, Any]] = None
    run: Optional[Mapping[str, Any]] = None


def loader_settings(result: JobResult) -> LoaderSettings:
    return parse(LoaderSettings, parse(_Groups, result.config).loader)


def run_settings(result: JobResult) -> RunSpec:
    """The job's run settings, parsed into the spec itself (a config without the group reads as its defaults)."""
    return parse(RunSpec, parse(_Groups, result.config).run)
