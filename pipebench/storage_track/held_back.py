"""What held the check back at the least N that missed the minimum AU, so a user who wants one more
accelerator knows what to change: the storage (its link full, or its reads at a plateau), else the
host's CPU, else the loader's workers, else the cost each step pays beside the accelerator's step,
which the arithmetic's model lacks (docs/storage-check.md says each rule). Pure arithmetic over the
rounds at that N and at the N below it.
"""

import math
from dataclasses import dataclass
from typing import Optional, Sequence

from pipebench.measure.memory import BYTES_PER_MB
from pipebench.model.judging import RUN_TO_RUN_RATE_FLOOR
from pipebench.record.figures import Summary
from pipebench.storage_track.presets import MS_PER_S

__all__ = ["CPU", "CPU_FULL_SHARE", "STEP_COST", "STORAGE", "WORKERS", "HeldBack", "Measured", "held_back"]

STORAGE, CPU, WORKERS, STEP_COST = "storage", "cpu", "workers", "step cost"
# A link read within one run's own rate noise of its bandwidth counts as full; so does a read rate that
# one more accelerator raised by no more than that noise.
LINK_FULL_SHARE = 1.0 - RUN_TO_RUN_RATE_FLOOR
PLATEAU_GROWTH = 1.0 + RUN_TO_RUN_RATE_FLOOR
# A host whose cores are busy 90% of the time has a runnable process waiting at most moments: the
# workers fall behind and each all-reduce waits for a rank that is not running.
CPU_FULL_SHARE = 0.9
# A rank drawing within one run's own rate noise of what its workers deliver at most has them busy all
# the time: the next batch waits for a worker, not for the storage or the cores.
WORKERS_FULL_SHARE = 1.0 - RUN_TO_RUN_RATE_FLOOR
# The summary cells read at that N, each merged over its rounds.
MERGED_COLUMNS = ("samples_per_s", "process_cpu_ms_per_sample", "host_other_cpu_cores", "step_ms_mean",
                  "accel_util_pct", "collective_wait_ms_mean", "au_pct", "wait_ms_mean",
                  "worker_capacity_samples_per_s")


@dataclass(frozen=True)
class HeldBack:
    """The least N that missed, what held it back (STORAGE, CPU, WORKERS or STEP_COST) and the figures that say so,
    each the median over the rounds measured at that N."""

    accelerators: int
    by: str
    au_pct: float
    # MiB/s the ranks read, at this N and at the N below (None: not measured), and the shared link's
    # bandwidth (None: not emulated).
    read_mb_per_s: Optional[float]
    read_below_mb_per_s: Optional[float]
    shared_mb_per_s: Optional[float]
    # CPU cores busy during the window: the job's own processes and the host's others, of those usable.
    own_cores: Optional[float]
    other_cores: Optional[float]
    usable_cores: int
    # Each rank's samples/s, and what its `workers` workers deliver at most (None: not measured).
    rank_samples_per_s: float
    worker_capacity: Optional[float]
    workers: int
    # A step's time beside the accelerator's: all of it, waiting for the batch, and at the all-reduce.
    lost_ms: float
    wait_ms: float
    collective_ms: Optional[float]

    def line(self) -> str:
        """One sentence for report.md and the console."""
        n, au = self.accelerators, f"AU {self.au_pct:.1f}%"
        if self.by == STORAGE:
            of_link = "" if self.shared_mb_per_s is None else f" of the link's {self.shared_mb_per_s:g}"
            below = "" if self.read_below_mb_per_s is None else \
                f", against {self.read_below_mb_per_s:.1f} with one accelerator fewer"
            return (f"the storage held {n} accelerator(s) back ({au}): the ranks read "
                    f"{self.read_mb_per_s:.1f}{of_link} MiB/s{below}")
        busy = f"{_cores(self.own_cores)} of the host's {self.usable_cores} cores busy with the job, " \
               f"{_cores(self.other_cores)} with other processes"
        if self.by == CPU:
            return f"the host's CPU held {n} accelerator(s) back ({au}): {busy}"
        if self.by == WORKERS:
            loaders = f"its {self.workers} worker(s)" if self.workers else "its main process (workers=0)"
            return (f"the loader's workers held {n} accelerator(s) back ({au}): each rank drew "
                    f"{self.rank_samples_per_s:.1f} samples/s, and {loaders} deliver at most {self.worker_capacity:.1f}, "
                    f"with {busy}: more workers, or a cheaper chain")
        collective = "" if self.collective_ms is None else f", {self.collective_ms:.1f} at the all-reduce"
        return (f"a cost each step pays held {n} accelerator(s) back ({au}): each step lost {self.lost_ms:.1f} ms "
                f"beside the accelerator's ({self.wait_ms:.1f} waiting for its batch{collective}), with neither "
                f"{self._storage_short_of_full()} nor the CPU full ({busy})")

    def _storage_short_of_full(self) -> str:
        if self.read_mb_per_s is None:
            return "the storage shown full (its reads unknown)"
        if self.shared_mb_per_s is not None:
            return f"the link full (the ranks read {self.read_mb_per_s:.1f} of its {self.shared_mb_per_s:g} MiB/s)"
        below = "" if self.read_below_mb_per_s is None else f", {self.read_below_mb_per_s:.1f} with one accelerator fewer"
        return f"the reads at a plateau (the ranks read {self.read_mb_per_s:.1f} MiB/s{below})"


