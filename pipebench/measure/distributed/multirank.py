"""A multi-rank job (`distributed.nproc` > 1): start the ranks with torchrun, then merge what they measured.

The job process pickles the JobSpec into a private temporary folder (never the results folder,
which is data: nothing there is unpickled) and runs the ranks under `torchrun --standalone` (a
rendezvous on localhost). If a rank fails, torchrun stops the others; if they hang,
`distributed.job_timeout_s` stops the whole group. Either way the job ends with one line naming the
rank, and the sweep goes on (run.on_job_error).
"""

import json
import os
import pickle
import re
import signal
import statistics
import sys
import tempfile
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np
import psutil
import torch

from pipebench.base.cores import usable_cores
from pipebench.base.errors import ConfigError, PipebenchError
from pipebench.base.typed_json import parse
from pipebench.config.specs import JobSpec
from pipebench.measure.coverage import (
    CoverageReport,
    check_coverage,
    complete_epochs,
    droppable_per_epoch,
    log_from_json,
    merge_logs,
)
from pipebench.measure.distributed.ranks import (
    OWN_CPU_CORES,
    RANK_ERROR,
    RANK_RESULT,
    RANK_TIMINGS,
    RANKS_MODULE,
    TASK_FILE,
    RankTask,
    load_timings,
)
from pipebench.measure.distributed.rank_result import RankResult, RankRow, RankSections, StepNames
from pipebench.measure.distributed.torchrun_fork import fork_torchrun
from pipebench.measure.job_series import job_series, write_job_series
from pipebench.measure.meter import add_notes
from pipebench.measure.job_run import METER_KINDS
from pipebench.record.figures import Summary
from pipebench.record.jobs import JobResult
from pipebench.measure.steps import NS_PER_MS, PassResult, StepSample, TimingSink, cycle_steps
from pipebench.measure.summarize import rows_as_dicts, transform_rows
from pipebench.measure.window import rate_interval, reused_window
from pipebench.pipeline.timed_chain import StepName

# torchrun's and the ranks' own output (tracebacks of a failed rank) go here, not to the console.
RANKS_LOG = "ranks.log"
# torchrun's failure summary names the first rank that failed and its exit code.
ROOT_CAUSE = re.compile(r"Root Cause \(first observed failure\):.*?rank\s*:\s*(\d+).*?exitcode\s*:\s*(-?\d+)", re.S)
# Each failure in torchrun's summary: its rank and exit code.
FAILURE = re.compile(r"rank\s*:\s*(\d+)[^\n]*\n\s*exitcode\s*:\s*(-?\d+)")
# After the job timeout: SIGTERM the whole group, then SIGKILL what is left this long after.
KILL_GRACE_S = 10


def _notes(values: Sequence[Any]) -> str:
    return "; ".join(dict.fromkeys(values))


# How the ranks' meter columns become the job's (pipebench.measure.repeats runs the same meters on
# every rank). The ranks are separate process trees running at once on one host, so what each
# counts of its own adds up, and what each reads of the host (or of a GPU it has alone) does not.
# A rank's None cells are left out; all None gives None.
METER_MERGE: Dict[str, Callable[[Sequence[Any]], Any]] = {
    # Each rank's tree (the rank and its workers): summed, an upper bound where peaks do not coincide.
    "rss_mb_peak": sum,
    "pss_mb_peak": sum,
    "worker_pss_growth_mb": sum,
    # /dev/shm is the host's: every rank reads the same figure.
    "shm_mb_peak": max,
    # Bytes each rank's tree read from storage, over windows that run at once.
    "storage_read_mb": sum,
    "storage_read_mb_per_s": sum,
    # The hypervisor's steal is the host's.
    "host_steal_pct": max,
    # Each rank's tree's CPU a sample of its own samples: the ranks' mean is the job's (their
    # windows hold about as many samples each).
    "process_cpu_ms_per_sample": statistics.fmean,
    # host_other_cpu_cores has its own rule (other_load_of_ranks): a rank's "other" holds its peers.
    # The GPU's: each rank has its own GPU (nccl) or none (gloo).
    "h2d_gpu_ms_median": max,  # the slowest rank's copy is the one its peers wait for
    "gpu_util_pct": statistics.fmean,
    "reserved_mb_peak": max,  # what the fullest GPU had to hold
    "alloc_retries": sum,
    "device_frees": sum,
    "reserved_oscillating": any,
    "gpu_notes": _notes,
}


def other_load_of_ranks(summaries: Sequence[Summary]) -> Optional[float]:
    """Other processes' CPU during the window, in cores: the host's busy CPU (each rank's other
    load plus its own, averaged over ranks) less every rank's own."""
    pairs = [(s.host_other_cpu_cores, s.row.get(OWN_CPU_CORES)) for s in summaries]
    if any(other is None or own is None for other, own in pairs):
        return None
    return max(statistics.fmean(other + own for other, own in pairs) - sum(own for _, own in pairs), 0.0)


