"""What one of the race's jobs is expected to cost, in seconds, before it runs: the budget's cut and
the race's stages are sized with it. The workers=0 probe's job time alone undercounts a point with
many workers: each worker process starts, imports the chain and opens its dataset, and without
`persistent_workers` DataLoader pays that again every epoch. In issue 54's object-store run (8.6 s
a job at workers=0, 20-74 s at 12-21 non-persistent workers) the cut, priced at the probe's job,
raced 12 points in 568 s against a 300 s budget.
"""

from pipebench.config.specs import PROCESSES
from pipebench.tune.space import Point

__all__ = ["NON_PERSISTENT_STARTS", "WORKER_START_S", "job_seconds"]

# Seconds one worker process takes to start, on the 2-core machine: what issue 54's persistent
# points cost past the probe's job, a worker ((19 - 8.6) s at 21 workers, (12 - 8.6) s at 12).
WORKER_START_S = 0.5
# The times a worker starts in one job without persistent_workers: DataLoader starts its workers
# afresh each epoch, and issue 54's race jobs each crossed two epoch boundaries (its
# epoch_boundaries_in_window), so three starts; their non-persistent jobs cost about that.
NON_PERSISTENT_STARTS = 3


def job_seconds(point: Point, probe_job_s: float) -> float:
    """A stage-1 job's seconds at `point`: the probe's job (`probe_job_s`: process, dataset, warm-up
    and window at workers=0) and each worker process's start, once with persistent workers and
    NON_PERSISTENT_STARTS times without. Thread workers start in the job's own process: no term."""
    if point.workers == 0 or point.worker_kind != PROCESSES:
        return probe_job_s
    starts = 1 if point.persistent_workers else NON_PERSISTENT_STARTS
    return probe_job_s + WORKER_START_S * point.workers * starts
