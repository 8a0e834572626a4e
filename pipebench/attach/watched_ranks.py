"""The ranks of `pipebench attach -- torchrun ...`: each rank's folder, and their merge into one results folder.

Each rank (pipebench.cli.attach_rank) writes to `RANKS_FOLDER/rank-N/` (named by RANKS_DIR_ENV) a
watched results folder of its own, each job's per-sample timings (`timings.npz`) and `rank.json`.
`merge_ranks` then writes one job a loader at the top of the results folder, folded as a multi-rank
`pipebench run` job's ranks are (`multirank.fold_ranks`): a row a rank, the total rate, the
straggler figures and the transform table pooled over the ranks' samples.

The user's step holds its own collective (DDP's gradient sync), which the watch cannot time apart.
It is estimated step by step: the k-th measured step of each epoch is one training step on every
rank, the fastest rank's time after its batch came stands for the step's own work, and what a rank's
exceeds it by is its wait at the collective (COLLECTIVE_ESTIMATE: it holds where the ranks' work a
step is alike).
"""

import json
import os
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence

import numpy as np

from pipebench.attach.watch import LoaderWatch, WatchWindow
from pipebench.attach.watched import JOB_FOLDER, save_results, watch_result, write_jobs
from pipebench.base.errors import ConfigError
from pipebench.base.io import write_json_atomic
from pipebench.base.typed_json import parse, parse_all
from pipebench.measure.distributed.multirank import fold_ranks
from pipebench.measure.distributed.rank_result import RankResult, StepNames
from pipebench.measure.distributed.ranks import save_timings
from pipebench.record.jobs import JobResult
from pipebench.record.results import read_result
from pipebench.record.sections import PassRecord
from pipebench.record.stored import NUMBER, OBJECT, WHOLE, check_fields, read_stored, versioned
from pipebench.storage.rank_info import rank_and_world

__all__ = ["COLLECTIVE_ESTIMATE", "RANKS_DIR_ENV", "RANKS_FOLDER", "WINDOW_ENV", "collective_estimates", "merge_ranks", "rank_folder",
           "rank_environment", "rank_status", "rank_window", "save_rank"]

# The folder of the ranks' own results, inside the results folder.
RANKS_FOLDER = "ranks"
# The environment that tells a rank where its folder goes and which window to measure (torchrun
# passes its environment to the ranks it starts).
RANKS_DIR_ENV = "PIPEBENCH_ATTACH_RANKS"
WINDOW_ENV = "PIPEBENCH_ATTACH_WINDOW"
RANK_FOLDER = "rank-{rank}"
RANK_STATUS = "rank.json"
TIMINGS_FILE = "timings.npz"
# How the merged row's collective wait was had (result.json's distributed.collective_wait).
COLLECTIVE_ESTIMATE = ("estimated: per step, a rank's time after its batch came less the fastest rank's "
                       "(the ranks' own work a step taken as alike)")
RANK_STATUS_FIELDS = {"rank": WHOLE, "world_size": WHOLE, "exit_status": NUMBER, "iterated": WHOLE, "jobs": OBJECT}


@dataclass(frozen=True)
class RankJob:
    """A loader a rank measured (an entry of rank.json's `jobs`): its job folder and its timed steps."""

    folder: str
    step_names: Mapping[str, Any]


@dataclass(frozen=True)
class RankStatus:
    """A rank's rank.json: its rank of how many, the script's exit status, whether it iterated a
    DataLoader, and the loaders it measured by job label (in the order it measured them)."""

    rank: int
    world_size: int
    exit_status: float
    iterated: int
    jobs: Mapping[str, Mapping[str, Any]]

    def job(self, label: str) -> Optional[RankJob]:
        """The loader `label`, where this rank measured it."""
        entry = self.jobs.get(label)
        return None if entry is None else parse(RankJob, entry)


def rank_environment(ranks_dir: Path, window: WatchWindow) -> Dict[str, str]:
    """The variables a rank reads: its folder's parent and the window."""
    return {RANKS_DIR_ENV: str(ranks_dir.resolve()), WINDOW_ENV: json.dumps(asdict(window))}


def rank_window() -> WatchWindow:
    """The window attach asked for (WINDOW_ENV). Raises ConfigError outside attach."""
    if WINDOW_ENV not in os.environ or RANKS_DIR_ENV not in os.environ:
        raise ConfigError(f"a rank of pipebench attach runs under `pipebench attach -- torchrun ...`, "
                          f"which sets {RANKS_DIR_ENV} and {WINDOW_ENV}")
    return WatchWindow(**json.loads(os.environ[WINDOW_ENV]))