def merge_meter_columns(summaries: Sequence[Summary]) -> Dict[str, Any]:
    """The job's meter cells from its ranks' (METER_MERGE, other_load_of_ranks)."""
    merged: Dict[str, Any] = {}
    for column, rule in METER_MERGE.items():
        values = [getattr(s, column) for s in summaries if getattr(s, column) is not None]
        merged[column] = rule(values) if values else None
    merged["host_other_cpu_cores"] = other_load_of_ranks(summaries)
    return merged


class DistributedError(PipebenchError):
    """A rank failed or the ranks did not finish in time."""


def resolve_backend(requested: str, nproc: int) -> str:
    """auto -> nccl when every rank can have a GPU of its own, else gloo (DESIGN: gloo on CPU)."""
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if requested == "auto":
        return "nccl" if gpus >= nproc else "gloo"
    if requested == "nccl" and gpus < nproc:
        raise ConfigError(f"distributed.backend=nccl needs a GPU per rank: {nproc} ranks, {gpus} GPU(s) here")
    return requested


def loader_processes(spec: JobSpec) -> int:
    """Processes that load data at once: each rank's workers, or the rank itself at workers=0."""
    return spec.distributed.nproc * max(spec.workers, 1)


def oversubscription_warning(spec: JobSpec, cores: int) -> str:
    """A warning line when ranks x workers outnumber the usable cores, else ''."""
    busy = loader_processes(spec)
    if busy <= cores:
        return ""
    return (f"pipebench: warning: {spec.distributed.nproc} ranks x {max(spec.workers, 1)} loader processes = "
            f"{busy} on {cores} usable cores; they will time-slice, so per-rank rates fall and ranks straggle")


def torchrun_args(nproc: int, job_dir: Path, task: Path) -> List[str]:
    """torchrun's arguments: the ranks on this node, a rendezvous on localhost, no restart, and its
    own files in the task's private folder, removed with it (by default torchrun leaves a
    torchelastic_* folder in the temporary directory every job)."""
    return ["--standalone", f"--nproc_per_node={nproc}", "--max_restarts=0", f"--log_dir={task.parent}", "-m",
            RANKS_MODULE, str(job_dir), str(task)]


def root_cause(log_text: str) -> Optional[Tuple[int, int]]:
    """(rank, exit code) of torchrun's "Root Cause (first observed failure)", if it wrote one."""
    found = ROOT_CAUSE.search(log_text)
    return (int(found.group(1)), int(found.group(2))) if found else None


def exit_codes(log_text: str) -> Dict[int, int]:
    """rank -> exit code of every failure torchrun's summary lists."""
    return {int(rank): int(code) for rank, code in FAILURE.findall(log_text)}


def rank_failure(job_dir: Path, status: int) -> str:
    """One line: the rank that failed first and its own error line; peers that lost it only
    report broken connections, each in an error file. That is a rank torchrun lists as failed
    that wrote none (killed, crashed, os._exit), not stopped by torchrun's SIGTERM; else the rank
    whose error file was written first. torchrun observes exits by polling, and its root cause is
    the first it saw: a peer that lost the connection and exited at once can be seen first."""
    log = job_dir / RANKS_LOG
    text = log.read_text(errors="replace")
    cause = root_cause(text)
    failed = exit_codes(text)
    abrupt = [rank for rank, code in failed.items()
              if code != -signal.SIGTERM and not (job_dir / RANK_ERROR.format(rank=rank)).exists()]
    errors = sorted(job_dir.glob(RANK_ERROR.format(rank="*")), key=lambda p: p.stat().st_mtime_ns)
    if abrupt and (cause is None or cause[0] not in abrupt):
        cause = (abrupt[0], failed[abrupt[0]])
    elif errors and not abrupt:
        first = int(errors[0].stem.split("-")[1])
        cause = (first, failed.get(first, status))
    if cause is None:
        return f"torchrun exited with status {status} before any rank started (see {log})"
    rank, code = cause
    error = job_dir / RANK_ERROR.format(rank=rank)
    what = error.read_text().strip() if error.exists() else "it exited without a Python error (killed, crashed or os._exit)"
    return f"rank {rank} failed (exit code {code}): {what} (full output in {log})"


