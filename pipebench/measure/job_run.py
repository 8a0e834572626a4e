"""One job's run, set up in one place for the job process and for each rank of a multi-rank job.

A rank adds only what `RankPart` holds; a job adds what it does around the run (its cache, its
extra passes, its summary) in pipebench.measure.job.
"""

from dataclasses import dataclass
from typing import NamedTuple, Optional, Protocol

import torch
from torch.utils.data import IterableDataset

from pipebench.base.watchdog import Unwatched
from pipebench.config.specs import THREADS, JobSpec
from pipebench.measure.coverage import IndexLog, droppable_per_epoch
from pipebench.measure.cpu_reference import CpuReference
from pipebench.measure.gpu.session import NO_TRACE_NOTE, GpuSession
from pipebench.measure.host_load import HostLoadMeter
from pipebench.measure.job_spawn import forking_job_process
from pipebench.measure.memory import MemorySampler
from pipebench.measure.repeats import LoopKit, build_loop_kit
from pipebench.measure.setup import seed_everything
from pipebench.measure.steps import TimingSink
from pipebench.measure.storage_io import StorageReadMeter
from pipebench.pipeline.build import JobParts, build_job
from pipebench.pipeline.timed_chain import TimedBatch

__all__ = ["METER_KINDS", "JobMeters", "JobRun", "RankPart", "RankSync", "job_meters", "job_run"]


class JobMeters(NamedTuple):
    """The meters every job and every rank runs around its repeats, in the order they start: a
    tuple, so it is the meter list itself, with each meter also by name."""

    memory: MemorySampler
    storage: StorageReadMeter
    host_load: HostLoadMeter
    coverage: IndexLog
    gpu: GpuSession


# The meters' classes, in order: a rank merge has their rows but no meter, and takes their notes
# from these (`meter.add_notes`).
METER_KINDS = tuple(JobMeters.__annotations__.values())


def job_meters(coverage: IndexLog, gpu: GpuSession) -> JobMeters:
    """The job's meters around its index log and GPU session, which the loop kit shares."""
    return JobMeters(MemorySampler(forked_from=forking_job_process()), StorageReadMeter(), HostLoadMeter(), coverage,
                     gpu)


class RankSync(Protocol):
    """A rank's end-of-step collective (StepLoop's `after_step`) and its shared stop decision."""

    def __call__(self, batch: TimedBatch, epoch: int) -> None: ...

    def agree(self, want_more: bool) -> bool: ...


@dataclass(frozen=True)
class RankPart:
    """What a rank adds to a job's run: its seed offset (its own random crops; the sampler shares
    the job's seed), the step sync every rank runs, the note for the GPU trace it does not run."""

    rank: int
    sync: RankSync
    untraced_note: str


@dataclass(frozen=True)
class JobRun:
    """One job's (or one rank's) pipeline, loop kit, timings and meters, set up by `job_run`; its
    repeats run on them (pipebench.measure.repeats.measure_repeats)."""

    spec: JobSpec
    parts: JobParts
    kit: LoopKit
    sink: TimingSink
    meters: JobMeters
    rank: Optional[RankPart] = None


def job_run(spec: JobSpec, watchdog: Unwatched, rank: Optional[RankPart] = None) -> JobRun:
    """The job's run set up inside its guard (pipebench.measure.guard); `rank` for one rank of a
    multi-rank job. Workers run with one intra-op thread; so do a single-process job (or its
    per-transform times would not compare with the workers'), worker threads sharing this
    process's pool, and ranks, which share the cores with each other's workers."""
    seed = spec.run.seed + (rank.rank if rank else 0)
    seed_everything(seed)
    if rank is not None or spec.workers == 0 or spec.worker_kind == THREADS:
        torch.set_num_threads(1)
    if spec.loader.sharing_strategy is not None:
        torch.multiprocessing.set_sharing_strategy(spec.loader.sharing_strategy)
    parts = build_job(spec, seed, CpuReference() if spec.calibrate else None)
    gpu = GpuSession(parts.consumer, untraced_note=rank.untraced_note if rank else NO_TRACE_NOTE)
    if rank is None:
        iterable = isinstance(parts.dataset, IterableDataset)
        coverage = IndexLog(len(parts.dataset), droppable_per_epoch(spec, iterable))
    else:
        coverage = IndexLog()  # the ranks' logs are pooled by the job (multirank.coverage_of)
    kit = build_loop_kit(spec, parts, gpu, watchdog, after_step=rank.sync if rank else None)
    return JobRun(spec, parts, kit, TimingSink(), job_meters(coverage, gpu), rank)
