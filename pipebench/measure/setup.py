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

# kineto (torch.profiler's C++ side) logs to stderr from this severity on; its severities run up to
# USDT = 5 in torch 2.14 (ERROR = 4: `gpuGetDeviceCount failed` without a GPU), so 100 is above all.
KINETO_QUIET_LEVEL = "100"
KINETO_LOG_LEVEL_ENV = "KINETO_LOG_LEVEL"
# torch's DataLoader warns with this, at construction and again at each new iterator, when its
# workers outnumber the CPUs it may use; the job prints `oversubscription_note` once instead.
WORKER_COUNT_WARNING = r"This DataLoader will create \d+ worker processes in total"
# torch warns with this at a job's first profile (seen on the H100 host); it is about profile
# schedules of several cycles, and each of pipebench's profiles is one cycle.
PROFILER_CYCLE_WARNING = "Warning: Profiler clears events at the end of each cycle"


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def quiet_torch_output() -> None:
    """Silence kineto's C++ log lines and torch's worker-count and profiler-cycle warnings in this
    process. Run it before the first profiler starts; a KINETO_LOG_LEVEL the user set is kept."""
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
