"""One rank of a multi-rank job, started by multirank under torchrun (`-m ...ranks JOB_DIR TASK`).

Every rank reads the same pickled RankTask from TASK (in the job process's private folder, never
the results folder), joins the process group and measures its own DistributedSampler loader with
the job's run, set up as a job's is (pipebench.measure.job_run). Each step ends in an all-reduce of
a small tensor, standing in for data-parallel training's gradient sync: a slow rank stalls the
others there, and the time each spends in it is its collective wait. It writes `rank-N.json`, or
on failure one line in `rank-N.error`.
"""

import os
import pickle
import sys
import traceback
from dataclasses import dataclass, replace
from datetime import timedelta
from pathlib import Path
from typing import Any, Dict, List, Optional

import numpy as np
import torch
import torch.distributed as dist
from torch.utils.data import IterableDataset

from pipebench.base.cores import usable_cores
from pipebench.base.errors import (
    USAGE_EXIT_STATUS,
    PipebenchError,
    StuckThreadError,
    exit_leaving_threads,
    exit_without_teardown,
)
from pipebench.base.io import write_json_atomic, write_text_atomic
from pipebench.base.lifeline import TIED_PID_ENV, die_with_parent, parent_is
from pipebench.base.typed_json import parse
from pipebench.config.specs import JobSpec
from pipebench.measure.fingerprint import job_fingerprint
from pipebench.measure.host_load import PROCESS_CPU_COLUMN
from pipebench.measure.guard import job_guard
from pipebench.measure.job_run import JobRun, RankPart, job_run
from pipebench.measure.repeats import measure_repeats
from pipebench.measure.steps import NS_PER_MS, TimingSink
from pipebench.measure.summarize import (
    pass_records,
    rows_as_dicts,
    summary_row,
    transform_rows,
)
from pipebench.measure.window import Window, window_record
from pipebench.pipeline.timed_chain import TimedBatch
from pipebench.storage.rank_info import rank_and_world

RANKS_MODULE = "pipebench.measure.distributed.ranks"
TASK_FILE = "rank_task.pkl"
RANK_RESULT = "rank-{rank}.json"
RANK_ERROR = "rank-{rank}.error"
# This rank's per-sample and per-batch stage timings, for the job's pooled transform table.
RANK_TIMINGS = "rank-{rank}-timings.npz"
# Elements in the per-step all-reduce: a token, not a gradient; what it measures is the wait.
SYNC_ELEMENTS = 16
# Exit status of a rank that crashed (not a user error).
CRASH_EXIT_STATUS = 1
# A rank's own CPU over its window, in its summary only: the job takes every rank's out of the
# host's other load (multirank.merge_meter_columns), as one process's meter takes its own.
OWN_CPU_CORES = "own_cpu_cores"
# Ranks run no GPU trace pass (the extra profiled steps of a single-process job).
UNTRACED_NOTE = "no GPU trace on ranks (multi-rank job): sync and idle columns not measured"


@dataclass(frozen=True)
class RankTask:
    """What every rank needs: the job and the backend the job process resolved."""

    spec: JobSpec
    backend: str


class CollectiveSync:
    """StepLoop's `after_step`: the all-reduce that stands in for the gradient sync."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.tensor: Optional[torch.Tensor] = None

    def __call__(self, batch: TimedBatch, epoch: int) -> None:
        if self.tensor is None:  # made on first use: after the loader's workers have started
            self.tensor = torch.zeros(SYNC_ELEMENTS, device=self.device)
        dist.all_reduce(self.tensor)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)  # NCCL returns once queued; the wait is the sync

    def agree(self, want_more: bool) -> bool:
        """measure_pass's `agree`: every rank steps until all of them are done (steps and
        min_time_s are judged per rank, and a rank that stopped alone would leave the others
        waiting at the all-reduce). On this rank's device, as NCCL reduces only GPU tensors."""
        flag = torch.tensor([1 if want_more else 0], dtype=torch.int32, device=self.device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return bool(flag.item())


def _pin_gpu(local_rank: int) -> None:
    """Give this rank its own GPU before CUDA starts: with one visible device, `cuda` means it."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    devices = visible.split(",") if visible else [str(i) for i in range(local_rank + 1)]
    os.environ["CUDA_VISIBLE_DEVICES"] = devices[local_rank]


def rank_summary(window: Window, sink: TimingSink, rows: list, spec: JobSpec, skipped: int) -> Dict[str, float]:
    """The ordinary summary row of this rank, plus its collective wait and its own busy time a
    step (the step without the all-reduce: what the straggler ratio compares)."""
    steps = window.steps
    summary = summary_row(window, rows, sink, spec.workers, usable_cores(), skipped, worker_kind=spec.worker_kind)
    collective = np.array([s.collective_ns for s in steps], dtype=np.float64) / NS_PER_MS
    busy = np.array([s.step_ns - s.collective_ns for s in steps], dtype=np.float64) / NS_PER_MS
    summary.update(collective_ms_mean=float(collective.mean()), collective_ms_p99=float(np.percentile(collective, 99)),
                   busy_ms_mean=float(busy.mean()))
    return summary


@dataclass(frozen=True)
class SavedTimings:
    """A rank's saved timings (its .npz's arrays): every sample's steps, and every batch's."""

    sample_ns: np.ndarray
    batch_ns: np.ndarray


def save_timings(path: Path, sink: TimingSink) -> None:
    np.savez(path, sample_ns=np.concatenate(sink.sample_ns), batch_ns=np.stack(sink.batch_ns))


def load_timings(path: Path) -> TimingSink:
    """A sink holding a saved rank's timings (one block), enough for `transform_rows`."""
    with np.load(path) as saved:
        timings = parse(SavedTimings, saved)
    return TimingSink(sample_ns=[timings.sample_ns], batch_ns=list(timings.batch_ns))


