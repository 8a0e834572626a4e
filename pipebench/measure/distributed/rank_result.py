"""A rank's result as the rank merges fold it, and the multi-rank shapes of result.json, typed.

Both merges, a job's (multirank) and attach's (pipebench.attach.watched_ranks), fold `RankResult`s.
"""

from dataclasses import dataclass, field, replace
from functools import cached_property
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence, Tuple

from pipebench.base.typed_json import parse
from pipebench.record.figures import Summary
from pipebench.record.jobs import JobResult

__all__ = ["RankResult", "RankRow", "RankSections", "StepNames"]


@dataclass(frozen=True)
class StepNames:
    """A rank's timed steps as (stage, name) pairs, per sample and per batch (rank-N.json's and
    rank.json's `step_names`)."""

    sample: Tuple[Sequence[str], ...] = ()
    batch: Tuple[Sequence[str], ...] = ()


@dataclass(frozen=True)
class RankSections:
    """The multi-rank sections of a result.json that `JobResult` leaves untyped: a rank's own (its
    window's cut, which the total rate reuses; its timed steps' names, meters and what the
    exactly-once check pools; a watched loader's first batch an epoch) and a merge's rows a rank."""

    window: Mapping[str, Any] = field(default_factory=dict)
    step_names: Mapping[str, Any] = field(default_factory=dict)
    meters: Mapping[str, Any] = field(default_factory=dict)
    indices: Tuple[Mapping[str, Any], ...] = ()
    epochs_reached: Tuple[int, ...] = ()
    dataset_length: int = 0
    iterable: bool = False
    first_batch_s_per_epoch: Tuple[float, ...] = ()
    ranks: Tuple[Mapping[str, Any], ...] = ()

    @classmethod
    def of(cls, result: JobResult) -> "RankSections":
        return parse(cls, result.sections)


@dataclass(frozen=True)
class RankRow:
    """One rank's figures in a multi-rank result.json (its `ranks` list), in written order."""

    rank: int
    samples_per_s: Optional[float] = None
    starvation_pct: Optional[float] = None
    au_pct: Optional[float] = None
    wait_ms_median: Optional[float] = None
    wait_ms_p99: Optional[float] = None
    step_ms_median: Optional[float] = None
    # The rank's step less its wait at the collective, and that wait (its own summary's cells).
    busy_ms_mean: Optional[float] = None
    collective_ms_mean: Optional[float] = None
    collective_ms_p99: Optional[float] = None
    cpu_ms_per_sample: Optional[float] = None
    steps: Optional[int] = None
    epochs: Optional[int] = None

    @classmethod
    def of(cls, rank: int, summary: Summary) -> "RankRow":
        """Rank `rank`'s row, read from its summary row."""
        return parse(cls, {**summary.row, "rank": rank})


@dataclass(frozen=True)
class RankResult:
    """One rank's result as a merge folds it: its number, its result, its timed steps' names and the
    file of its saved per-sample timings (None where it saved none)."""

    rank: int
    result: JobResult
    step_names: StepNames
    timings: Optional[Path] = None

    @cached_property
    def sections(self) -> RankSections:
        return RankSections.of(self.result)

    @property
    def row(self) -> RankRow:
        return RankRow.of(self.rank, self.result.summary)

    def with_cells(self, cells: Mapping[str, Any]) -> "RankResult":
        """This rank with `cells` added to its summary row (attach's estimated wait at the collective)."""
        summary = Summary.from_row({**self.result.summary.row, **cells})
        return replace(self, result=replace(self.result, summary=summary))
