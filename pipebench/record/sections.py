"""result.json's sections as frozen types, parsed once where a result is loaded.

A reader asks `result.transform_rows[0].ms_per_sample`, never `result["transforms"][0]["ms_per_sample"]`:
a misspelt field is an AttributeError, not a silent `.get` default. `parse` (`pipebench.base.typed_json`)
builds each type from its stored mapping by the type's own field names; keys a type does not declare
stay in `extra`.
"""

from dataclasses import dataclass, field, replace
from typing import Any, Dict, List, Mapping, Optional, Tuple

from pipebench.base.typed_json import parse, parse_all, required_fields

__all__ = ["ConsumerReport", "DatasetFacts", "Fingerprint", "PassRecord", "ProfileLevel", "ProfiledStep",
           "StoredThreadProfile", "TransformRow", "measured_row"]


@dataclass(frozen=True)
class TransformRow:
    """One timed step of the chain: a transforms.csv row (docs/results-schema.md). The thread-scaling
    columns are there where `run.thread_profile` ran and the report joined them."""

    stage: str
    transform: str
    calls: int
    ms_per_call_mean: float
    ms_per_call_median: float
    ms_per_sample: float
    share_pct: float
    job: str = ""
    profile_threads: Optional[int] = None
    thread_speedup: Optional[float] = None
    thread_speedups: str = ""
    off_cpu_pct_1t: Optional[float] = None
    off_cpu_pct_nt: Optional[float] = None
    thread_verdict: str = ""


def measured_row(row: TransformRow) -> Dict[str, Any]:
    """The row as the measuring writes it to result.json: the fields it measured, those with no
    default (the job and the thread-scaling columns are joined by the report)."""
    return {name: getattr(row, name) for name in required_fields(TransformRow)}


@dataclass(frozen=True)
class ProfileLevel:
    """One thread count of a step's thread-scaling profile: its calls alone on that many threads, their
    rate, and the share of their wall time spent off the CPU."""

    threads: int
    calls: int
    samples_per_s: float
    off_cpu_pct: float


@dataclass(frozen=True)
class ProfiledStep:
    """One step's profile: its levels, 1 thread first, or the error that left it none."""

    stage: str
    transform: str
    error: Optional[str] = None
    levels: Tuple[ProfileLevel, ...] = ()

    def speedups(self) -> List[Tuple[int, float]]:
        """(threads, speed-up over 1 thread) a level."""
        return [(level.threads, level.samples_per_s / self.levels[0].samples_per_s) for level in self.levels]


@dataclass(frozen=True)
class StoredThreadProfile:
    """A job's `thread_profile` section, as pipebench.measure.thread_profile writes it; whether its
    workers are threads (`on_threads`) changes the advice."""

    threads: Tuple[int, ...]
    backend: str
    on_threads: bool
    workers: int
    usable_cores: int
    capped_by_cores: bool
    note: Optional[str] = None
    steps: Tuple[ProfiledStep, ...] = ()

    @classmethod
    def from_stored(cls, data: Mapping[str, Any]) -> "StoredThreadProfile":
        """The section read once, its steps and their levels typed too."""
        profile = parse(cls, data)
        return replace(profile, steps=tuple(replace(step, levels=parse_all(ProfileLevel, step.levels))
                                            for step in parse_all(ProfiledStep, profile.steps)))

    def step(self, stage: str, transform: str) -> Optional[ProfiledStep]:
        """The profile of the chain's step named so; None where it has none."""
        return next((step for step in self.steps if (step.stage, step.transform) == (stage, transform)), None)


@dataclass(frozen=True)
class PassRecord:
    """One measured pass: its start-up figures and, a measured step each, the lists the summary is
    computed from (ms). The GPU lists are there at `run.step_sync=async` only."""

    samples: Tuple[int, ...] = ()
    step_ms: Tuple[float, ...] = ()
    wait_ms: Tuple[float, ...] = ()
    gap_ms: Tuple[float, ...] = ()
    h2d_ms: Tuple[float, ...] = ()
    device_ms: Tuple[float, ...] = ()
    compute_ms: Tuple[float, ...] = ()
    transfer_ms: Tuple[float, ...] = ()
    collective_ms: Tuple[float, ...] = ()
    worker_id: Tuple[int, ...] = ()
    epoch: Tuple[int, ...] = ()
    steady: Optional[Tuple[bool, ...]] = None
    gpu_idle_data_ms: Optional[Tuple[float, ...]] = None
    gpu_idle_other_ms: Optional[Tuple[float, ...]] = None
    gpu_busy_ms: Optional[Tuple[float, ...]] = None
    first_batch_s: float = 0.0
    warmup_steps: int = 0
    drained_samples: int = 0
    wall_s: float = 0.0
    epochs: int = 0
    start_epoch: int = 0
    stop_reason: str = "window"
    extra: Mapping[str, Any] = field(default_factory=dict)

    @property
    def steady_mask(self) -> Tuple[bool, ...]:
        """Which steps the steady rate counts: every step where the file marks none."""
        return self.steady if self.steady is not None else (True,) * len(self.step_ms)


@dataclass(frozen=True)
class ConsumerReport:
    """The consumer's own record: its kind and device, and what that kind keeps (drawn and slept
    step times; the toy CNN's per-phase ms and losses) in `extra`."""

    kind: str = ""
    device: str = ""
    extra: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class DatasetFacts:
    """What the fingerprint says of the dataset: its name and shard lines, and its identity's other
    keys (paths, sizes, skipped entries) in `extra`."""

    name: str = "dataset"
    shards: Optional[int] = None
    shard_samples: Optional[Tuple[int, ...]] = None
    extra: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Fingerprint:
    """The host and software a job was measured on (docs/results-schema.md, `fingerprint`)."""

    usable_cores: int = 1
    cpu_count: Optional[int] = None
    cpu_model: str = ""
    gpu: Optional[str] = None
    hostname: Optional[str] = None  # None where a hand-made file names none; the report prints it as `None`
    start_method: str = ""
    git_commit: Optional[str] = None
    git_dirty: Optional[bool] = None
    dataset: Mapping[str, Any] = field(default_factory=dict)
    extra: Mapping[str, Any] = field(default_factory=dict)

    @property
    def dataset_facts(self) -> DatasetFacts:
        return parse(DatasetFacts, self.dataset)