def measure_rank(run: JobRun, world: int, job_dir: Path) -> Dict[str, Any]:
    """Every repeat of the job on this rank (its run set up by `job_run` with the rank's part);
    returns the rank's record and saves its timings."""
    spec, parts, sink, rank = run.spec, run.parts, run.sink, run.rank.rank
    index_log, host_load = run.meters.coverage, run.meters.host_load
    meters = [meter for meter in run.meters if meter is not index_log]  # logs are pooled (multirank.coverage_of)
    repeats = measure_repeats(run.kit, run.meters, index_log, sink, f"rank {rank} ", agree=run.rank.sync.agree)
    batch_steps = [*parts.collate.steps, *run.kit.device_chain.steps]
    rows = transform_rows(sink, parts.instrumented.steps, batch_steps)
    save_timings(job_dir / RANK_TIMINGS.format(rank=rank), sink)
    summary = rank_summary(repeats.window, sink, rows, spec, len(repeats.skipped))
    for meter in meters:
        summary.update(meter.columns())
    summary[OWN_CPU_CORES] = host_load.own_cpu_cores()
    summary[PROCESS_CPU_COLUMN] = host_load.cpu_ms_per_sample(repeats.marked_samples)
    return {
        "rank": rank,
        "world_size": world,
        "summary": summary,
        "transforms": rows_as_dicts(rows),
        "passes": pass_records(repeats.window),
        # The job's rate of all ranks together reuses rank 0's cut (multirank.total_rate).
        "window": window_record(repeats.window),
        "epochs_reached": list(repeats.epochs),
        "step_names": {"sample": parts.instrumented.steps, "batch": batch_steps},
        "dataset_length": len(parts.dataset),
        "iterable": isinstance(parts.dataset, IterableDataset),
        "indices": index_log.as_json(),
        "meters": {meter.key: meter.record() for meter in meters},
        # Rank 0's is the job's: the host it ran on is what lets results from many hosts merge.
        "fingerprint": job_fingerprint(spec, parts.dataset),
    }


def main(argv: Optional[List[str]] = None) -> int:
    job_dir, task_path = (Path(arg) for arg in (argv or sys.argv[1:])[:2])
    rank, world = rank_and_world()
    error_file = job_dir / RANK_ERROR.format(rank=rank)
    # torchrun, tied to the job (pipebench.measure.distributed.torchrun_fork), is this rank's parent.
    die_with_parent(parent_is(int(os.environ.get(TIED_PID_ENV, os.getppid()))))
    try:
        task: RankTask = pickle.loads(task_path.read_bytes())
        spec = task.spec if rank == 0 else replace(task.spec, run=replace(task.spec.run, progress=False))
        device = torch.device("cpu")
        if task.backend == "nccl":
            _pin_gpu(int(os.environ["LOCAL_RANK"]))
            device = torch.device("cuda")
        dist.init_process_group(task.backend, timeout=timedelta(seconds=spec.distributed.collective_timeout_s))
        part = RankPart(rank, CollectiveSync(device), UNTRACED_NOTE)
        # A step stuck in native code: the watchdog leaves its line where the job looks, then ends the rank.
        with job_guard(spec, on_stuck=lambda line: write_text_atomic(error_file, f"{line}\n")) as watchdog:
            run = job_run(spec, watchdog, part)
            record = measure_rank(run, world, job_dir)
        write_json_atomic(job_dir / RANK_RESULT.format(rank=rank), record)
    except PipebenchError as exc:
        write_text_atomic(error_file, f"{exc}\n")
        if isinstance(exc, StuckThreadError):
            exit_leaving_threads(USAGE_EXIT_STATUS)  # its peers see the rank gone
        return USAGE_EXIT_STATUS
    except Exception as exc:  # a crash: one line for the job's error, the traceback for the log
        text = str(exc).strip().splitlines()
        write_text_atomic(error_file, f"{type(exc).__name__}: {text[0] if text else ''}\n")
        traceback.print_exc()
        return CRASH_EXIT_STATUS
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    exit_without_teardown(main())  # torch's teardown would hold each rank's end (about 0.8 s)