def launch_ranks(spec: JobSpec, backend: str, job_dir: Path) -> List[RankResult]:
    """Run the ranks to completion; return their results in rank order. Raises DistributedError."""
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", "1")  # what torchrun would set, without its warning
    timeout = spec.distributed.job_timeout_s
    # mkdtemp's folder is the user's alone (mode 0700): no one else can plant a task there.
    (job_dir / RANKS_LOG).unlink(missing_ok=True)  # a new file ("x"), never one a link planted there points to
    with tempfile.TemporaryDirectory(prefix="pipebench-ranks-") as private, (job_dir / RANKS_LOG).open("xb") as log:
        task = Path(private) / TASK_FILE
        task.write_bytes(pickle.dumps(RankTask(spec, backend)))
        proc = fork_torchrun(torchrun_args(spec.distributed.nproc, job_dir, task), env, log.fileno())
        try:
            status = int(proc.wait(timeout=timeout))
        except psutil.TimeoutExpired:
            _stop_group(proc)
            raise DistributedError(f"the {spec.distributed.nproc} ranks did not finish within "
                                   f"distributed.job_timeout_s={timeout:g}; stopped them") from None
        except BaseException:  # Ctrl-C: take the ranks and their workers down too
            _stop_group(proc)
            raise
    if status != 0:
        raise DistributedError(rank_failure(job_dir, status))
    return [_rank_result(job_dir, rank) for rank in range(spec.distributed.nproc)]


def _rank_result(job_dir: Path, rank: int) -> RankResult:
    """Rank `rank`'s rank-N.json, with its step names and saved timings."""
    result = JobResult.from_stored(json.loads((job_dir / RANK_RESULT.format(rank=rank)).read_text()))
    return RankResult(rank, result, parse(StepNames, RankSections.of(result).step_names),
                      job_dir / RANK_TIMINGS.format(rank=rank))


def _stop_group(proc: psutil.Process) -> None:
    """SIGTERM torchrun's session (torchrun, ranks, their workers), SIGKILL after a grace period."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
            proc.wait(timeout=KILL_GRACE_S)
            return
        except ProcessLookupError:
            return
        except psutil.TimeoutExpired:
            pass


def coverage_of(ranks: Sequence[RankResult], spec: JobSpec) -> CoverageReport:
    """The exactly-once check over every rank's index log."""
    first = ranks[0].sections
    return check_coverage(merge_logs(log_from_json(r.sections.indices) for r in ranks), first.dataset_length,
                          complete_epochs([r.sections.epochs_reached for r in ranks]),
                          droppable_per_epoch(spec, first.iterable))


def pooled_transforms(ranks: Sequence[RankResult]) -> List[Dict[str, Any]]:
    """The per-transform table over the samples of every rank that saved its timings, as if one
    process had made them all (the first such rank's step names); empty where none did."""
    timed = [rank for rank in ranks if rank.timings is not None]
    if not timed:
        return []
    sinks = [load_timings(rank.timings) for rank in timed]
    pooled = TimingSink(sample_ns=[ns for sink in sinks for ns in sink.sample_ns],
                        batch_ns=[ns for sink in sinks for ns in sink.batch_ns])
    names = timed[0].step_names
    return rows_as_dicts(transform_rows(pooled, [StepName(*n) for n in names.sample],
                                        [StepName(*n) for n in names.batch]))


def total_passes(records: Sequence[JobResult]) -> List[PassResult]:
    """The ranks' steps as one loop's, over the passes and steps every rank has: per step, every
    rank's samples over the ranks' mean step time. The ranks step together (an all-reduce a step),
    so rank 0's epochs and window bounds stand for all."""
    passes = []
    for index in range(min(len(r.pass_records) for r in records)):
        ranks = [r.pass_records[index] for r in records]
        first = ranks[0]
        count = min(len(p.step_ms) for p in ranks)
        steps = [StepSample(gap_ns=0, wait_ns=0, h2d_ns=0,
                            compute_ns=round(statistics.fmean(p.step_ms[k] for p in ranks) * NS_PER_MS),
                            samples=sum(p.samples[k] for p in ranks), transfer_ns=0, worker_id=0, ready=False,
                            epoch=first.epoch[k])
                 for k in range(count)]
        passes.append(PassResult(first.first_batch_s, first.warmup_steps, steps, first.wall_s, first.epochs, {},
                                 first.start_epoch, first.stop_reason))
    return passes


def total_rate(records: Sequence[JobResult]) -> Dict[str, Any]:
    """samples/s of all ranks together (the sum of their rates) and its interval: batch means of the
    per-step totals over rank 0's cut of its window, centred on the sum. A sum of the ranks' own
    bounds is no interval of the sum: a slow step on one rank is slow on all (the all-reduce
    waits), and independent noise partly cancels."""
    passes = total_passes(records)
    window = reused_window(RankSections.of(records[0]).window, passes)
    samples = np.array([s.samples for s in window.steps], dtype=np.float64)
    step_ns = np.array([s.step_ns for s in window.steps], dtype=np.float64)
    interval = rate_interval(window, samples, step_ns)
    total = sum(r.summary.samples_per_s for r in records)
    return {"samples_per_s": total, "samples_per_s_ci_low": interval.low - interval.value + total,
            "samples_per_s_ci_high": interval.high - interval.value + total, "ci_blocks": interval.blocks,
            "ci_note": interval.note}