def _cores(value: Optional[float]) -> str:
    return "?" if value is None else f"{value:.1f}"


def _read_mb_per_s(rounds: Sequence[Summary], sample_bytes: Optional[float]) -> Optional[float]:
    """MiB/s the ranks read: their samples/s (merged over the rounds) times a sample's size on storage."""
    if not rounds or not sample_bytes:
        return None
    return Summary.median(rounds, "samples_per_s") * sample_bytes / BYTES_PER_MB


def _known(value: float) -> Optional[float]:
    """None for a figure no round had (Summary.median's nan), so verdict.json holds null."""
    return value if math.isfinite(value) else None


@dataclass(frozen=True)
class Measured:
    """The least N that missed and its rounds, and the rounds at the N below it (none where N is 1 or the
    N below was not measured)."""

    accelerators: int
    rounds: Sequence[Summary]
    below: Sequence[Summary] = ()


def held_back(measured: Measured, sample_bytes: Optional[float], shared_mb_per_s: Optional[float],
              usable_cores: int) -> Optional[HeldBack]:
    """What held `measured.accelerators` back (module doc); None without a round. `sample_bytes` is a
    sample's size on storage where known."""
    rounds = measured.rounds
    if not rounds:
        return None

    read, below = _read_mb_per_s(rounds, sample_bytes), _read_mb_per_s(measured.below, sample_bytes)
    merged = {column: Summary.median(rounds, column) for column in MERGED_COLUMNS}
    # The job's process trees' CPU in cores: its CPU a sample times its samples a second.
    own = _known(merged["process_cpu_ms_per_sample"] * merged["samples_per_s"] / MS_PER_S)
    other = _known(merged["host_other_cpu_cores"])
    cpu_full = own is not None and own + (other or 0.0) >= CPU_FULL_SHARE * usable_cores
    # A rank merge's row holds the ranks' total samples/s and rank 0's capacity (the ranks run alike).
    rank_rate = merged["samples_per_s"] / measured.accelerators
    capacity = _known(merged["worker_capacity_samples_per_s"])
    if read is not None and shared_mb_per_s and read >= LINK_FULL_SHARE * shared_mb_per_s:
        by = STORAGE
    elif cpu_full:
        by = CPU
    elif read is not None and below is not None and read <= PLATEAU_GROWTH * below:
        by = STORAGE
    elif capacity is not None and rank_rate >= WORKERS_FULL_SHARE * capacity:
        by = WORKERS
    else:
        by = STEP_COST
    # A step's time beside the consumer's: the step less its busy share, whatever the consumer (a sleep, a
    # GPU's kernels). One accelerator has no peers: its row's all-reduce wait is no wait.
    lost = merged["step_ms_mean"] * (100.0 - merged["accel_util_pct"]) / 100.0
    collective = _known(merged["collective_wait_ms_mean"]) if measured.accelerators > 1 else None
    return HeldBack(measured.accelerators, by, merged["au_pct"], read, below, shared_mb_per_s, own, other,
                    usable_cores, rank_rate, capacity, int(rounds[0].workers or 0), lost, merged["wait_ms_mean"],
                    collective)