def rank_folder() -> Path:
    """This rank's own folder (RANK from torchrun) under RANKS_DIR_ENV, created."""
    folder = Path(os.environ[RANKS_DIR_ENV]) / RANK_FOLDER.format(rank=rank_and_world()[0])
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def save_rank(watches: Sequence[LoaderWatch], exit_status: int) -> None:
    """This rank's folder (RANK, WORLD_SIZE from torchrun): its watched results, each job's
    timings and rank.json."""
    rank, world = rank_and_world()
    folder = rank_folder()
    measured = [(watch, result) for watch in watches if (result := watch_result(watch)) is not None]
    jobs = {}
    if measured:
        save_results(folder, [result for _, result in measured])
    for num, (watch, result) in enumerate(measured):
        job = JOB_FOLDER.format(num=num)
        sink = watch.sink
        if sink.sample_ns:
            save_timings(folder / job / TIMINGS_FILE, sink)
        # StepName tuples, written as [stage, name] pairs.
        names = {"sample": list(watch.timing.names) if watch.timing is not None else [],
                 "batch": list(watch.batch_steps)}
        jobs[result.record.job] = asdict(RankJob(job, names))
    write_json_atomic(folder / RANK_STATUS, versioned({
        "rank": rank, "world_size": world, "exit_status": exit_status,
        "iterated": int(any(w.iterated for w in watches)), "jobs": jobs}))


def rank_status(ranks_dir: Path) -> List[RankStatus]:
    """Every rank's rank.json that was written, in rank order."""
    found = [parse(RankStatus, read_stored(path, lambda data: check_fields(data, RANK_STATUS_FIELDS)))
             for path in ranks_dir.glob(f"{RANK_FOLDER.format(rank='*')}/{RANK_STATUS}")]
    return sorted(found, key=lambda status: status.rank)


def collective_estimates(ranks: Sequence[Sequence[Mapping[str, Any]]]) -> List[Dict[str, float]]:
    """Per rank, in `ranks` order (each its stored passes): busy_ms_mean (its step less its collective
    wait), and collective_ms_mean / _p99, over the steps every rank measured (COLLECTIVE_ESTIMATE)."""
    typed = [parse_all(PassRecord, passes) for passes in ranks]
    collective: List[List[float]] = [[] for _ in ranks]
    busy: List[List[float]] = [[] for _ in ranks]
    for passes in zip(*typed):  # the n-th pass of every rank
        for k in range(min(len(p.step_ms) for p in passes)):
            # The step less the wait it began with: on the GPU's clock where the pass has it.
            after = [p.step_ms[k] - (p.wait_ms if p.gpu_idle_data_ms is None else p.gpu_idle_data_ms)[k]
                     for p in passes]
            floor = min(after)
            for rank, (one_pass, own) in enumerate(zip(passes, after)):
                collective[rank].append(own - floor)
                busy[rank].append(one_pass.step_ms[k] - (own - floor))
    return [{"busy_ms_mean": float(np.mean(b)), "collective_ms_mean": float(np.mean(c)),
             "collective_ms_p99": float(np.percentile(c, 99))} for b, c in zip(busy, collective)]


def _rank_results(ranks_dir: Path, statuses: Sequence[RankStatus], job: str) -> List[RankResult]:
    """One loader on every rank that measured it: its result.json, step names and saved timings."""
    ranks = []
    for status in statuses:
        entry = status.job(job)
        if entry is None:
            continue
        job_dir = ranks_dir / RANK_FOLDER.format(rank=status.rank) / entry.folder
        timings = job_dir / TIMINGS_FILE
        ranks.append(RankResult(status.rank, JobResult.from_stored(read_result(job_dir / "result.json")),
                                parse(StepNames, entry.step_names), timings if timings.exists() else None))
    return ranks


def _merged(ranks: Sequence[RankResult], statuses: Sequence[RankStatus], num: int) -> JobResult:
    """One loader's job over its ranks, shaped as a multi-rank job's result.json: each rank's summary
    with its estimated collective wait, folded as a multi-rank job's ranks are (`fold_ranks`)."""
    estimates = collective_estimates([rank.result.passes for rank in ranks])
    ranks = [rank.with_cells(estimate) for rank, estimate in zip(ranks, estimates)]
    summary, sections = fold_ranks(ranks)
    first = ranks[0]
    return JobResult(summary, {
        "first_batch_s_per_epoch": first.sections.first_batch_s_per_epoch,
        "fingerprint": first.result.fingerprint,
        **sections,
        "distributed": {"nproc": len(ranks), "launcher": "torchrun", "collective_wait": COLLECTIVE_ESTIMATE,
                        "world_size": int(statuses[0].world_size),
                        "exit_status": {str(s.rank): s.exit_status for s in statuses}},
    }, replace(first.result.identity, job_num=num))


def merge_ranks(ranks_dir: Path, folder: Path) -> List[JobResult]:
    """One job a loader in `folder` from the ranks' folders under `ranks_dir` (loaders matched by
    name, in the order the lowest rank measured them), then summary.csv and transforms.csv.
    Returns the merged records; none when no rank measured a step."""
    statuses = rank_status(ranks_dir)
    jobs = list(dict.fromkeys(job for status in statuses for job in status.jobs))
    merged = [_merged(_rank_results(ranks_dir, statuses, job), statuses, num) for num, job in enumerate(jobs)]
    write_jobs(folder, merged)
    return merged