def aggregate(records: Sequence[JobResult]) -> Dict[str, Any]:
    """The job's row from its ranks: total samples/s, mean and max starvation, the least rank's AU,
    the straggler ratio (slowest rank's busy time a step over the median rank's), the collective
    wait, the meters' cells by METER_MERGE; the other step columns are rank 0's."""
    summaries = [r.summary for r in records]
    own = [RankRow.of(rank, summary) for rank, summary in enumerate(summaries)]
    busy = [figures.busy_ms_mean for figures in own]
    starvation = [s.starvation_pct for s in summaries]
    rank_only = ("busy_ms_mean", "collective_ms_mean", "collective_ms_p99", OWN_CPU_CORES)
    row = {k: v for k, v in summaries[0].row.items() if k not in rank_only}
    row.update(
        **merge_meter_columns(summaries),
        samples_per_s=sum(s.samples_per_s for s in summaries),
        samples_per_s_ci_low=None,
        samples_per_s_ci_high=None,
        starvation_pct=statistics.fmean(starvation),
        starvation_pct_max=max(starvation),
        au_pct=min(s.au_pct for s in summaries),
        ranks=len(records),
        straggler_ratio=max(busy) / statistics.median(busy),
        collective_wait_ms_mean=statistics.fmean(figures.collective_ms_mean for figures in own),
    )
    return row


def rank_breakdown(ranks: Sequence[RankResult]) -> Dict[str, Any]:
    """What a multi-rank result.json keeps of each rank: its `RankRow`, transforms and raw steps;
    rank 0's steps and `window` also stand as the job's, for tools that read one process's passes."""
    first = ranks[0]
    return {
        "ranks": [asdict(rank.row) for rank in ranks],
        "rank_transforms": {str(rank.rank): rank.result.transforms for rank in ranks},
        "passes": first.result.passes,
        "window": first.sections.window,
        "rank_passes": {str(rank.rank): rank.result.passes for rank in ranks},
    }


def fold_ranks(ranks: Sequence[RankResult]) -> Tuple[Dict[str, Any], Dict[str, Any]]:
    """What both rank merges (this job's, attach's) make of their ranks: the job's summary row and
    its sections, the transform table pooled over the ranks' samples, then each rank's own."""
    results = [rank.result for rank in ranks]
    return ({**aggregate(results), **total_rate(results)},
            {"transforms": pooled_transforms(ranks), **rank_breakdown(ranks)})


def aggregate_line(row: Mapping[str, Any]) -> str:
    """The job's multi-rank figures (`aggregate`'s row) in one line, printed as the job ends."""
    totals = Summary.from_row(row)
    return (f"ranks: {totals.ranks} ranks, {totals.samples_per_s:.1f} samples/s in total, starvation "
            f"{totals.starvation_pct:.1f}% mean / {row['starvation_pct_max']:.1f}% max, straggler ratio "
            f"{totals.straggler_ratio:.3f}, {totals.collective_wait_ms_mean:.1f} ms a step waiting at the all-reduce")


def measure_multirank(spec: JobSpec, job_dir: Path) -> JobResult:
    """Run one job on `distributed.nproc` ranks; return its record, shaped like measure_job's."""
    backend = resolve_backend(spec.distributed.backend, spec.distributed.nproc)
    cores = usable_cores()
    warning = oversubscription_warning(spec, cores)
    if warning:
        print(warning, file=sys.stderr, flush=True)
    print(f"[ranks] {spec.distributed.nproc} ranks ({backend}) via torchrun; output in {job_dir / RANKS_LOG}",
          flush=True)
    ranks = launch_ranks(spec, backend, job_dir)
    coverage = coverage_of(ranks, spec)
    print(coverage.describe(), flush=True)
    summary, sections = fold_ranks(ranks)
    print(aggregate_line(summary), flush=True)
    summary.update(coverage.columns())
    add_notes(summary, METER_KINDS)
    # A row a window and rank; a rank's saved timings are one block, so its rows name no top steps.
    cycle = cycle_steps(spec.workers, spec.worker_kind)
    write_job_series(job_dir, [row for rank in ranks
                               for row in job_series(job_dir.name, rank.rank, rank.result.passes, cycle)])
    return JobResult(summary, {
        **sections,
        "distributed": {
            "nproc": spec.distributed.nproc,
            "backend": backend,
            "usable_cores": cores,
            "loader_processes": loader_processes(spec),
            "oversubscribed": bool(warning),
        },
        "coverage": coverage.as_dict(),
        # Each rank's meter sections, as a single-process job's result.json has them at its top level.
        "rank_meters": {str(rank.rank): rank.sections.meters for rank in ranks},
        "fingerprint": ranks[0].result.fingerprint,
    })
