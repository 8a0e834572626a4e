"""What every measuring process does the same way: seed the generators and leave the console
to pipebench (torch's own chatter silenced, one note in its place).

The job process and each torchrun rank both import this, so neither imports the other.
"""

import os
import random
import warnings
from typing import Optional

import numpy as np
import torch

from pipebench.config.specs import JobSpec

__all__ = ["oversubscription_note", "quiet_torch_output", "seed_everything"]

# kineto (torch.profiler's C++ side) writes a log line to stderr when its severity reaches this
# level. Its severities run up to USDT = 5 in torch 2.14 (the `profiler_start` / `profiler_stop`
# markers), ERROR = 4 (`gpuGetDeviceCount failed` without a GPU); torch lowers the level to
# ERROR only when KINETO_LOG_LEVEL is unset. 100 is above every severity kineto has.
KINETO_QUIET_LEVEL = "100"
KINETO_LOG_LEVEL_ENV = "KINETO_LOG_LEVEL"
# torch's DataLoader warns with this, at construction and again at each new iterator, when its
# workers outnumber the CPUs it may use; the job prints `oversubscription_note` once instead.
WORKER_COUNT_WARNING = r"This DataLoader will create \d+ worker processes in total"
# torch 2.11 warned with this in every job on the H100 host (2026-11-26), at its first profile; torch
# 2.14 without CUDA, here, does not. It is about profiles that run a schedule of several cycles:
# each of pipebench's profiles is one cycle, so it never applies.
PROFILER_CYCLE_WARNING = "Warning: Profiler clears events at the end of each cycle"


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def quiet_torch_output() -> None:
    """Silence kineto's C++ log lines and torch's worker-count and profiler-cycle warnings in this process.

    kineto reads KINETO_LOG_LEVEL when the first profiler starts, so this must run before one
    does; a level the user set is kept (e.g. KINETO_LOG_LEVEL=0 to debug the profiler).
    """
    os.environ.setdefault(KINETO_LOG_LEVEL_ENV, KINETO_QUIET_LEVEL)
    warnings.filterwarnings("ignore", message=WORKER_COUNT_WARNING, category=UserWarning)
    warnings.filterwarnings("ignore", message=PROFILER_CYCLE_WARNING, category=UserWarning)


def oversubscription_note(spec: JobSpec, cores: int) -> Optional[str]:
    """One line when a single-process job's workers outnumber the usable cores, else None.

    A multi-rank job warns about ranks x workers itself (measure.distributed.multirank).
    """
    if spec.distributed.nproc > 1 or spec.workers <= cores:
        return None
    return f"note: {spec.workers} workers on {cores} usable core{'s' if cores != 1 else ''}: " \
           "workers beyond the cores time-slice"
